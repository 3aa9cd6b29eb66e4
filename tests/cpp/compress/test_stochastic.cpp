// Stochastic rounding (compress/stochastic.h, cpu/stochastic.cpp): Philox4x32-10 against the known
// answers published with Random123, and the rounding against an oracle written here from torch's
// own 16-bit types: the two wire values around t (c10::Half / c10::BFloat16 neighbours), the
// upper one chosen when u < (t - lower) / (upper - lower), u = (random >> 8) * 2^-24.
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "compress/stochastic.h"

namespace cnccl::compress {
namespace {

float widen(uint16_t h, Wire w) {
  return w == Wire::kFp16 ? float(c10::Half(h, c10::Half::from_bits()))
                          : float(c10::BFloat16(h, c10::BFloat16::from_bits()));
}
uint16_t nearest(float f, Wire w) { return w == Wire::kFp16 ? c10::Half(f).x : c10::BFloat16(f).x; }

// The oracle: the stochastic rounding of a finite v with `random`, as 16-bit bits.
uint16_t oracle(float v, uint32_t random, Wire w) {
  const uint16_t sign = std::signbit(v) ? 0x8000 : 0;
  const float t = std::fabs(v);
  const uint16_t near = nearest(t, w);
  // Magnitudes are monotonic in the bits: the neighbours of t are near and near -/+ 1.
  const uint16_t lo = widen(near, w) > t ? uint16_t(near - 1) : near;
  const uint16_t hi = uint16_t(lo + 1);
  const double lower = widen(lo, w), upper = widen(hi, w);
  if (double(t) == lower) return sign | lo;
  const double p = (double(t) - lower) / (upper - lower);
  const double u = double(random >> 8) * 0x1p-24;
  return sign | (u < p ? hi : lo);
}

TEST(Philox, KnownAnswers) {
  struct Vector {
    uint32_t in[6], out[4];
  };
  const Vector vectors[] = {
      {{0, 0, 0, 0, 0, 0}, {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
      {{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff},
       {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
      {{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344, 0xa4093822, 0x299f31d0},
       {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}},
  };
  for (const auto& v : vectors) {
    const Philox4 r = philox4x32_10(v.in[0], v.in[1], v.in[2], v.in[3], v.in[4], v.in[5]);
    for (int i = 0; i < 4; ++i) EXPECT_EQ(r.word[i], v.out[i]) << std::hex << "word " << i << " of " << v.in[0];
  }
}

// A block wire's element takes one byte of a Philox block (block_random_bits): sixteen elements a block,
// its words' bytes low first, checked on two of the known answers above (index 0 on, and the last block
// below 2^36, whose counter is all ones with phase 0xFFFFFFFF), each byte as the top of its bits with
// 2^23 below it.
TEST(Stochastic, BlockBitsAreTheBytesOfAPhiloxBlockInOrder) {
  struct Case {
    Dither dither;
    uint64_t first;
    uint32_t words[4];
  };
  const Case cases[] = {
      {Dither{0, 0, 0, 0}, 0, {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
      {Dither{~uint64_t(0), 0xffffffffu, 0xffffffffu, 0xffffffffu}, (uint64_t(1) << 36) - 16,
       {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
  };
  for (const Case& c : cases) {
    for (uint64_t j = 0; j < 16; ++j) {
      const uint32_t byte = c.words[j / 4] >> (8 * (j % 4)) & 0xFF;
      EXPECT_EQ(block_random_bits(c.dither, c.first + j), byte << 24 | 0x800000u) << "element " << c.first + j;
    }
  }
}

// With 8 random bits an element, the block wires' rounding goes up with probability within 2^-9 of the
// fraction f it lies above the grid (u = (b + 1/2) * 2^-8 over the 256 bytes b): the mean over every byte
// of each rounding lies within s / 512 of the value, s its step, for values across every e2m1 and e4m3
// step (bytes alone, u = b * 2^-8, would miss by up to s / 256).
TEST(Stochastic, BlockRoundingIsUnbiasedToHalfAByte) {
  auto worst = [](auto round, auto step, double from, double to) {
    double excess = 0;
    for (int k = 0; k < 4000; ++k) {
      const float a = float(from + (to - from) * (k + 0.37) / 4000);
      double mean = 0;
      for (uint32_t b = 0; b < 256; ++b) mean += double(round(a, rounding_bits_of_byte(b))) / 256;
      excess = std::max(excess, std::fabs(mean - double(a)) / (step(a) / 512));
    }
    return excess;
  };
  const double e2m1 = worst([](float a, uint32_t r) { return stochastic_e2m1_value(a, r); },
                            [](float a) { return a < 2 ? 0.5 : a < 4 ? 1.0 : 2.0; }, 0.0, 6.0);
  EXPECT_LE(e2m1, 1.0) << "e2m1: the mean misses by " << e2m1 << " s/512";
  const double e4m3 = worst([](float a, uint32_t r) { return stochastic_fp8_value(a, r, Wire::kE4m3); },
                            [](float a) { return std::ldexp(1.0, std::max(int(std::floor(std::log2(a))), -6) - 3); },
                            0x1p-9, 448.0);
  EXPECT_LE(e4m3, 1.0) << "e4m3: the mean misses by " << e4m3 << " s/512";
}

TEST(Stochastic, CastMatchesTheOracleForEveryMagnitude) {
  std::mt19937 rng(7);
  const Dither d{0x1234'5678'9abc'def0ull, 5, 2, kContribution};
  for (Wire w : {Wire::kFp16, Wire::kBf16}) {
    std::vector<float> v(1 << 16);
    for (size_t i = 0; i < v.size(); ++i) {
      // Uniform in log scale across both wires' normal and subnormal ranges, either sign.
      const float e = std::uniform_real_distribution<float>(-140.0f, 17.0f)(rng);
      v[i] = std::ldexp(std::uniform_real_distribution<float>(1.0f, 2.0f)(rng), int(e)) * (i % 2 ? -1.0f : 1.0f);
    }
    std::vector<uint16_t> got(v.size());
    cast(v.data(), got.data(), v.size(), 1.0f, w, d, 1000);
    size_t bad = 0;
    for (size_t i = 0; i < v.size(); ++i) {
      const bool overflow = w == Wire::kFp16 && std::fabs(v[i]) >= 65504.0f;
      if (overflow) continue;  // past the largest fp16: inf or 65504, checked below
      bad += got[i] != oracle(v[i], random_bits(d, 1000 + i), w);
    }
    EXPECT_EQ(bad, 0u) << wire_name(w);
  }
  const float big[] = {65504.0f, 65519.0f, 65535.0f, 70000.0f, INFINITY};
  uint16_t out[5];
  cast(big, out, 5, 1.0f, Wire::kFp16, d, 0);
  EXPECT_EQ(out[0], 0x7BFF);  // exactly the largest: no rounding
  for (int i = 1; i < 5; ++i) EXPECT_TRUE(out[i] == 0x7BFF || out[i] == 0x7C00) << i;
  EXPECT_EQ(out[3], 0x7C00);
  EXPECT_EQ(out[4], 0x7C00);
  const float nan = std::nanf("");
  cast(&nan, out, 1, 1.0f, Wire::kBf16, d, 0);
  EXPECT_EQ(out[0], 0x7FC0);
}

TEST(Stochastic, UnbiasedWhereNearestEvenIsNot) {
  const size_t n = size_t(1) << 20;
  for (Wire w : {Wire::kFp16, Wire::kBf16}) {
    // 0.3 of a step above 1.0: nearest-even always rounds down, to 1.0.
    const float step = w == Wire::kFp16 ? 0x1p-10f : 0x1p-7f;
    const std::vector<float> v(n, 1.0f + 0.3f * step);
    std::vector<uint16_t> out(n);
    cast(v.data(), out.data(), n, 1.0f, w, Dither{42, 0, 0, kContribution}, 0);
    double mean = 0;
    for (uint16_t h : out) mean += widen(h, w);
    mean /= double(n);
    const double sigma = step * std::sqrt(0.3 * 0.7 / double(n));
    EXPECT_LT(std::fabs(mean - double(v[0])), 6 * sigma) << wire_name(w) << " mean " << mean;
    EXPECT_EQ(widen(nearest(v[0], w), w), 1.0f) << "nearest-even is biased here";
  }
}

TEST(Stochastic, EveryCounterWordAndTheSeedChangeTheBits) {
  const size_t n = 4096;
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = 1.0f + float(i % 97) * 1e-5f;
  auto bits = [&](const Dither& d, uint64_t first) {
    std::vector<uint16_t> out(n);
    cast(v.data(), out.data(), n, 1.0f, Wire::kBf16, d, first);
    return out;
  };
  const Dither base{9, 3, 1, kContribution};
  const auto reference = bits(base, 0);
  EXPECT_EQ(bits(base, 0), reference) << "the same key and counter give the same bits";
  for (const Dither& d : {Dither{10, 3, 1, kContribution}, Dither{9, 4, 1, kContribution},
                          Dither{9, 3, 2, kContribution}, Dither{9, 3, 1, kResult}}) {
    EXPECT_NE(bits(d, 0), reference) << d.seed << " " << d.seq << " " << d.rank << " " << d.phase;
  }
  EXPECT_NE(bits(base, 4), reference) << "the element index";
  // index / 4 fills a 32-bit counter word at 2^34 elements: past it the bits must still be new.
  for (uint64_t wrap : {uint64_t(1) << 34, uint64_t(3) << 34, uint64_t(1) << 40}) {
    EXPECT_NE(bits(base, wrap), reference) << "element " << wrap;
    EXPECT_NE(bits(Dither{9, 3, 1, kResult}, wrap), bits(base, wrap + (uint64_t(1) << 34))) << "element " << wrap;
  }
}

TEST(Stochastic, SumIsTheFp32SumInOrderRoundedStochastically) {
  std::mt19937 rng(8);
  const Dither d{77, 1, kAnyOwner, kResult};
  for (Wire w : {Wire::kFp16, Wire::kBf16}) {
    for (size_t k : {size_t(1), size_t(3), size_t(4)}) {
      const size_t n = 20000;
      std::vector<std::vector<uint16_t>> in(k, std::vector<uint16_t>(n));
      std::vector<const uint16_t*> ptrs;
      for (auto& row : in) {
        for (auto& x : row) x = nearest(std::normal_distribution<float>(0.0f, 100.0f)(rng), w);
        ptrs.push_back(row.data());
      }
      std::vector<uint16_t> got(n);
      sum(ptrs.data(), k, got.data(), n, w, d, 500);
      size_t bad = 0;
      for (size_t i = 0; i < n; ++i) {
        float acc = widen(in[0][i], w);
        for (size_t j = 1; j < k; ++j) acc += widen(in[j][i], w);
        bad += got[i] != oracle(acc, random_bits(d, 500 + i), w);
      }
      EXPECT_EQ(bad, 0u) << wire_name(w) << " k=" << k;
    }
  }
}

}  // namespace
}  // namespace cnccl::compress

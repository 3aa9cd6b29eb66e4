// The NVFP4 block kernels (compress/cpu/nvfp4.cpp; their vector forms in cpu/avx2.cpp and cpu/avx512.cpp)
// against the scalar kernels, which define the encoding (tests/python/test_nvfp4.py holds those to torchao): every part
// scale, scale code and element byte, every census count and sample, and every decoded, summed and
// restored value's bits are the same on each CPU path (any NaN for a NaN), for random values over 40
// decades and over 6, fp32 subnormals, blocks with an inf or a NaN, exact ties between e2m1 values, block
// scales that e4m3 rounds down (their largest values saturate), zeros and -0, short last blocks,
// zero-padded runs (n < count), products that overflow, and fp64 sources.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "compress/codec.h"
#include "compress/formats.h"
#include "compress/stochastic.h"
#include "cpu_paths.h"

namespace cnccl::compress {
namespace {

using testing::PathGuard;
using testing::same_bits;
using testing::same_values;
using testing::vector_paths;

// Values of every kind the kernels branch on, n of them.
std::vector<std::pair<std::string, std::vector<float>>> kinds(size_t n) {
  std::mt19937 gen(uint32_t(n) * 7 + 1);
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f), decades(-20.0f, 20.0f), few(-3.0f, 3.0f);
  std::vector<std::pair<std::string, std::vector<float>>> out;
  std::vector<float> v(n);
  for (auto& x : v) x = unit(gen) * std::pow(10.0f, decades(gen));
  out.emplace_back("40 decades", v);  // most blocks' scales clamp at 2^-6
  for (size_t i = 0; i < n; ++i) v[i] = unit(gen) * std::pow(10.0f, few(gen) + (i / kNvBlock % 2 ? 0.0f : 1.0f));
  out.emplace_back("6 decades", v);
  for (size_t i = 0; i < n; ++i) v[i] = unit(gen) * (i % 3 ? 1e-39f : 1e-30f);  // fp32 subnormals beside normals
  out.emplace_back("subnormal", v);
  for (size_t i = 0; i < n; ++i) v[i] = unit(gen);
  for (size_t i = 5; i < n; i += 37) v[i] = i % 2 ? INFINITY : -NAN;
  out.emplace_back("non-finite", v);
  // P = 1 (the run's amax is 2688): blocks whose first value is 6 have S = 1 and elements equal to their
  // values, ties between e2m1 values included; blocks whose first value is 6.375 have s = 1.0625, which
  // e4m3 rounds down to 1, and 6.375 saturates.
  const float ties[] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f, 6.2f, -0.0f, 0.0f, 5.9f};
  for (size_t i = 0; i < n; ++i) {
    const size_t b = i / kNvBlock;
    v[i] = i == 0 ? 2688.0f : i % kNvBlock == 0 ? (b % 2 ? 6.0f : 6.375f) : ties[i % 11] * (i % 5 ? 1.0f : -1.0f);
  }
  out.emplace_back("ties", v);
  std::fill(v.begin(), v.end(), 0.0f);
  for (size_t i = 0; i < n; i += 2) v[i] = -0.0f;
  out.emplace_back("zeros", v);
  return out;
}

struct Encoded {
  float part = 0;
  std::vector<uint8_t> bytes;
  Census census;
};

template <typename T>
Encoded encode_on(CpuPath path, const std::vector<T>& src, size_t count, float scale) {
  set_cpu_path(path);
  Encoded e;
  e.bytes.assign(nv_bytes(count), 0xAB);
  const CensusScope scope(&e.census, 7);
  e.part = nv_part_scale(src.data(), src.size(), scale);
  nv_encode(src.data(), src.size(), count, scale, e.part, e.bytes.data());
  return e;
}

void expect_same(const Encoded& got, const Encoded& want, const std::string& what) {
  EXPECT_EQ(std::memcmp(&got.part, &want.part, sizeof got.part), 0) << what << ": part " << got.part << " " << want.part;
  EXPECT_TRUE(same_bits(got.bytes, want.bytes)) << what;
  EXPECT_EQ(got.census.nonfinite, want.census.nonfinite) << what;
  EXPECT_EQ(got.census.saturated, want.census.saturated) << what;
  EXPECT_EQ(got.census.samples, want.census.samples) << what;
  EXPECT_EQ(got.census.error_squared, want.census.error_squared) << what;
  EXPECT_EQ(got.census.value_squared, want.census.value_squared) << what;
}

// Each kind's run of n values encoded by the scalar kernels, and its part scale.
std::pair<std::vector<std::vector<uint8_t>>, std::vector<float>> runs_of_every_kind(size_t n) {
  std::vector<std::vector<uint8_t>> runs;
  std::vector<float> parts;
  for (const auto& [kind, v] : kinds(n)) {
    const Encoded e = encode_on(CpuPath::kScalar, v, n, 1.0f);
    runs.push_back(e.bytes);
    parts.push_back(e.part);
  }
  return {runs, parts};
}

TEST(CodecNvfp4, EncodingIsTheScalarKernelsBitForBit) {
  const PathGuard guard;
  if (vector_paths().empty()) GTEST_SKIP() << "this processor has no vector path";
  for (size_t n : {size_t(0), size_t(1), size_t(15), size_t(16), size_t(17), size_t(1000), size_t(4113)}) {
    for (const auto& [kind, v] : kinds(n)) {
      for (size_t count : {n, n + 40}) {  // as given, and zero-padded past n
        // 1e30: products past fp32's range become inf, which the part scale leaves out.
        for (float scale : {1.0f, 0.3f, 1e30f}) {
          const std::string what = kind + " n=" + std::to_string(n) + " count=" + std::to_string(count) +
                                   " scale=" + std::to_string(scale);
          const Encoded want = encode_on(CpuPath::kScalar, v, count, scale);
          const std::vector<double> wide(v.begin(), v.end());
          const Encoded want64 = encode_on(CpuPath::kScalar, wide, count, scale);
          for (CpuPath path : vector_paths()) {
            expect_same(encode_on(path, v, count, scale), want, std::string(cpu_path_name(path)) + " " + what);
            expect_same(encode_on(path, wide, count, scale), want64, std::string(cpu_path_name(path)) + " fp64 " + what);
          }
        }
      }
    }
  }
}

// The census counts what the definition says: every value that is not finite, and nothing saturated for
// values at most 7 after their block's reciprocal; the "ties" kind saturates only its 6.375s (their
// blocks' S rounds down), which land at 6.375 < 7, so none.
TEST(CodecNvfp4, TheCensusCountsNonFiniteValues) {
  const PathGuard guard;
  for (CpuPath path : kCpuPaths) {
    if (!cpu_path_supported(path)) continue;
    for (const auto& [kind, v] : kinds(4113)) {
      const Encoded e = encode_on(path, v, v.size(), 1.0f);
      size_t nonfinite = 0;
      for (float x : v) nonfinite += !std::isfinite(x);
      EXPECT_EQ(e.census.nonfinite, nonfinite) << cpu_path_name(path) << " " << kind;
      EXPECT_EQ(e.census.saturated, 0u) << cpu_path_name(path) << " " << kind;
    }
  }
}

TEST(CodecNvfp4, DecodingSumsAndRestoresAreTheScalarKernelsBitForBit) {
  const PathGuard guard;
  if (vector_paths().empty()) GTEST_SKIP() << "this processor has no vector path";
  for (size_t n : {size_t(1), size_t(17), size_t(2048), size_t(4113), size_t(70000)}) {
    // Runs of every kind (the non-finite one gives NaN blocks), and a run of random bytes: every scale
    // code, e4m3's NaN and its negative ones included.
    auto [runs, parts] = runs_of_every_kind(n);
    std::mt19937 gen{uint32_t(n)};
    std::vector<uint8_t> noise(nv_bytes(n));
    for (auto& b : noise) b = uint8_t(gen());
    runs.push_back(noise);
    parts.push_back(0.37f);
    for (size_t r = 0; r + 2 < runs.size(); ++r) {
      const std::string what = "n=" + std::to_string(n) + " runs from " + std::to_string(r);
      const uint8_t* three[] = {runs[r].data(), runs[r + 1].data(), runs[r + 2].data()};
      auto on = [&](CpuPath path) {
        set_cpu_path(path);
        std::vector<float> sum(n), restored(n - n / 3);
        std::vector<double> restored64(n);
        const float amax = nv_sum(three, parts.data() + r, 3, sum.data(), n);
        nv_restore(three[0], n, parts[r], restored.data(), restored.size(), 0.7f);
        nv_restore(three[1], n, parts[r + 1], restored64.data(), n, 3.0f);
        return std::make_tuple(sum, restored, restored64, amax);
      };
      const auto want = on(CpuPath::kScalar);
      float finite = 0.0f;
      for (float x : std::get<0>(want)) finite = std::isfinite(x) ? std::max(finite, std::fabs(x)) : finite;
      EXPECT_EQ(std::get<3>(want), finite) << "the sums' amax " << what;
      for (CpuPath path : vector_paths()) {
        const auto got = on(path);
        EXPECT_TRUE(same_values(std::get<0>(got), std::get<0>(want))) << cpu_path_name(path) << " sum " << what;
        EXPECT_TRUE(same_values(std::get<1>(got), std::get<1>(want))) << cpu_path_name(path) << " restore " << what;
        EXPECT_TRUE(same_values(std::get<2>(got), std::get<2>(want))) << cpu_path_name(path) << " fp64 " << what;
        EXPECT_EQ(std::get<3>(got), std::get<3>(want)) << cpu_path_name(path) << " amax " << what;
      }
    }
  }
}

// Stochastic rounding (compress/stochastic.h, stochastic_e2m1_value) is unbiased: over 4096 seeds each
// element's mean decoded value lies within 5 standard errors of the value (its e2m1 step times fl(P * S),
// over 2 sqrt(4096)) (an owner's sums take the same rounding, held to its emulation bit for bit by
// tests/python/test_nvfp4.py); rounding to nearest misses that bound for every one of these values, which sit a third of a step from the grid. P = 1 (the run's
// amax is 2688) and the second block's S = 1 (its amax is 6).
TEST(CodecNvfp4, StochasticRoundingIsUnbiased) {
  const std::vector<float> v = {2688, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
                                6.0f, 2.0f / 3, 4.0f / 3, -7.0f / 3, 10.0f / 3, 14.0f / 3, -16.0f / 3, 1.0f / 6,
                                -2.0f / 3, 5.0f / 3, 8.0f / 3, 11.0f / 3, -13.0f / 3, 17.0f / 3, 0.5f / 3, -1.0f / 6};
  const size_t n = v.size();
  const float part = nv_part_scale(v.data(), n, 1.0f);
  ASSERT_EQ(part, 1.0f);
  constexpr int kSeeds = 4096;
  std::vector<double> mean(n, 0.0);
  std::vector<uint8_t> bytes(nv_bytes(n));
  std::vector<float> decoded(n);
  for (int seed = 0; seed < kSeeds; ++seed) {
    nv_encode(v.data(), n, n, 1.0f, part, bytes.data(), contribution_dither(uint64_t(seed), 0, 0), 0);
    nv_restore(bytes.data(), n, part, decoded.data(), n, 1.0f);
    for (size_t i = 0; i < n; ++i) mean[i] += decoded[i] / kSeeds;
  }
  std::vector<float> nearest(n);
  nv_encode(v.data(), n, n, 1.0f, part, bytes.data());
  nv_restore(bytes.data(), n, part, nearest.data(), n, 1.0f);
  for (size_t i = 17; i < n; ++i) {
    const float a = std::fabs(v[i]);
    const double step = a < 2 ? 0.5 : a < 4 ? 1.0 : 2.0, bound = 5 * step / (2 * std::sqrt(double(kSeeds)));
    EXPECT_LE(std::fabs(mean[i] - v[i]), bound) << "element " << i << " = " << v[i] << ": mean " << mean[i];
    EXPECT_GT(std::fabs(nearest[i] - v[i]), bound) << "element " << i << ": off the grid, for the test to mean it";
  }
}

// The vector kernels round stochastically as the scalar one does, bit for bit (their Philox on 8 or 16
// lanes and the rounding's operations), for every kind of values, from indices that are and are not a
// multiple of 16 (a Philox block) or of a vector group's 128 or 256 elements, and across the index 2^36,
// where the block counter's low word wraps and the phase word changes.
TEST(CodecNvfp4, StochasticEncodingIsTheScalarKernelsBitForBit) {
  const PathGuard guard;
  if (vector_paths().empty()) GTEST_SKIP() << "this processor has no vector path";
  const Dither dither = contribution_dither(0xFEDCBA9876543210ull, 4, 2);
  for (size_t n : {size_t(17), size_t(1000), size_t(4113)}) {
    for (const auto& [kind, v] : kinds(n)) {
      for (uint64_t first : {uint64_t(0), uint64_t(1), uint64_t(3), uint64_t(48), (uint64_t(1) << 36) - 77}) {
        const std::string what = kind + " n=" + std::to_string(n) + " first=" + std::to_string(first);
        auto encoded_on = [&](CpuPath path) {
          set_cpu_path(path);
          Encoded e;
          e.bytes.assign(nv_bytes(n), 0xAB);
          const CensusScope scope(&e.census, 7);
          e.part = nv_part_scale(v.data(), n, 0.7f);
          nv_encode(v.data(), n, n, 0.7f, e.part, e.bytes.data(), dither, first);
          return e;
        };
        const Encoded want = encoded_on(CpuPath::kScalar);
        for (CpuPath path : vector_paths()) expect_same(encoded_on(path), want, std::string(cpu_path_name(path)) + " " + what);
      }
    }
  }
}

// Each element takes the random bits of its own index (compress/stochastic.h, block_random_bits), across
// the index 2^36 where the blocks' counter changes phase: the run's elements from index 2^36 - 20 on, each
// against stochastic_e2m1_value of its bits. P = 1 and S = 1 as above, so each element's q is its value.
TEST(CodecNvfp4, StochasticRoundingTakesEachIndexsByte) {
  std::vector<float> v(48, 0.0f);
  v[0] = 2688.0f;
  for (size_t i = 16; i < 48; ++i) v[i] = i % 16 == 0 ? 6.0f : float(i % 7) * 0.7f * (i % 3 ? 1.0f : -1.0f);
  const uint64_t first = (uint64_t(1) << 36) - 20;
  const Dither dither = contribution_dither(0x1234567890ABCDEFull, 9, 3);
  std::vector<uint8_t> bytes(nv_bytes(v.size()));
  nv_encode(v.data(), v.size(), v.size(), 1.0f, nv_part_scale(v.data(), v.size(), 1.0f), bytes.data(), dither, first);
  const uint8_t* elements = bytes.data() + v.size() / kNvBlock;
  for (size_t i = 16; i < v.size(); ++i) {
    const float a = std::fabs(v[i]);
    const float value = stochastic_e2m1_value(std::min(a, 6.0f), block_random_bits(dither, first + i));
    const uint8_t code = uint8_t((std::signbit(v[i]) ? 8 : 0) | formats::e2m1_code(value));
    EXPECT_EQ((elements[i / 2] >> (i % 2 * 4)) & 0xF, code) << "element " << i << " (index 2^36 - 20 + " << i << ")";
  }
}

// Under a part scale smaller than the run's (P = 1 here, where the run's amax asks for 12), a block's S
// clamps at 448 and its values from 7 S on saturate: the census counts q >= 7 (7 itself included) as the scalar
// kernel does, on every path, over more blocks than one vector group of each path holds.
TEST(CodecNvfp4, ValuesFromSevenOnAreCountedAsSaturated) {
  const PathGuard guard;
  // q = fl(v * fl(1 / 448)): 12, exactly 7 (3136 - 2^-12), 7.5, 6, 6.5 and below.
  const float seven = std::nextafter(3136.0f, 0.0f);
  ASSERT_EQ(seven * (1.0f / 448.0f), 7.0f);
  const float block[kNvBlock] = {5376.0f, seven, -3360.0f, 2688.0f, 2912.0f, 1.0f, -2.0f, 3.0f,
                                 100.0f, 200.0f, 300.0f, 400.0f, 500.0f, 600.0f, 700.0f, 800.0f};
  constexpr size_t kBlocks = 40;
  std::vector<float> v(kBlocks * kNvBlock);
  for (size_t i = 0; i < v.size(); ++i) v[i] = block[i % kNvBlock];
  Census want_census;
  std::vector<uint8_t> want(nv_bytes(v.size()));
  set_cpu_path(CpuPath::kScalar);
  {
    const CensusScope scope(&want_census, 0);
    nv_encode(v.data(), v.size(), v.size(), 1.0f, 1.0f, want.data());
  }
  EXPECT_EQ(want_census.saturated, 3 * kBlocks);
  for (CpuPath path : vector_paths()) {
    set_cpu_path(path);
    Census census;
    std::vector<uint8_t> got(want.size());
    {
      const CensusScope scope(&census, 0);
      nv_encode(v.data(), v.size(), v.size(), 1.0f, 1.0f, got.data());
    }
    EXPECT_EQ(census.saturated, want_census.saturated) << cpu_path_name(path);
    EXPECT_TRUE(same_bits(got, want)) << cpu_path_name(path);
  }
}

// An element whose fraction f above the grid equals its u exactly rounds down (up only when u < f), on
// every path: each element is u / 2 for its own bits' u (spacing 0.5 below 2, so q = u and f = u), in
// blocks with S = 1 under P = 1, from starts that are and are not a multiple of 16.
TEST(CodecNvfp4, AnElementAtItsThresholdRoundsDown) {
  const PathGuard guard;
  const std::vector<CpuPath> paths = testing::all_paths();
  const Dither dither = contribution_dither(0xC0FFEE1234ull, 11, 1);
  constexpr size_t kBlocks = 40;
  for (uint64_t first : {uint64_t(0), uint64_t(6)}) {
    std::vector<float> v(kBlocks * kNvBlock);
    for (size_t i = 0; i < v.size(); ++i) {
      v[i] = i % kNvBlock == 0 ? 6.0f : float(block_random_bits(dither, first + i) >> 8) * 0x1p-25f;
    }
    for (CpuPath path : paths) {
      set_cpu_path(path);
      std::vector<uint8_t> bytes(nv_bytes(v.size()));
      nv_encode(v.data(), v.size(), v.size(), 1.0f, 1.0f, bytes.data(), dither, first);
      const uint8_t* elements = bytes.data() + kBlocks;
      size_t up = 0;
      for (size_t i = 0; i < v.size(); ++i) up += i % kNvBlock && (elements[i / 2] >> (i % 2 * 4) & 0xF) != 0;
      EXPECT_EQ(up, 0u) << cpu_path_name(path) << " first=" << first << ": elements rounded up at u = f";
    }
  }
}

// An owner's sum encoded again in one pass writes the run that summing and then encoding under the sums'
// part scale write, returns that scale, and counts what the encoding meets, on every path, over pieces
// (70000 values) and a short last block.
TEST(CodecNvfp4, SumEncodeIsSumThenEncode) {
  const PathGuard guard;
  const std::vector<CpuPath> paths = testing::all_paths();
  for (size_t n : {size_t(1), size_t(17), size_t(2048), size_t(4113), size_t(70000)}) {
    const auto [runs, parts] = runs_of_every_kind(n);
    for (size_t r = 0; r + 2 < runs.size(); ++r) {
      const std::string what = "n=" + std::to_string(n) + " runs from " + std::to_string(r);
      const uint8_t* three[] = {runs[r].data(), runs[r + 1].data(), runs[r + 2].data()};
      for (CpuPath path : paths) {
        set_cpu_path(path);
        std::vector<float> sums(n);
        nv_sum(three, parts.data() + r, 3, sums.data(), n);
        const Encoded want = encode_on(path, sums, n, 1.0f);
        Encoded got;
        got.bytes.assign(nv_bytes(n), 0xAB);
        {
          const CensusScope scope(&got.census, 7);
          got.part = nv_sum_encode(three, parts.data() + r, 3, n, got.bytes.data());
        }
        EXPECT_EQ(got.part, want.part) << cpu_path_name(path) << " " << what;
        EXPECT_TRUE(same_bits(got.bytes, want.bytes)) << cpu_path_name(path) << " " << what;
        EXPECT_EQ(got.census.nonfinite, want.census.nonfinite) << cpu_path_name(path) << " " << what;
        EXPECT_EQ(got.census.saturated, want.census.saturated) << cpu_path_name(path) << " " << what;
        EXPECT_EQ(got.census.samples, 0u) << cpu_path_name(path) << " " << what;
        // Into the first run itself (an owner's frame written over its own contribution): a piece's
        // bytes are read before they are written.
        std::vector<uint8_t> own = runs[r];
        const uint8_t* aliased[] = {own.data(), runs[r + 1].data(), runs[r + 2].data()};
        EXPECT_EQ(nv_sum_encode(aliased, parts.data() + r, 3, n, own.data()), want.part) << what;
        EXPECT_TRUE(same_bits(own, want.bytes)) << cpu_path_name(path) << " in place " << what;
      }
    }
  }
}

}  // namespace
}  // namespace cnccl::compress

// The MX block kernels (compress/cpu/mx.cpp; their vector forms in cpu/avx2.cpp and cpu/avx512.cpp) against
// the scalar kernels, which define the encoding (tests/python/test_mx.py holds those to torchao): every scale and
// element byte, every census count and sample, and every decoded, summed and restored value's bits are the
// same on each CPU path (any NaN for a NaN), for random values over 40 decades, fp32 subnormals, blocks with an inf or a NaN,
// exact ties between element values, amaxes on both sides of each rule's saturation edge, zeros and -0,
// short last blocks, zero-padded runs (n < count) and fp64 sources, under both scale rules.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "compress/codec.h"
#include "compress/stochastic.h"
#include "cpu_paths.h"

namespace cnccl::compress {
namespace {

using testing::PathGuard;
using testing::same_bits;
using testing::same_values;
using testing::vector_paths;

const Wire kWires[] = {Wire::kMxfp8, Wire::kMxfp8E5m2, Wire::kMxfp4};
const MxScale kRules[] = {MxScale::kRceil, MxScale::kFloor};

std::string name(Wire w, MxScale rule, const std::string& kind, size_t n) {
  return std::string(wire_name(w)) + " " + mx_scale_name(rule) + " " + kind + " n=" + std::to_string(n);
}

// Values of every kind the kernels branch on, n of them.
std::vector<std::pair<std::string, std::vector<float>>> kinds(Wire w, size_t n) {
  std::mt19937 gen(uint32_t(n) * 7 + uint32_t(w));
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f), decades(-20.0f, 20.0f);
  std::vector<std::pair<std::string, std::vector<float>>> out;
  std::vector<float> v(n);
  for (auto& x : v) x = unit(gen) * std::pow(10.0f, decades(gen));
  out.emplace_back("random", v);
  for (size_t i = 0; i < n; ++i) v[i] = unit(gen) * (i % 3 ? 1e-39f : 1e-30f);  // fp32 subnormals beside normals
  out.emplace_back("subnormal", v);
  for (size_t i = 0; i < n; ++i) v[i] = unit(gen);
  for (size_t i = 5; i < n; i += 97) v[i] = i % 2 ? INFINITY : -NAN;
  out.emplace_back("non-finite", v);
  // Ties between neighbouring element values (e2m1's and e4m3's) at a block scale of 2^0, and their
  // negatives: each block's first value sets the scale.
  const float ties[] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f, 0.0009765625f, 1.0625f, 1.1875f, -0.0f, 0.0f};
  for (size_t i = 0; i < n; ++i) {
    v[i] = i % kMxBlock == 0 ? std::ldexp(1.0f, mx_emax(w)) : ties[i % 12] * (i % 5 ? 1.0f : -1.0f);
  }
  out.emplace_back("ties", v);
  // amax with significands from 1.0 to 1.99 (past 1.5 and 1.75, where FLOOR saturates and RCEIL takes
  // the next scale), one ulp either side of each rule's edge, over many binades.
  const float edge = mx_largest(w) / std::ldexp(1.0f, mx_emax(w));
  for (size_t i = 0; i < n; ++i) {
    const size_t b = i / kMxBlock;
    const float top = b % 3 == 0 ? std::nextafter(edge, 2.0f) : b % 3 == 1 ? edge : 1.0f + float(b % 97) / 97.0f;
    const float block = std::ldexp(top, int(b % 200) - 100);
    v[i] = i % kMxBlock == 0 ? block : block * unit(gen);
  }
  out.emplace_back("saturation", v);
  std::fill(v.begin(), v.end(), 0.0f);
  for (size_t i = 0; i < n; i += 2) v[i] = -0.0f;
  out.emplace_back("zeros", v);
  return out;
}

struct Encoded {
  std::vector<uint8_t> bytes;
  Census census;
};

template <typename T>
Encoded encode_on(CpuPath path, const std::vector<T>& src, size_t count, float scale, Wire w, MxScale rule) {
  set_cpu_path(path);
  Encoded e;
  e.bytes.assign(mx_bytes(count, w), 0xAB);
  const CensusScope scope(&e.census, 7);
  mx_encode(src.data(), src.size(), count, scale, w, rule, e.bytes.data());
  return e;
}

void expect_same_census(const Census& a, const Census& b, const std::string& what) {
  EXPECT_EQ(a.nonfinite, b.nonfinite) << what;
  EXPECT_EQ(a.saturated, b.saturated) << what;
  EXPECT_EQ(a.samples, b.samples) << what;
  EXPECT_EQ(a.error_squared, b.error_squared) << what;
  EXPECT_EQ(a.value_squared, b.value_squared) << what;
}

TEST(CodecMx, EncodingIsTheScalarKernelsBitForBit) {
  const PathGuard guard;
  if (vector_paths().empty()) GTEST_SKIP() << "this processor has no vector path";
  for (Wire w : kWires) {
    for (MxScale rule : kRules) {
      for (size_t n : {size_t(0), size_t(1), size_t(31), size_t(32), size_t(33), size_t(1000), size_t(4113)}) {
        for (const auto& [kind, v] : kinds(w, n)) {
          for (size_t count : {n, n + 40}) {  // as given, and zero-padded past n
            for (float scale : {1.0f, 0.3f}) {
              const std::string what = name(w, rule, kind, n) + " count=" + std::to_string(count) +
                                       " scale=" + std::to_string(scale);
              const Encoded want = encode_on(CpuPath::kScalar, v, count, scale, w, rule);
              for (CpuPath path : vector_paths()) {
                const Encoded got = encode_on(path, v, count, scale, w, rule);
                EXPECT_TRUE(same_bits(got.bytes, want.bytes)) << cpu_path_name(path) << " " << what;
                expect_same_census(got.census, want.census, what);
              }
              const std::vector<double> wide(v.begin(), v.end());
              const Encoded want64 = encode_on(CpuPath::kScalar, wide, count, scale, w, rule);
              for (CpuPath path : vector_paths()) {
                const Encoded got = encode_on(path, wide, count, scale, w, rule);
                EXPECT_TRUE(same_bits(got.bytes, want64.bytes)) << cpu_path_name(path) << " fp64 " << what;
                expect_same_census(got.census, want64.census, "fp64 " + what);
              }
            }
          }
        }
      }
    }
  }
}

TEST(CodecMx, DecodingSumsAndRestoresAreTheScalarKernelsBitForBit) {
  const PathGuard guard;
  if (vector_paths().empty()) GTEST_SKIP() << "this processor has no vector path";
  for (Wire w : kWires) {
    for (size_t n : {size_t(1), size_t(33), size_t(2048), size_t(4113), size_t(70000)}) {
      // Three ranks' runs of every kind (the non-finite one gives NaN blocks), and a run of random bytes:
      // element codes no encoder writes (e4m3's NaN, e5m2's inf and NaN) and every scale code.
      std::vector<std::vector<uint8_t>> runs;
      for (const auto& [kind, v] : kinds(w, n)) runs.push_back(encode_on(CpuPath::kScalar, v, n, 1.0f, w, kRules[0]).bytes);
      std::mt19937 gen{uint32_t(n)};
      std::vector<uint8_t> noise(mx_bytes(n, w));
      for (auto& b : noise) b = uint8_t(gen());
      runs.push_back(noise);
      for (size_t r = 0; r + 2 < runs.size(); ++r) {
        const std::string what = std::string(wire_name(w)) + " n=" + std::to_string(n) + " runs from " + std::to_string(r);
        const uint8_t* three[] = {runs[r].data(), runs[r + 1].data(), runs[r + 2].data()};
        auto on = [&](CpuPath path) {
          set_cpu_path(path);
          std::vector<float> sum(n), restored(n - n / 3);
          std::vector<double> restored64(n);
          mx_sum(three, 3, sum.data(), n, w);
          mx_restore(three[0], n, restored.data(), restored.size(), 0.7f, w);
          mx_restore(three[1], n, restored64.data(), n, 3.0f, w);
          return std::make_tuple(sum, restored, restored64);
        };
        const auto want = on(CpuPath::kScalar);
        for (CpuPath path : vector_paths()) {
          const auto got = on(path);
          EXPECT_TRUE(same_values(std::get<0>(got), std::get<0>(want))) << cpu_path_name(path) << " sum " << what;
          EXPECT_TRUE(same_values(std::get<1>(got), std::get<1>(want))) << cpu_path_name(path) << " restore " << what;
          EXPECT_TRUE(same_values(std::get<2>(got), std::get<2>(want))) << cpu_path_name(path) << " fp64 " << what;
        }
      }
    }
  }
}

// An owner's sum framed again in one pass writes the run that summing and then encoding write, and
// counts what the encoding meets, on every path, over pieces (70000 values) and a short last block.
TEST(CodecMx, SumEncodeIsSumThenEncode) {
  const PathGuard guard;
  const std::vector<CpuPath> paths = testing::all_paths();
  for (Wire w : kWires) {
    for (MxScale rule : kRules) {
      for (size_t n : {size_t(1), size_t(33), size_t(2048), size_t(4113), size_t(70000)}) {
        std::vector<std::vector<uint8_t>> runs;
        for (const auto& [kind, v] : kinds(w, n)) runs.push_back(encode_on(CpuPath::kScalar, v, n, 1.0f, w, rule).bytes);
        for (size_t r = 0; r + 2 < runs.size(); ++r) {
          const std::string what = name(w, rule, "runs from " + std::to_string(r), n);
          const uint8_t* three[] = {runs[r].data(), runs[r + 1].data(), runs[r + 2].data()};
          for (CpuPath path : paths) {
            set_cpu_path(path);
            std::vector<float> sums(n);
            mx_sum(three, 3, sums.data(), n, w);
            const Encoded want = encode_on(path, sums, n, 1.0f, w, rule);
            Encoded got;
            got.bytes.assign(mx_bytes(n, w), 0xAB);
            {
              const CensusScope scope(&got.census, 7);
              mx_sum_encode(three, 3, n, w, rule, got.bytes.data());
            }
            EXPECT_TRUE(same_bits(got.bytes, want.bytes)) << cpu_path_name(path) << " " << what;
            EXPECT_EQ(got.census.nonfinite, want.census.nonfinite) << cpu_path_name(path) << " " << what;
            EXPECT_EQ(got.census.saturated, want.census.saturated) << cpu_path_name(path) << " " << what;
            EXPECT_EQ(got.census.samples, 0u) << cpu_path_name(path) << " " << what;
          }
        }
      }
    }
  }
}

// The step of an MX element type's grid at a > 0: e4m3 2^(max(E, -6) - 3), e5m2 2^(max(E, -14) - 2),
// e2m1 0.5 below 2, 1 below 4, else 2, for E = floor(log2 a) (the types' definitions, OCP MX v1.0 5.3).
double grid_step(double a, Wire w) {
  const int e = int(std::floor(std::log2(a)));
  if (w == Wire::kMxfp4) return a < 2 ? 0.5 : a < 4 ? 1.0 : 2.0;
  return w == Wire::kMxfp8 ? std::ldexp(1.0, std::max(e, -6) - 3) : std::ldexp(1.0, std::max(e, -14) - 2);
}

// Stochastic rounding of MX elements (compress/stochastic.h, stochastic_fp8_value and stochastic_e2m1_value)
// is unbiased: over 4096 seeds each element's mean decoded value lies within 5 standard errors of the value
// (its step over 2 sqrt(4096)); rounding to nearest misses that bound for every one of these values, which
// sit a third or two thirds of a step above the grid, in every binade of the element type (subnormals
// included). The block's first value is L, so X = 0 and the elements are the values themselves; the
// collectives' roundings are held to their emulation bit for bit by tests/python/test_mx.py.
TEST(CodecMx, StochasticRoundingIsUnbiased) {
  for (Wire w : kWires) {
    const double largest = mx_largest(w), smallest = w == Wire::kMxfp8 ? 0x1p-9 : w == Wire::kMxfp8E5m2 ? 0x1p-16 : 0.5;
    std::vector<float> v(kMxBlock);
    v[0] = float(largest);
    for (size_t j = 1; j < kMxBlock; ++j) {
      // From just above the smallest step to just below L, geometrically.
      const double base = smallest * std::pow(largest / smallest, double(j) / kMxBlock);
      const double step = grid_step(base, w);
      const double value = std::floor(base / step) * step + step * (j % 2 ? 1.0 / 3 : 2.0 / 3);
      v[j] = float(j % 3 ? value : -value);
    }
    constexpr int kSeeds = 4096;
    std::vector<double> mean(kMxBlock, 0.0);
    std::vector<uint8_t> bytes(mx_bytes(kMxBlock, w));
    std::vector<float> decoded(kMxBlock);
    for (int seed = 0; seed < kSeeds; ++seed) {
      mx_encode(v.data(), kMxBlock, kMxBlock, 1.0f, w, MxScale::kRceil, bytes.data(),
                contribution_dither(uint64_t(seed), 0, 0), 0);
      ASSERT_EQ(bytes[0], 127) << wire_name(w) << ": X = 0";
      mx_restore(bytes.data(), kMxBlock, decoded.data(), kMxBlock, 1.0f, w);
      for (size_t i = 0; i < kMxBlock; ++i) mean[i] += decoded[i] / kSeeds;
    }
    std::vector<float> nearest(kMxBlock);
    mx_encode(v.data(), kMxBlock, kMxBlock, 1.0f, w, MxScale::kRceil, bytes.data());
    mx_restore(bytes.data(), kMxBlock, nearest.data(), kMxBlock, 1.0f, w);
    EXPECT_EQ(mean[0], largest) << wire_name(w) << ": L is on the grid";
    for (size_t i = 1; i < kMxBlock; ++i) {
      const double bound = 5 * grid_step(std::fabs(v[i]), w) / (2 * std::sqrt(double(kSeeds)));
      EXPECT_LE(std::fabs(mean[i] - v[i]), bound) << wire_name(w) << " element " << i << " = " << v[i] << ": mean "
                                                   << mean[i];
      EXPECT_GT(std::fabs(nearest[i] - v[i]), bound) << wire_name(w) << " element " << i << ": off the grid";
    }
  }
}

// A value past L under FLOOR saturates to L before it is rounded, so stochastic rounding never goes past
// L (e4m3 has no value above 448 but NaN); each element takes the random bits of its own index
// (block_random_bits), across the index 2^36 where the blocks' counter changes phase.
TEST(CodecMx, StochasticRoundingSaturatesAndTakesEachIndexsByte) {
  for (Wire w : kWires) {
    const float largest = mx_largest(w);
    std::vector<float> v(2 * kMxBlock);
    for (size_t i = 0; i < v.size(); ++i) v[i] = largest * (0.45f + 0.55f * float(i % 11) / 10) * (i % 2 ? -1 : 1);
    v[5] = largest * 1.1f;  // FLOOR: X = 0, and 1.1 L saturates
    const uint64_t first = (uint64_t(1) << 36) - 20;
    const Dither dither = contribution_dither(0x1234567890ABCDEFull, 9, 3);
    std::vector<uint8_t> bytes(mx_bytes(v.size(), w));
    mx_encode(v.data(), v.size(), v.size(), 1.0f, w, MxScale::kFloor, bytes.data(), dither, first);
    std::vector<float> decoded(v.size());
    mx_restore(bytes.data(), v.size(), decoded.data(), v.size(), 1.0f, w);
    EXPECT_EQ(decoded[5], largest) << wire_name(w);
    for (size_t i = 0; i < v.size(); ++i) {
      const int x = int(bytes[i / kMxBlock]) - 127;
      const float a = std::min(std::fabs(std::ldexp(v[i], -x)), largest);
      const uint32_t random = block_random_bits(dither, first + i);
      const float magnitude = w == Wire::kMxfp4 ? stochastic_e2m1_value(a, random)
                                                : stochastic_fp8_value(a, random, w == Wire::kMxfp8 ? Wire::kE4m3
                                                                                                     : Wire::kE5m2);
      EXPECT_EQ(decoded[i], std::ldexp(std::copysign(magnitude, v[i]), x))
          << wire_name(w) << " element " << i << " (index 2^36 - 20 + " << i << ")";
    }
  }
}

// The vector kernels round stochastically as the scalar ones do, bit for bit (their Philox on 8 or 16 lanes
// and each element type's rounding), for every kind of values, both rules, from indices that are and are
// not a multiple of 16 (a Philox block) or of a vector group's 128 or 256 elements, and across the index
// 2^36, where the block counter's low word wraps and the phase word changes.
TEST(CodecMx, StochasticEncodingIsTheScalarKernelsBitForBit) {
  const PathGuard guard;
  if (vector_paths().empty()) GTEST_SKIP() << "this processor has no vector path";
  const Dither dither = contribution_dither(0xFEDCBA9876543210ull, 4, 2);
  for (Wire w : kWires) {
    for (MxScale rule : kRules) {
      for (size_t n : {size_t(33), size_t(1000), size_t(4113)}) {
        for (const auto& [kind, v] : kinds(w, n)) {
          for (uint64_t first : {uint64_t(0), uint64_t(1), uint64_t(3), uint64_t(48), (uint64_t(1) << 36) - 77}) {
            const std::string what = name(w, rule, kind, n) + " first=" + std::to_string(first);
            auto encoded_on = [&](CpuPath path) {
              set_cpu_path(path);
              Encoded e;
              e.bytes.assign(mx_bytes(n, w), 0xAB);
              const CensusScope scope(&e.census, 7);
              mx_encode(v.data(), n, n, 0.7f, w, rule, e.bytes.data(), dither, first);
              return e;
            };
            const Encoded want = encoded_on(CpuPath::kScalar);
            for (CpuPath path : vector_paths()) {
              const Encoded got = encoded_on(path);
              EXPECT_TRUE(same_bits(got.bytes, want.bytes)) << cpu_path_name(path) << " " << what;
              expect_same_census(got.census, want.census, std::string(cpu_path_name(path)) + " " + what);
            }
          }
        }
      }
    }
  }
}

// An element whose fraction f above the grid equals its u exactly rounds down (up only when u < f), on
// every path and wire: each element is u times the grid's step at the smallest values (e4m3 2^-9, e5m2
// 2^-16, e2m1 0.5) for its own bits' u, so that q / step = u, in blocks whose first value L gives X = 0,
// from starts that are and are not a multiple of 16.
TEST(CodecMx, AnElementAtItsThresholdRoundsDown) {
  const PathGuard guard;
  const std::vector<CpuPath> paths = testing::all_paths();
  const Dither dither = contribution_dither(0xC0FFEE1234ull, 11, 1);
  constexpr size_t kBlocks = 40;
  for (Wire w : kWires) {
    const int step = w == Wire::kMxfp8 ? -9 : w == Wire::kMxfp8E5m2 ? -16 : -1;
    for (uint64_t first : {uint64_t(0), uint64_t(6)}) {
      std::vector<float> v(kBlocks * kMxBlock);
      for (size_t i = 0; i < v.size(); ++i) {
        v[i] = i % kMxBlock == 0 ? mx_largest(w)
                                 : std::ldexp(float(block_random_bits(dither, first + i) >> 8), step - 24);
      }
      for (CpuPath path : paths) {
        set_cpu_path(path);
        std::vector<uint8_t> bytes(mx_bytes(v.size(), w));
        mx_encode(v.data(), v.size(), v.size(), 1.0f, w, MxScale::kRceil, bytes.data(), dither, first);
        std::vector<float> decoded(v.size());
        mx_restore(bytes.data(), v.size(), decoded.data(), v.size(), 1.0f, w);
        size_t up = 0;
        for (size_t i = 0; i < v.size(); ++i) up += i % kMxBlock && decoded[i] != 0.0f;
        EXPECT_EQ(up, 0u) << wire_name(w) << " " << cpu_path_name(path) << " first=" << first
                          << ": elements rounded up at u = f";
      }
    }
  }
}

}  // namespace
}  // namespace cnccl::compress

// The block rotation's vector kernels (compress/cpu/avx2.cpp, cpu/avx512.cpp, rotate_f32) against the scalar
// kernel of cpu/rotation.cpp, which defines it (tests/python/test_rotation.py holds the collectives to an
// emulation): every value's bits the same on each CPU path (any NaN for a NaN), both ways, in place and
// not, for Gaussian values, values over 40 decades, fp32 subnormals (where the 1/4 rounds), infinities and
// NaNs, zeros and -0, under several sign patterns, with a short tail copied as it is.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "compress/codec.h"
#include "cpu_paths.h"

namespace cnccl::compress {
namespace {

using testing::PathGuard;
using testing::same_values;
using testing::vector_paths;

std::vector<std::pair<std::string, std::vector<float>>> kinds(size_t n) {
  std::mt19937 gen(uint32_t(n) * 5 + 3);
  std::normal_distribution<float> normal;
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f), decades(-20.0f, 20.0f);
  std::vector<std::pair<std::string, std::vector<float>>> out;
  std::vector<float> v(n);
  for (auto& x : v) x = normal(gen);
  out.emplace_back("gaussian", v);
  for (auto& x : v) x = unit(gen) * std::pow(10.0f, decades(gen));
  out.emplace_back("40 decades", v);
  for (size_t i = 0; i < n; ++i) v[i] = unit(gen) * (i % 3 ? 1e-39f : 1e-44f);
  out.emplace_back("subnormal", v);
  for (size_t i = 0; i < n; ++i) v[i] = i % 29 == 3 ? INFINITY : i % 31 == 7 ? -NAN : i % 37 == 1 ? -INFINITY : normal(gen);
  out.emplace_back("non-finite", v);
  for (size_t i = 0; i < n; ++i) v[i] = i % 2 ? -0.0f : 0.0f;
  out.emplace_back("zeros", v);
  return out;
}

TEST(Rotation, VectorKernelsAreTheScalarKernelBitForBit) {
  const PathGuard guard;
  if (vector_paths().empty()) GTEST_SKIP() << "this processor has no vector path";
  for (size_t n : {size_t(0), size_t(5), size_t(16), size_t(17), size_t(1000), size_t(4113)}) {
    for (const auto& [kind, v] : kinds(n)) {
      for (uint16_t signs : {uint16_t(0), uint16_t(0xFFFF), uint16_t(0x1234), rotation_signs(7)}) {
        for (bool forward : {true, false}) {
          const std::string what = kind + " n=" + std::to_string(n) + " signs=" + std::to_string(signs) +
                                   (forward ? " rotate" : " unrotate");
          auto on = [&](CpuPath path) {
            set_cpu_path(path);
            std::vector<float> out(n, 7.0f), in_place = v;
            if (forward) {
              rotate(v.data(), out.data(), n, signs);
              rotate(in_place.data(), in_place.data(), n, signs);
            } else {
              unrotate(v.data(), out.data(), n, signs);
              unrotate(in_place.data(), in_place.data(), n, signs);
            }
            return std::make_pair(out, in_place);
          };
          const auto want = on(CpuPath::kScalar);
          EXPECT_TRUE(same_values(want.first, want.second)) << "scalar in place " << what;
          for (size_t i = n / kRotationBlock * kRotationBlock; i < n; ++i) {
            EXPECT_TRUE(same_values(std::vector<float>{want.first[i]}, std::vector<float>{v[i]})) << "tail " << what;
          }
          for (CpuPath path : vector_paths()) {
            const auto got = on(path);
            EXPECT_TRUE(same_values(got.first, want.first)) << cpu_path_name(path) << " " << what;
            EXPECT_TRUE(same_values(got.second, want.first)) << cpu_path_name(path) << " in place " << what;
          }
        }
      }
    }
  }
}

// A block's first value alone comes out as ±1/4 in every lane, its signs H's first column's times D's: the
// kernels on every path compute H · D · x / 4, not just the same thing as each other.
TEST(Rotation, ABlocksSpikeSpreadsAsHadamardsColumn) {
  const PathGuard guard;
  const std::vector<CpuPath> paths = testing::all_paths();
  for (CpuPath path : paths) {
    set_cpu_path(path);
    for (size_t k = 0; k < kRotationBlock; ++k) {
      std::vector<float> x(kRotationBlock, 0.0f), y(kRotationBlock);
      x[k] = 1.0f;
      const uint16_t signs = 0x1234;
      rotate(x.data(), y.data(), x.size(), signs);
      for (size_t j = 0; j < kRotationBlock; ++j) {
        // H[j][k] = (-1)^popcount(j & k); D[k] = -1 where bit k of signs is set.
        const float want = ((__builtin_popcount(unsigned(j & k)) + (signs >> k & 1)) % 2 ? -0.25f : 0.25f);
        EXPECT_EQ(y[j], want) << cpu_path_name(path) << " spike at " << k << ", element " << j;
      }
    }
  }
}

}  // namespace
}  // namespace cnccl::compress

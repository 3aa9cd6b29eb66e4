// The CPU kernels of power-of-two frames (compress/codec.h): the 8-bit conversions against torch's
// own (c10::Float8_e4m3fn, c10::Float8_e5m2), amax, and the owner's sum of decoded frames against
// its definition computed here.
#include <c10/util/BFloat16.h>
#include <c10/util/Float8_e4m3fn.h>
#include <c10/util/Float8_e5m2.h>
#include <c10/util/Half.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#if defined(__x86_64__)
#include <xmmintrin.h>
#endif

#include "compress/codec.h"

namespace cnccl::compress {
namespace {

float float_of(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// torch's conversion, except where codec.h departs from it: e4m3 gives NaN (sign kept) past its largest
// value, where torch saturates at 448; 464 is the midpoint between 448 and the next binade.
uint8_t torch_fp8(float f, Wire w) {
  if (w == Wire::kE4m3 && std::fabs(f) > 464.0f) return std::signbit(f) ? 0xFF : 0x7F;
  return w == Wire::kE4m3 ? c10::Float8_e4m3fn(f).x : c10::Float8_e5m2(f).x;
}
float torch_widen8(uint8_t b, Wire w) {
  return w == Wire::kE4m3 ? float(c10::Float8_e4m3fn(b, c10::Float8_e4m3fn::from_bits()))
                          : float(c10::Float8_e5m2(b, c10::Float8_e5m2::from_bits()));
}
// The bits codec.h's tables give: torch's value, a NaN as 0x7FC00000 with the code's sign.
float fp8_table(uint8_t b, Wire w) {
  const float v = torch_widen8(b, w);
  if (!std::isnan(v)) return v;
  return float_of(b & 0x80 ? 0xFFC00000u : 0x7FC00000u);
}
float torch_widen16(uint16_t h, Wire w) {
  return w == Wire::kFp16 ? float(c10::Half(h, c10::Half::from_bits()))
                          : float(c10::BFloat16(h, c10::BFloat16::from_bits()));
}
bool same_value(float a, float b) { return (std::isnan(a) && std::isnan(b)) || a == b; }

std::vector<CpuPath> supported_paths() {
  std::vector<CpuPath> out;
  for (CpuPath p : kCpuPaths) {
    if (cpu_path_supported(p)) out.push_back(p);
  }
  return out;
}
const CpuPath best_path = cpu_path();

// Subnormals read as zero and results flushed to zero for its lifetime (torch.set_flush_denormal(True)
// sets the same bits): what a group's threads inherit from a caller that flushes.
class FlushDenormals {
 public:
#if defined(__x86_64__)
  FlushDenormals() : saved_(_mm_getcsr()) { _mm_setcsr(saved_ | 0x8040u); }
  ~FlushDenormals() { _mm_setcsr(saved_); }

 private:
  unsigned saved_;
#endif
};

class Fp8 : public ::testing::TestWithParam<Wire> {};

// Every rounding boundary: each code's value and the fp32 neighbours of the midpoints around it, then
// random bit patterns of every magnitude, signs, infinities and NaN.
TEST_P(Fp8, CastMatchesTorchAtEveryBoundaryAndOnRandomBits) {
  const Wire w = GetParam();
  std::vector<float> values = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, 1e30f, -1e30f, 1e-30f, 448.0f, 464.0f,
                               480.0f, 57344.0f, 61440.0f, 65536.0f};
  for (int code = 0; code < 255; ++code) {
    const float lo = torch_widen8(uint8_t(code), w), hi = torch_widen8(uint8_t(code + 1), w);
    if (!std::isfinite(lo) || !std::isfinite(hi) || (code & 0x80) != ((code + 1) & 0x80)) continue;
    const float mid = lo + (hi - lo) / 2;
    for (float v : {lo, mid, std::nextafter(mid, -INFINITY), std::nextafter(mid, INFINITY), hi}) values.push_back(v);
  }
  std::mt19937 gen(7);
  for (int i = 0; i < 1 << 20; ++i) values.push_back(float_of(gen()));
  for (CpuPath path : supported_paths()) {
    set_cpu_path(path);
    std::vector<uint8_t> got(values.size());
    cast(values.data(), got.data(), values.size(), 1.0f, w);
    for (size_t i = 0; i < values.size(); ++i) {
      uint32_t bits;
      std::memcpy(&bits, &values[i], sizeof bits);
      ASSERT_EQ(int(got[i]), int(torch_fp8(values[i], w)))
          << cpu_path_name(path) << ": value " << values[i] << " (bits " << std::hex << bits << ")";
    }
  }
  set_cpu_path(best_path);
}

TEST_P(Fp8, CastScalesFirstAndFp64GoesThroughFp32) {
  const Wire w = GetParam();
  std::mt19937 gen(3);
  std::normal_distribution<double> normal;
  std::vector<double> wide(4099);
  for (auto& v : wide) v = normal(gen) * 7;
  std::vector<float> narrow(wide.begin(), wide.end());
  std::vector<uint8_t> from_f32(wide.size()), from_f64(wide.size());
  const float scale = 0.37f;
  for (CpuPath path : supported_paths()) {
    set_cpu_path(path);
    cast(narrow.data(), from_f32.data(), narrow.size(), scale, w);
    cast(wide.data(), from_f64.data(), wide.size(), scale, w);
    for (size_t i = 0; i < wide.size(); ++i) {
      ASSERT_EQ(from_f32[i], torch_fp8(narrow[i] * scale, w)) << cpu_path_name(path) << " " << i;
      ASSERT_EQ(from_f64[i], torch_fp8(float(wide[i] * double(scale)), w)) << i;
    }
  }
  set_cpu_path(best_path);
}

TEST_P(Fp8, RestoreEveryCode) {
  const Wire w = GetParam();
  std::vector<uint8_t> codes(256);
  for (int c = 0; c < 256; ++c) codes[c] = uint8_t(c);
  for (CpuPath path : supported_paths()) {
    set_cpu_path(path);
    std::vector<float> f(256);
    std::vector<double> d(256);
    restore(codes.data(), f.data(), 256, 0.25f, w);
    restore(codes.data(), d.data(), 256, 3.0f, w);
    for (int c = 0; c < 256; ++c) {
      const float v = torch_widen8(uint8_t(c), w);
      EXPECT_TRUE(same_value(f[c], v * 0.25f)) << cpu_path_name(path) << " " << c << ": " << f[c] << " vs " << v;
      EXPECT_TRUE(same_value(float(d[c]), float(double(v) * 3.0))) << c;
    }
    // NaN codes too give the scalar table's bits (NaN 0x7FC00000, its sign kept), on every path and
    // whatever the thread's denormal setting (the subnormal codes still decode; the products here
    // stay normal).
    std::vector<float> flushed(256);
    {
      const FlushDenormals flush;
      restore(codes.data(), flushed.data(), 256, 0.25f, w);
    }
    for (int c = 0; c < 256; ++c) {
      const float want = fp8_table(uint8_t(c), w) * 0.25f;
      EXPECT_EQ(std::memcmp(&f[c], &want, 4), 0) << cpu_path_name(path) << " code " << c << ": " << f[c];
      EXPECT_EQ(std::memcmp(&flushed[c], &want, 4), 0) << cpu_path_name(path) << " flushing, code " << c;
    }
    // An output large enough for streaming stores (8 MiB and up), starting off a 32-byte boundary, with
    // a tail: every element as the small case gives it.
    const size_t n = (size_t(8) << 20) / sizeof(float) + 37;
    std::vector<uint8_t> many(n);
    for (size_t i = 0; i < n; ++i) many[i] = uint8_t(i * 131 + 7);
    std::vector<float> out(n + 3);
    restore(many.data(), out.data() + 3, n, 0.25f, w);
    size_t wrong = 0;
    for (size_t i = 0; i < n; ++i) wrong += !same_value(out[i + 3], f[many[i]]);
    EXPECT_EQ(wrong, 0u) << cpu_path_name(path) << ": streaming restore";
  }
  set_cpu_path(best_path);
}

INSTANTIATE_TEST_SUITE_P(Wires, Fp8, ::testing::Values(Wire::kE4m3, Wire::kE5m2),
                         [](const auto& info) { return std::string(wire_name(info.param)); });

TEST(Frames, AmaxIsTheLargestMagnitudeAndNaNWins) {
  for (CpuPath path : supported_paths()) {
    set_cpu_path(path);
    for (size_t n : {3, 8, 19}) {  // the tail alone, one vector, vectors and a tail
      std::vector<float> x(n, 1.0f);
      x[n / 2] = -7.5f;
      EXPECT_EQ(amax(x.data(), x.size()), 7.5f) << cpu_path_name(path) << " n=" << n;
      x[n - 1] = INFINITY;
      EXPECT_EQ(amax(x.data(), x.size()), INFINITY) << cpu_path_name(path);
      x[0] = -NAN;
      EXPECT_TRUE(std::isnan(amax(x.data(), x.size()))) << cpu_path_name(path) << " n=" << n;
    }
    std::vector<float> none;
    EXPECT_EQ(amax(none.data(), 0), 0.0f);
  }
  set_cpu_path(best_path);
  std::vector<double> y = {-1e300, 2.0};
  EXPECT_EQ(amax(y.data(), y.size()), 1e300);
}

// The definition: each rank's value widened and multiplied by its scale (rounded in fp32), the
// products added in rank order, over block boundaries and odd lengths.
TEST(Frames, ScaledSumDecodesEachFrameAndAddsInRankOrder) {
  std::mt19937 gen(11);
  for (Wire w : {Wire::kFp16, Wire::kBf16, Wire::kE4m3, Wire::kE5m2}) {
    for (size_t k : {1, 2, 5}) {
      for (size_t n : {0, 1, 2048, 2049, 5003}) {
        std::vector<std::vector<uint8_t>> bytes(k, std::vector<uint8_t>(n * wire_bytes(w)));
        std::vector<const void*> in;
        std::vector<float> scales;
        for (size_t r = 0; r < k; ++r) {
          for (auto& b : bytes[r]) b = uint8_t(gen() & 0xFB);  // finite codes of every format, either sign
          in.push_back(bytes[r].data());
          scales.push_back(std::ldexp(1.0f, int(gen() % 40) - 20));
        }
        std::vector<std::vector<float>> results;
        for (CpuPath path : supported_paths()) {
          set_cpu_path(path);
          results.emplace_back(n, NAN);
          scaled_sum(in.data(), scales.data(), k, results.back().data(), n, w);
          const FlushDenormals flush;
          results.emplace_back(n, NAN);
          scaled_sum(in.data(), scales.data(), k, results.back().data(), n, w);
        }
        set_cpu_path(best_path);
        for (size_t i = 0; i < n; ++i) {
          float want = 0;
          for (size_t r = 0; r < k; ++r) {
            float v;
            if (wire_bytes(w) == 1) {
              v = torch_widen8(bytes[r][i], w);
            } else {
              uint16_t h;
              std::memcpy(&h, bytes[r].data() + 2 * i, 2);
              v = torch_widen16(h, w);
            }
            const float term = v * scales[r];
            want = r == 0 ? term : want + term;
          }
          // On a thread that flushes too: the kernels keep subnormals for their call whatever the caller's
          // FTZ/DAZ, and `want` is computed here, with flushing off.
          for (size_t j = 0; j < results.size(); ++j) {
            ASSERT_TRUE(same_value(results[j][i], want))
                << wire_name(w) << " k=" << k << " n=" << n << " i=" << i << " path " << j / 2 << (j % 2 ? " flushing" : "");
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace cnccl::compress

// Codec tests: every CPU path against torch's own scalar conversions (c10::Half / c10::BFloat16).
// This file is built without -mf16c, so c10's reference is its portable software conversion.
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "compress/codec.h"

namespace cnccl::compress {
namespace {

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

uint16_t oracle_narrow(float f, Wire w) {
  return w == Wire::kFp16 ? c10::Half(f).x : c10::BFloat16(f).x;
}
float oracle_widen(uint16_t h, Wire w) {
  return w == Wire::kFp16 ? float(c10::Half(h, c10::Half::from_bits())) : float(c10::BFloat16(h, c10::BFloat16::from_bits()));
}
bool is_nan16(uint16_t h, Wire w) {
  return w == Wire::kFp16 ? ((h & 0x7C00) == 0x7C00 && (h & 0x3FF)) : ((h & 0x7F80) == 0x7F80 && (h & 0x7F));
}

// Counts elements whose 16-bit result differs from the oracle (NaN only has to stay NaN).
size_t narrow_mismatches(const std::vector<float>& in, float scale, Wire w) {
  std::vector<uint16_t> out(in.size());
  cast(in.data(), out.data(), in.size(), scale, w);
  size_t bad = 0;
  for (size_t i = 0; i < in.size(); ++i) {
    const uint16_t want = oracle_narrow(in[i] * scale, w);
    const bool ok = is_nan16(want, w) ? is_nan16(out[i], w) : out[i] == want;
    if (!ok && bad++ < 5) {
      ADD_FAILURE() << wire_name(w) << " cast of " << std::hexfloat << in[i] << " * " << scale << ": got 0x"
                    << std::hex << out[i] << " want 0x" << want;
    }
  }
  return bad;
}

// Runs each test once per CPU path the processor supports.
class Codec : public ::testing::TestWithParam<CpuPath> {
 protected:
  void SetUp() override {
    if (!cpu_path_supported(GetParam())) {
      GTEST_SKIP() << "this processor lacks " << cpu_path_name(GetParam());
    }
    saved_ = cpu_path();
    set_cpu_path(GetParam());
  }
  void TearDown() override { set_cpu_path(saved_); }
  CpuPath saved_ = CpuPath::kScalar;
};

TEST_P(Codec, RestoreEveryBitPattern) {
  for (Wire w : {Wire::kFp16, Wire::kBf16}) {
    std::vector<uint16_t> all(65536);
    for (uint32_t i = 0; i < 65536; ++i) all[i] = static_cast<uint16_t>(i);
    std::vector<float> f32(all.size());
    std::vector<double> f64(all.size());
    restore(all.data(), f32.data(), all.size(), 1.0f, w);
    restore(all.data(), f64.data(), all.size(), 1.0f, w);
    size_t bad = 0;
    for (size_t i = 0; i < all.size(); ++i) {
      const float want = oracle_widen(all[i], w);
      if (std::isnan(want)) {
        bad += !std::isnan(f32[i]) + !std::isnan(f64[i]);
      } else {
        bad += (bits(f32[i]) != bits(want)) + (f64[i] != static_cast<double>(want));
      }
    }
    EXPECT_EQ(bad, 0u) << wire_name(w);
  }
}

TEST_P(Codec, RestoreAppliesPostScale) {
  for (Wire w : {Wire::kFp16, Wire::kBf16}) {
    std::vector<uint16_t> all(65536);
    for (uint32_t i = 0; i < 65536; ++i) all[i] = static_cast<uint16_t>(i);
    for (float scale : {0.25f, 3.0f, 1.0f / 3.0f}) {
      std::vector<float> f32(all.size());
      std::vector<double> f64(all.size());
      restore(all.data(), f32.data(), all.size(), scale, w);
      restore(all.data(), f64.data(), all.size(), scale, w);
      size_t bad = 0;
      for (size_t i = 0; i < all.size(); ++i) {
        const float wide = oracle_widen(all[i], w);
        if (std::isnan(wide)) continue;
        bad += bits(f32[i]) != bits(wide * scale);
        bad += f64[i] != static_cast<double>(wide) * static_cast<double>(scale);
      }
      EXPECT_EQ(bad, 0u) << wire_name(w) << " scale " << scale;
    }
  }
}

// Every fp32 value within a few ulps of each 16-bit value and of each rounding midpoint.
std::vector<float> boundary_values(Wire w) {
  std::vector<float> v;
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float lo = oracle_widen(static_cast<uint16_t>(h), w);
    if (!std::isfinite(lo)) continue;
    const uint32_t next = (h & 0x7FFF) == (w == Wire::kFp16 ? 0x7BFFu : 0x7F7Fu) ? 0 : h + 1;
    const uint32_t centers[2] = {bits(lo), next ? (bits(lo) + bits(oracle_widen(static_cast<uint16_t>(next), w))) / 2
                                                : bits(lo) + (w == Wire::kFp16 ? 0x1000u : 0x8000u)};
    for (uint32_t c : centers) {
      for (int d = -4; d <= 4; ++d) v.push_back(from_bits(c + static_cast<uint32_t>(d)));
    }
  }
  for (float x : {65504.0f, 65519.99f, 65520.0f, 65536.0f, 1e30f, INFINITY, -INFINITY, NAN, -NAN, 0x1p-25f,
                  0x1p-24f, 0x1.8p-25f, 0x1p-14f, 0x1.ffcp-15f}) {
    v.push_back(x);
    v.push_back(-x);
  }
  return v;
}

TEST_P(Codec, CastBoundariesMatchTorch) {
  for (Wire w : {Wire::kFp16, Wire::kBf16}) {
    const std::vector<float> v = boundary_values(w);
    EXPECT_EQ(narrow_mismatches(v, 1.0f, w), 0u) << wire_name(w) << " over " << v.size() << " values";
  }
}

TEST_P(Codec, CastRandomValuesMatchTorch) {
  // 10^8 values per wire format: half uniform over all fp32 bit patterns, half in the 16-bit range.
  // The sanitizer run (.ci/sanitize.sh), after ctest ran all of them, checks 4 chunks: enough to reach
  // every branch of the cast, at a twentieth of the time its instrumentation multiplies.
  constexpr size_t kChunk = 1 << 20;
  const size_t kChunks = std::getenv("CNCCL_TEST_REDUCED_SWEEPS") ? 4 : 96;
  std::mt19937_64 rng(1234 + static_cast<int>(GetParam()));
  std::uniform_real_distribution<float> near(-70000.0f, 70000.0f);
  std::vector<float> v(kChunk);
  for (Wire w : {Wire::kFp16, Wire::kBf16}) {
    size_t bad = 0;
    for (size_t c = 0; c < kChunks && bad == 0; ++c) {
      for (size_t i = 0; i < kChunk; ++i) v[i] = (i & 1) ? near(rng) * std::ldexp(1.0f, -int(rng() % 40)) : from_bits(uint32_t(rng()));
      bad += narrow_mismatches(v, 1.0f, w);
    }
    EXPECT_EQ(bad, 0u) << wire_name(w);
  }
}

TEST_P(Codec, CastAppliesScaleBeforeRounding) {
  std::mt19937 rng(7);
  std::normal_distribution<float> dist(0.0f, 3000.0f);
  std::vector<float> v(100003);
  for (auto& x : v) x = dist(rng);
  v[0] = 131000.0f;  // overflows fp16 alone, fits after the 1/4 pre-scale
  for (Wire w : {Wire::kFp16, Wire::kBf16}) {
    for (float scale : {0.25f, 1.0f / 3.0f, 1e-3f, 65536.0f, 0.0f, -2.0f}) {
      EXPECT_EQ(narrow_mismatches(v, scale, w), 0u) << wire_name(w) << " scale " << scale;
    }
  }
  std::vector<uint16_t> out(1);
  cast(v.data(), out.data(), 1, 0.25f, Wire::kFp16);
  EXPECT_EQ(out[0], c10::Half(32750.0f).x);
}

TEST_P(Codec, CastFp64GoesThroughFp32LikeTorch) {
  std::mt19937_64 rng(11);
  std::uniform_real_distribution<double> dist(-1e5, 1e5);
  std::vector<double> v(1 << 16);
  for (auto& x : v) x = dist(rng) * std::ldexp(1.0, -int(rng() % 30));
  v[1] = 1.0 + 0x1p-11 + 0x1p-40;  // a double just above an fp16 tie
  for (Wire w : {Wire::kFp16, Wire::kBf16}) {
    for (float scale : {1.0f, 0.125f, 1.0f / 3.0f}) {
      std::vector<uint16_t> out(v.size());
      cast(v.data(), out.data(), v.size(), scale, w);
      size_t bad = 0;
      for (size_t i = 0; i < v.size(); ++i) bad += out[i] != oracle_narrow(static_cast<float>(v[i] * double(scale)), w);
      EXPECT_EQ(bad, 0u) << wire_name(w) << " scale " << scale;
    }
  }
}

TEST_P(Codec, LengthsAndUnalignedPointers) {
  for (size_t n : {size_t(0), size_t(1), size_t(7), size_t(31), size_t(1) << 20 | 3}) {
    for (size_t offset : {0, 1, 3}) {
      std::vector<float> src(n + offset + 1, 9.0f);
      std::vector<uint16_t> wire(n + offset + 1, 0xABCD);
      std::vector<float> back(n + offset + 1, -7.0f);
      for (size_t i = 0; i < n; ++i) src[offset + i] = static_cast<float>(i % 2049) - 1024.5f;
      for (Wire w : {Wire::kFp16, Wire::kBf16}) {
        cast(src.data() + offset, wire.data() + offset, n, 1.0f, w);
        restore(wire.data() + offset, back.data() + offset, n, 1.0f, w);
        size_t bad = 0;
        for (size_t i = 0; i < n; ++i) {
          bad += wire[offset + i] != oracle_narrow(src[offset + i], w);
          bad += back[offset + i] != oracle_widen(wire[offset + i], w);
        }
        EXPECT_EQ(bad, 0u) << "n=" << n << " offset=" << offset;
        EXPECT_EQ(wire[offset + n], 0xABCD) << "wrote past the end, n=" << n;
        EXPECT_EQ(back[offset + n], -7.0f) << "wrote past the end, n=" << n;
        if (offset) {
          EXPECT_EQ(wire[offset - 1], 0xABCD);
          EXPECT_EQ(back[offset - 1], -7.0f);
        }
      }
    }
  }
}

TEST_P(Codec, AddRoundsOnceLikeTorch) {
  std::mt19937 rng(3);
  for (Wire w : {Wire::kFp16, Wire::kBf16}) {
    for (size_t n : {size_t(0), size_t(1), size_t(15), size_t(17), size_t(1) << 18}) {
      std::vector<uint16_t> a(n), b(n);
      for (size_t i = 0; i < n; ++i) {
        a[i] = static_cast<uint16_t>(rng());
        b[i] = static_cast<uint16_t>(rng());
      }
      std::vector<uint16_t> acc = a;
      add(acc.data(), b.data(), n, w);
      size_t bad = 0;
      for (size_t i = 0; i < n; ++i) {
        const uint16_t want = oracle_narrow(oracle_widen(a[i], w) + oracle_widen(b[i], w), w);
        bad += is_nan16(want, w) ? !is_nan16(acc[i], w) : acc[i] != want;
      }
      EXPECT_EQ(bad, 0u) << wire_name(w) << " n=" << n;
    }
  }
}

TEST_P(Codec, SumAddsInFp32InOrderAndRoundsOnce) {
  std::mt19937 rng(4);
  for (Wire w : {Wire::kFp16, Wire::kBf16}) {
    for (size_t k : {size_t(1), size_t(2), size_t(3), size_t(5)}) {
      for (size_t n : {size_t(0), size_t(1), size_t(15), size_t(17), size_t(1) << 18 | 3}) {
        std::vector<std::vector<uint16_t>> in(k, std::vector<uint16_t>(n));
        std::vector<const uint16_t*> ptrs;
        for (auto& v : in) {
          for (auto& x : v) x = static_cast<uint16_t>(rng());
          ptrs.push_back(v.data());
        }
        std::vector<uint16_t> out(n);
        sum(ptrs.data(), k, out.data(), n, w);
        size_t bad = 0;
        for (size_t i = 0; i < n; ++i) {
          float acc = oracle_widen(in[0][i], w);
          for (size_t j = 1; j < k; ++j) acc += oracle_widen(in[j][i], w);
          const uint16_t want = oracle_narrow(acc, w);
          bad += is_nan16(want, w) ? !is_nan16(out[i], w) : out[i] != want;
        }
        EXPECT_EQ(bad, 0u) << wire_name(w) << " k=" << k << " n=" << n;
        if (k == 2) {  // two inputs: the same bits as add(), one rounding either way (NaN stays NaN)
          std::vector<uint16_t> acc = in[0];
          add(acc.data(), in[1].data(), n, w);
          size_t differ = 0;
          for (size_t i = 0; i < n; ++i) differ += is_nan16(acc[i], w) ? !is_nan16(out[i], w) : acc[i] != out[i];
          EXPECT_EQ(differ, 0u) << wire_name(w) << " n=" << n;
        }
      }
    }
  }
}

TEST_P(Codec, WideSumIsTheFp32SumInOrderUnrounded) {
  std::mt19937 rng(6);
  for (Wire w : {Wire::kFp16, Wire::kBf16}) {
    for (size_t k : {size_t(1), size_t(3), size_t(4)}) {
      for (size_t n : {size_t(0), size_t(7), size_t(9), size_t(1) << 16 | 3}) {
        std::vector<std::vector<uint16_t>> in(k, std::vector<uint16_t>(n));
        std::vector<const uint16_t*> ptrs;
        for (auto& v : in) {
          for (auto& x : v) x = static_cast<uint16_t>(rng());
          ptrs.push_back(v.data());
        }
        std::vector<float> out(n);
        sum(ptrs.data(), k, out.data(), n, w);
        size_t bad = 0;
        for (size_t i = 0; i < n; ++i) {
          float acc = oracle_widen(in[0][i], w);
          for (size_t j = 1; j < k; ++j) acc += oracle_widen(in[j][i], w);
          bad += std::isnan(acc) ? !std::isnan(out[i]) : bits(out[i]) != bits(acc);
        }
        EXPECT_EQ(bad, 0u) << wire_name(w) << " k=" << k << " n=" << n;
      }
    }
  }
}

TEST_P(Codec, CastAddEqualsCastThenAdd) {
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> uniform(-70000.0f, 70000.0f);
  for (Wire w : {Wire::kFp16, Wire::kBf16}) {
    for (size_t n : {size_t(0), size_t(1), size_t(15), size_t(17), size_t(1) << 18 | 5}) {
      std::vector<float> src(n);
      std::vector<uint16_t> in(n);
      for (size_t i = 0; i < n; ++i) {
        const uint32_t bits = rng();
        float f;
        std::memcpy(&f, &bits, 4);
        src[i] = i % 2 ? f : uniform(rng);  // half arbitrary bit patterns (inf, NaN, subnormals), half in range
        in[i] = static_cast<uint16_t>(rng());
      }
      for (float scale : {1.0f, 0.25f, 0.37f}) {
        std::vector<uint16_t> want(n), got(n, 0xABCD);
        cast(src.data(), want.data(), n, scale, w);
        add(want.data(), in.data(), n, w);
        cast_add(src.data(), in.data(), got.data(), n, scale, w);
        size_t bad = 0;
        for (size_t i = 0; i < n; ++i) bad += is_nan16(want[i], w) ? !is_nan16(got[i], w) : got[i] != want[i];
        EXPECT_EQ(bad, 0u) << wire_name(w) << " n=" << n << " scale=" << scale;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(CpuPaths, Codec, ::testing::ValuesIn(kCpuPaths), [](const auto& info) {
  switch (info.param) {
    case CpuPath::kAvx512: return std::string("Avx512");
    case CpuPath::kAvx2F16c: return std::string("Avx2F16c");
    case CpuPath::kScalar: break;
  }
  return std::string("Scalar");
});

// The widest path the processor has is the default; the others are refused by name.
TEST(CodecDispatch, PicksFastestSupportedPathAndRejectsUnsupported) {
  const CpuPath widest = cpu_path_supported(CpuPath::kAvx512)     ? CpuPath::kAvx512
                         : cpu_path_supported(CpuPath::kAvx2F16c) ? CpuPath::kAvx2F16c
                                                                  : CpuPath::kScalar;
  EXPECT_EQ(cpu_path(), widest) << cpu_path_name(cpu_path());
  for (CpuPath path : kCpuPaths) {
    if (!cpu_path_supported(path)) EXPECT_THROW(set_cpu_path(path), std::invalid_argument) << cpu_path_name(path);
  }
}

}  // namespace
}  // namespace cnccl::compress

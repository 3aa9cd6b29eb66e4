// The CPU kernels of power-of-two frames (codec.h): the 8-bit formats' conversions, amax, and the
// owner's sum of decoded frames. The scalar ones; cpu/avx2.cpp has vector forms of amax and of the
// fp32 -> 8-bit cast. The 16-bit casts and restores of frames are the codec's own.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "compress/cpu/kernels.h"
#include "compress/formats.h"

namespace cnccl::compress {
namespace {

using detail::bits_of;
using detail::float_of;

using formats::Fp8;

// The 256 values of an 8-bit format, exactly.
struct Table {
  float value[256];
  explicit Table(const Fp8& fp8) {
    for (uint32_t code = 0; code < 256; ++code) value[code] = formats::fp8_value(uint8_t(code), fp8);
  }
};

// out = widen(in[first..first+n)) * scale, by the scalar kernels.
void decode(const void* in, size_t first, float* out, size_t n, float scale, Wire wire) {
  if (wire_bytes(wire) == 2) {
    return detail::scalar_kernels().restore_f32(static_cast<const uint16_t*>(in) + first, out, n, scale, wire);
  }
  detail::scalar_restore8_f32(static_cast<const uint8_t*>(in) + first, out, n, scale, wire);
}

}  // namespace

namespace detail {

uint8_t to_fp8(float f, Wire w) { return formats::fp8_code(f, formats::fp8_format(w)); }

const float* fp8_values(Wire w) {
  static const Table e4m3(formats::fp8_format(Wire::kE4m3)), e5m2(formats::fp8_format(Wire::kE5m2));
  return (w == Wire::kE4m3 ? e4m3 : e5m2).value;
}

float scalar_amax_f32(const float* src, size_t n) {
  uint32_t bits = 0;
  for (size_t i = 0; i < n; ++i) bits = std::max(bits, bits_of(src[i]) & 0x7FFFFFFFu);
  return amax_of_bits(bits);
}

void scalar_cast8_f32(const float* src, uint8_t* dst, size_t n, float scale, Wire w) {
  const Fp8 fp8 = formats::fp8_format(w);
  for (size_t i = 0; i < n; ++i) dst[i] = formats::fp8_code(src[i] * scale, fp8);
}

void scalar_restore8_f32(const uint8_t* src, float* dst, size_t n, float scale, Wire w) {
  const float* value = fp8_values(w);
  for (size_t i = 0; i < n; ++i) dst[i] = value[src[i]] * scale;
}

void scalar_scaled_sum_f32(const void* const* in, const float* scales, size_t k, float* dst, size_t n, Wire wire) {
  // Block by block, so that the running sum stays in cache while every rank's values are added.
  constexpr size_t kBlock = 2048;
  float decoded[kBlock];
  for (size_t first = 0; first < n; first += kBlock) {
    const size_t m = n - first < kBlock ? n - first : kBlock;
    float* acc = dst + first;
    for (size_t r = 0; r < k; ++r) {
      decode(in[r], first, r == 0 ? acc : decoded, m, scales[r], wire);
      if (r == 0) continue;
      for (size_t i = 0; i < m; ++i) acc[i] += decoded[i];
    }
  }
}

}  // namespace detail

double amax(const double* src, size_t n) {
  uint64_t bits = 0;
  for (size_t i = 0; i < n; ++i) {
    uint64_t x;
    std::memcpy(&x, src + i, sizeof x);
    bits = std::max<uint64_t>(bits, x & 0x7FFFFFFFFFFFFFFFull);
  }
  if (bits > 0x7FF0000000000000ull) return NAN;
  double d;
  std::memcpy(&d, &bits, sizeof d);
  return d;
}

void cast(const double* src, uint8_t* dst, size_t n, float scale, Wire wire) {
  const GradualUnderflow exact;
  const Fp8 fp8 = formats::fp8_format(wire);
  const double s = scale;
  for (size_t i = 0; i < n; ++i) dst[i] = formats::fp8_code(static_cast<float>(src[i] * s), fp8);
  const detail::CensusSink& sink = detail::census_sink();
  if (!sink.census || !sink.stride) return;
  const float* value = detail::fp8_values(wire);
  for (size_t i = 0; i < n; i += sink.stride) {
    detail::sample(static_cast<float>(src[i] * s), value[dst[i]], *sink.census);
  }
}

void restore(const uint8_t* src, double* dst, size_t n, float scale, Wire wire) {
  const GradualUnderflow exact;
  const float* value = detail::fp8_values(wire);
  const double s = scale;
  for (size_t i = 0; i < n; ++i) dst[i] = static_cast<double>(value[src[i]]) * s;
}

void scaled_sum(const void* const* in, const float* scales, size_t k, float* dst, size_t n, Wire wire) {
  const GradualUnderflow exact;
  detail::active_kernels().scaled_sum_f32(in, scales, k, dst, n, wire);
}

}  // namespace cnccl::compress

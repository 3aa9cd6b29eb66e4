// Portable reference kernels: the fallback on processors without AVX2/F16C, and the tail loop
// of the vector kernels. Conversions follow IEEE round-to-nearest-even exactly.
#include <cstring>

#include "compress/cpu/kernels.h"

namespace cnccl::compress::detail {

uint16_t f32_to_fp16(float f) {
  const uint32_t x = bits_of(f);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  uint32_t ax = x & 0x7FFFFFFFu;
  if (ax > 0x7F800000u) return sign | 0x7E00u;  // NaN: canonical quiet NaN, as torch's software path
  if (ax >= 0x477FF000u) return sign | 0x7C00u;  // at or past the tie above 65504: inf
  if (ax < 0x38800000u) {
    // Subnormal range: adding 0.5 makes the fp32 adder round at the fp16 subnormal step (2^-24).
    const float shifted = float_of(ax) + 0.5f;
    return sign | static_cast<uint16_t>(bits_of(shifted) - 0x3F000000u);
  }
  const uint32_t mantissa_odd = (ax >> 13) & 1u;
  ax += 0xC8000FFFu + mantissa_odd;  // rebias the exponent by -112 and round half to even
  return sign | static_cast<uint16_t>(ax >> 13);
}

uint16_t f32_to_bf16(float f) {
  if (f != f) return 0x7FC0u;  // torch maps every NaN to this one pattern
  const uint32_t x = bits_of(f);
  return static_cast<uint16_t>((x + 0x7FFFu + ((x >> 16) & 1u)) >> 16);
}

float fp16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1Fu;
  const uint32_t mantissa = h & 0x3FFu;
  if (exponent == 0x1Fu) return float_of(sign | 0x7F800000u | (mantissa << 13));
  if (exponent == 0) {
    return float_of(sign | bits_of(static_cast<float>(mantissa) * 0x1p-24f));
  }
  return float_of(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

float bf16_to_f32(uint16_t h) { return float_of(static_cast<uint32_t>(h) << 16); }

namespace {

void cast_f32(const float* src, uint16_t* dst, size_t n, float scale, Wire w, Census* census) {
  if (!census) {
    for (size_t i = 0; i < n; ++i) dst[i] = to_wire(src[i] * scale, w);
    return;
  }
  const float limit = overflow_limit(w);
  for (size_t i = 0; i < n; ++i) {
    const float v = src[i] * scale;
    tally(v, limit, *census);
    dst[i] = to_wire(v, w);
  }
}

void cast_f64(const double* src, uint16_t* dst, size_t n, float scale, Wire w, Census* census) {
  const double s = scale;
  const float limit = overflow_limit(w);
  for (size_t i = 0; i < n; ++i) {
    const float v = static_cast<float>(src[i] * s);
    if (census) tally(v, limit, *census);
    dst[i] = to_wire(v, w);
  }
}

void restore_f32(const uint16_t* src, float* dst, size_t n, float scale, Wire w) {
  for (size_t i = 0; i < n; ++i) dst[i] = from_wire(src[i], w) * scale;
}

void restore_f64(const uint16_t* src, double* dst, size_t n, float scale, Wire w) {
  const double s = scale;
  for (size_t i = 0; i < n; ++i) dst[i] = static_cast<double>(from_wire(src[i], w)) * s;
}

void add(uint16_t* acc, const uint16_t* in, size_t n, Wire w) {
  for (size_t i = 0; i < n; ++i) acc[i] = to_wire(from_wire(acc[i], w) + from_wire(in[i], w), w);
}

void cast_add_f32(const float* src, const uint16_t* in, uint16_t* acc, size_t n, float scale, Wire w,
                  Census* census) {
  const float limit = overflow_limit(w);
  for (size_t i = 0; i < n; ++i) {
    const float v = src[i] * scale;
    if (census) tally(v, limit, *census);
    acc[i] = to_wire(from_wire(to_wire(v, w), w) + from_wire(in[i], w), w);
  }
}

void sum(const uint16_t* const* in, size_t k, uint16_t* dst, size_t n, Wire w) {
  for (size_t i = 0; i < n; ++i) {
    float s = from_wire(in[0][i], w);
    for (size_t j = 1; j < k; ++j) s += from_wire(in[j][i], w);
    dst[i] = to_wire(s, w);
  }
}

void sum_f32(const uint16_t* const* in, size_t k, float* dst, size_t n, Wire w) {
  for (size_t i = 0; i < n; ++i) {
    float s = from_wire(in[0][i], w);
    for (size_t j = 1; j < k; ++j) s += from_wire(in[j][i], w);
    dst[i] = s;
  }
}

}  // namespace

const CpuKernels& scalar_kernels() {
  static const CpuKernels kernels{cast_f32, cast_f64, restore_f32, restore_f64, add,
                                  cast_add_f32, sum, sum_f32, scalar_amax_f32, scalar_cast8_f32,
                                  scalar_restore8_f32, scalar_scaled_sum_f32, scalar_mx_encode_f32,
                                  scalar_mx_decode, scalar_mx_sum, scalar_nv_encode_f32, scalar_nv_decode,
                                  scalar_nv_sum, scalar_rotate_f32};
  return kernels;
}

}  // namespace cnccl::compress::detail

// Internal: one table of CPU kernels per instruction-set level, chosen by cpu_dispatch.cpp.
#pragma once

#include <cstring>

#include "compress/codec.h"

namespace cnccl::compress::detail {

struct CpuKernels {
  void (*cast_f32)(const float*, uint16_t*, size_t, float, Wire);
  void (*cast_f64)(const double*, uint16_t*, size_t, float, Wire);
  void (*restore_f32)(const uint16_t*, float*, size_t, float, Wire);
  void (*restore_f64)(const uint16_t*, double*, size_t, float, Wire);
  void (*add)(uint16_t*, const uint16_t*, size_t, Wire);
  void (*cast_add_f32)(const float*, const uint16_t*, uint16_t*, size_t, float, Wire);
  void (*sum)(const uint16_t* const*, size_t, uint16_t*, size_t, Wire);
  void (*sum_f32)(const uint16_t* const*, size_t, float*, size_t, Wire);
  // Power-of-two frames (cpu_frames.cpp).
  float (*amax_f32)(const float*, size_t);
  void (*cast8_f32)(const float*, uint8_t*, size_t, float, Wire);
  void (*restore8_f32)(const uint8_t*, float*, size_t, float, Wire);
};

const CpuKernels& scalar_kernels();
const CpuKernels* avx2_f16c_kernels();  // nullptr when not compiled for x86-64

inline uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

inline float float_of(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// Scalar conversions shared by the vector kernels' tails.
uint16_t f32_to_fp16(float f);
uint16_t f32_to_bf16(float f);
float fp16_to_f32(uint16_t h);
float bf16_to_f32(uint16_t h);

// The scalar frame kernels (cpu_frames.cpp), also the vector kernels' tails.
float scalar_amax_f32(const float* src, size_t n);
void scalar_cast8_f32(const float* src, uint8_t* dst, size_t n, float scale, Wire w);
void scalar_restore8_f32(const uint8_t* src, float* dst, size_t n, float scale, Wire w);
// The 256 values of an 8-bit format, exactly.
const float* fp8_values(Wire w);
uint8_t to_fp8(float f, Wire w);
// Largest |x| as the bits of a non-negative float: any NaN's bits exceed infinity's.
inline float amax_of_bits(uint32_t bits) { return bits > 0x7F800000u ? __builtin_nanf("") : float_of(bits); }

inline uint16_t to_wire(float f, Wire w) { return w == Wire::kFp16 ? f32_to_fp16(f) : f32_to_bf16(f); }
inline float from_wire(uint16_t h, Wire w) { return w == Wire::kFp16 ? fp16_to_f32(h) : bf16_to_f32(h); }

}  // namespace cnccl::compress::detail

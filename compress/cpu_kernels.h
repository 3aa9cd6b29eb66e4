// Internal: one table of CPU kernels per instruction-set level, chosen by cpu_dispatch.cpp.
#pragma once

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
};

const CpuKernels& scalar_kernels();
const CpuKernels* avx2_f16c_kernels();  // nullptr when not compiled for x86-64

// Scalar conversions shared by the vector kernels' tails.
uint16_t f32_to_fp16(float f);
uint16_t f32_to_bf16(float f);
float fp16_to_f32(uint16_t h);
float bf16_to_f32(uint16_t h);

inline uint16_t to_wire(float f, Wire w) { return w == Wire::kFp16 ? f32_to_fp16(f) : f32_to_bf16(f); }
inline float from_wire(uint16_t h, Wire w) { return w == Wire::kFp16 ? fp16_to_f32(h) : bf16_to_f32(h); }

}  // namespace cnccl::compress::detail

// CUDA codec kernels. Each thread handles four elements with vector loads when the pointers
// allow it (float4 in, 8-byte out), otherwise one; a grid-stride loop covers any length.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "compress/cuda/codec.h"
#include "compress/cuda/launch.h"

namespace cnccl::compress::cuda {
namespace {

__device__ __forceinline__ uint16_t narrow(float v, Wire w) {
  return w == Wire::kFp16 ? __half_as_ushort(__float2half_rn(v)) : __bfloat16_as_ushort(__float2bfloat16_rn(v));
}

__device__ __forceinline__ float widen(uint16_t h, Wire w) {
  return w == Wire::kFp16 ? __half2float(__ushort_as_half(h)) : __bfloat162float(__ushort_as_bfloat16(h));
}

// fp64 goes through fp32 before the 16-bit rounding, as torch's CPU conversion does.
__device__ __forceinline__ float scaled(float x, float s) { return x * s; }
__device__ __forceinline__ float scaled(double x, float s) { return static_cast<float>(x * static_cast<double>(s)); }

__device__ __forceinline__ void store_wide(float* p, float v, float s) { *p = v * s; }
__device__ __forceinline__ void store_wide(double* p, float v, float s) { *p = static_cast<double>(v) * s; }

// The casts count what they meet into `counts` when given it (launch::add_counts).
template <typename Wide>
__global__ void cast_scalar(const Wide* src, uint16_t* dst, size_t n, float scale, Wire w, CastCounts* counts,
                            const float* scale_on_device) {
  const float s = launch::scale_of(scale, scale_on_device);
  unsigned nonfinite = 0, saturated = 0;
  const float limit = formats::overflow_limit(w);
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const float v = scaled(src[i], s);
    dst[i] = narrow(v, w);
    if (counts) launch::tally(v, limit, nonfinite, saturated);
  }
  launch::add_counts(counts, nonfinite, saturated);
}

__global__ void cast_vec4(const float4* src, ushort4* dst, size_t n4, float scale, Wire w, CastCounts* counts,
                          const float* scale_on_device) {
  const float s = launch::scale_of(scale, scale_on_device);
  unsigned nonfinite = 0, saturated = 0;
  const float limit = formats::overflow_limit(w);
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n4; i += size_t(gridDim.x) * blockDim.x) {
    const float4 x = src[i];
    const float v[4] = {x.x * s, x.y * s, x.z * s, x.w * s};
    dst[i] = make_ushort4(narrow(v[0], w), narrow(v[1], w), narrow(v[2], w), narrow(v[3], w));
    if (counts) {
      for (float e : v) launch::tally(e, limit, nonfinite, saturated);
    }
  }
  launch::add_counts(counts, nonfinite, saturated);
}

template <typename Wide>
__global__ void restore_scalar(const uint16_t* src, Wide* dst, size_t n, float s, Wire w) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    store_wide(dst + i, widen(src[i], w), s);
}

__global__ void restore_vec4(const ushort4* src, float4* dst, size_t n4, float s, Wire w) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n4; i += size_t(gridDim.x) * blockDim.x) {
    const ushort4 h = src[i];
    dst[i] = make_float4(widen(h.x, w) * s, widen(h.y, w) * s, widen(h.z, w) * s, widen(h.w, w) * s);
  }
}

__device__ __forceinline__ float row_sum(const uint16_t* rows, size_t k, size_t stride, size_t i, Wire w) {
  float s = widen(rows[i], w);
  for (size_t j = 1; j < k; ++j) s = __fadd_rn(s, widen(rows[j * stride + i], w));
  return s;
}

__global__ void sum_narrow(const uint16_t* rows, size_t k, size_t stride, uint16_t* dst, size_t n, Wire w) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    dst[i] = narrow(row_sum(rows, k, stride, i, w), w);
}

template <typename Wide>
__global__ void sum_wide(const uint16_t* rows, size_t k, size_t stride, Wide* dst, size_t n, float s, Wire w) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    store_wide(dst + i, row_sum(rows, k, stride, i, w), s);
}

// Stochastic rounding may take a value past the largest to inf, or not: what counts is the result
// (cpu/stochastic.cpp).
template <typename Wide>
__global__ void cast_stochastic(const Wide* src, uint16_t* dst, size_t n, float scale, Wire w, Dither d,
                                uint64_t first, CastCounts* counts, const float* scale_on_device) {
  const float s = launch::scale_of(scale, scale_on_device);
  unsigned nonfinite = 0, saturated = 0;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const float v = scaled(src[i], s);
    dst[i] = narrow(stochastic_grid_value(v, random_bits(d, first + i), w), w);
    if (!counts) continue;
    const bool finite = formats::finite(v);
    nonfinite += !finite;
    saturated += finite && !formats::finite(widen(dst[i], w));
  }
  launch::add_counts(counts, nonfinite, saturated);
}

__global__ void sum_stochastic(const uint16_t* rows, size_t k, size_t stride, uint16_t* dst, size_t n, Wire w,
                               Dither d, uint64_t first) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    dst[i] = narrow(stochastic_grid_value(row_sum(rows, k, stride, i, w), random_bits(d, first + i), w), w);
}

bool aligned(const void* p, size_t a) { return reinterpret_cast<uintptr_t>(p) % a == 0; }

}  // namespace

void cast(const float* src, uint16_t* dst, size_t n, float scale, Wire wire, cudaStream_t stream,
          CastCounts* counts, const float* scale_on_device) {
  if (n == 0) return;
  size_t head = 0;
  if (aligned(src, 16) && aligned(dst, 8)) {
    const size_t n4 = n / 4;
    if (n4) {
      cast_vec4<<<launch::blocks_for(n4), launch::kThreads, 0, stream>>>(
          reinterpret_cast<const float4*>(src), reinterpret_cast<ushort4*>(dst), n4, scale, wire, counts,
          scale_on_device);
    }
    head = n4 * 4;
  }
  if (head < n) {
    cast_scalar<<<launch::blocks_for(n - head), launch::kThreads, 0, stream>>>(src + head, dst + head, n - head,
                                                                               scale, wire, counts, scale_on_device);
  }
  launch::check("cast kernel");
}

void cast(const double* src, uint16_t* dst, size_t n, float scale, Wire wire, cudaStream_t stream,
          CastCounts* counts, const float* scale_on_device) {
  if (n == 0) return;
  cast_scalar<<<launch::blocks_for(n), launch::kThreads, 0, stream>>>(src, dst, n, scale, wire, counts,
                                                                     scale_on_device);
  launch::check("cast kernel");
}

void restore(const uint16_t* src, float* dst, size_t n, float scale, Wire wire, cudaStream_t stream) {
  if (n == 0) return;
  size_t head = 0;
  if (aligned(src, 8) && aligned(dst, 16)) {
    const size_t n4 = n / 4;
    if (n4) restore_vec4<<<launch::blocks_for(n4), launch::kThreads, 0, stream>>>(reinterpret_cast<const ushort4*>(src),
                                                                  reinterpret_cast<float4*>(dst), n4, scale, wire);
    head = n4 * 4;
  }
  if (head < n)
    restore_scalar<<<launch::blocks_for(n - head), launch::kThreads, 0, stream>>>(src + head, dst + head,
                                                                                  n - head, scale, wire);
  launch::check("restore kernel");
}

void restore(const uint16_t* src, double* dst, size_t n, float scale, Wire wire, cudaStream_t stream) {
  if (n == 0) return;
  restore_scalar<<<launch::blocks_for(n), launch::kThreads, 0, stream>>>(src, dst, n, scale, wire);
  launch::check("restore kernel");
}

void sum(const uint16_t* rows, size_t k, size_t stride, uint16_t* dst, size_t n, Wire wire, cudaStream_t stream) {
  if (n == 0) return;
  sum_narrow<<<launch::blocks_for(n), launch::kThreads, 0, stream>>>(rows, k, stride, dst, n, wire);
  launch::check("sum kernel");
}

void sum(const uint16_t* rows, size_t k, size_t stride, float* dst, size_t n, float scale, Wire wire,
         cudaStream_t stream) {
  if (n == 0) return;
  sum_wide<<<launch::blocks_for(n), launch::kThreads, 0, stream>>>(rows, k, stride, dst, n, scale, wire);
  launch::check("sum kernel");
}

void sum(const uint16_t* rows, size_t k, size_t stride, double* dst, size_t n, float scale, Wire wire,
         cudaStream_t stream) {
  if (n == 0) return;
  sum_wide<<<launch::blocks_for(n), launch::kThreads, 0, stream>>>(rows, k, stride, dst, n, scale, wire);
  launch::check("sum kernel");
}

void cast(const float* src, uint16_t* dst, size_t n, float scale, Wire wire, const Dither& dither, uint64_t first,
          cudaStream_t stream, CastCounts* counts, const float* scale_on_device) {
  if (n == 0) return;
  cast_stochastic<<<launch::blocks_for(n), launch::kThreads, 0, stream>>>(src, dst, n, scale, wire, dither, first,
                                                                         counts, scale_on_device);
  launch::check("stochastic cast kernel");
}

void cast(const double* src, uint16_t* dst, size_t n, float scale, Wire wire, const Dither& dither, uint64_t first,
          cudaStream_t stream, CastCounts* counts, const float* scale_on_device) {
  if (n == 0) return;
  cast_stochastic<<<launch::blocks_for(n), launch::kThreads, 0, stream>>>(src, dst, n, scale, wire, dither, first,
                                                                         counts, scale_on_device);
  launch::check("stochastic cast kernel");
}

void sum(const uint16_t* rows, size_t k, size_t stride, uint16_t* dst, size_t n, Wire wire, const Dither& dither,
         uint64_t first, cudaStream_t stream) {
  if (n == 0) return;
  sum_stochastic<<<launch::blocks_for(n), launch::kThreads, 0, stream>>>(rows, k, stride, dst, n, wire, dither, first);
  launch::check("stochastic sum kernel");
}

}  // namespace cnccl::compress::cuda

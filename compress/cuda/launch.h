// Internal to the CUDA kernels (cuda/codec.cu, cuda/frames.cu): how a launch is sized and checked.
#pragma once

#include <cuda_runtime_api.h>

#include "compress/cuda/codec.h"
#include "compress/formats.h"

#include <stdexcept>
#include <string>

namespace cnccl::compress::cuda::launch {

constexpr int kThreads = 256;

// Blocks for `work` threads, at most eight per multiprocessor: grid-stride loops cover the rest.
inline int blocks_for(size_t work) {
  static const int max_blocks = [] {
    int device = 0, sms = 0;
    cudaGetDevice(&device);
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
    return sms > 0 ? sms * 8 : 1024;
  }();
  const size_t needed = (work + kThreads - 1) / kThreads;
  return static_cast<int>(needed < size_t(max_blocks) ? needed : size_t(max_blocks));
}

#ifndef CNCCL_CUDA_ARCHS
#define CNCCL_CUDA_ARCHS "?"
#endif

inline void check(const char* what) {
  const cudaError_t err = cudaGetLastError();
  if (err == cudaErrorNoKernelImageForDevice) {
    throw std::runtime_error(std::string("cnccl ") + what + ": " + cudaGetErrorString(err) + ": this build has " +
                             "kernels for CUDA architectures " + CNCCL_CUDA_ARCHS + " only; rebuild with the GPU's " +
                             "(CMake -DCNCCL_CUDA_ARCHS=75-real for a T4, compute capability 7.5, the oldest nvcc 13 builds)");
  }
  if (err != cudaSuccess) throw std::runtime_error(std::string("cnccl ") + what + ": " + cudaGetErrorString(err));
}

#if defined(__CUDACC__)
// A kernel's scale: the one on the device where it is given (PREMUL_SUM's tensor factor), else `scale`.
__device__ __forceinline__ float scale_of(float scale, const float* on_device) { return on_device ? *on_device : scale; }

// The sum and the largest of v over the warp's 32 lanes, every lane calling. Integer reductions are exact,
// so sm_80's one-instruction __reduce_*_sync and older GPUs' shuffles (T4: sm_75) give the same bits.
__device__ __forceinline__ unsigned warp_sum(unsigned v) {
#if __CUDA_ARCH__ >= 800
  return __reduce_add_sync(0xFFFFFFFFu, v);
#else
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xFFFFFFFFu, v, offset);
  return v;
#endif
}
__device__ __forceinline__ unsigned warp_max(unsigned v) {
#if __CUDA_ARCH__ >= 800
  return __reduce_max_sync(0xFFFFFFFFu, v);
#else
  for (int offset = 16; offset > 0; offset /= 2) v = max(v, __shfl_xor_sync(0xFFFFFFFFu, v, offset));
  return v;
#endif
}

// Adds what the calling warp's lanes counted to `counts` (null: nothing). Every lane of the warp calls it.
__device__ __forceinline__ void add_counts(CastCounts* counts, unsigned nonfinite, unsigned saturated) {
  if (!counts) return;
  nonfinite = warp_sum(nonfinite);
  saturated = warp_sum(saturated);
  if (threadIdx.x % 32 != 0) return;
  if (nonfinite) atomicAdd(&counts->nonfinite, static_cast<unsigned long long>(nonfinite));
  if (saturated) atomicAdd(&counts->saturated, static_cast<unsigned long long>(saturated));
}

// What a round-to-nearest cast of v meets (compress/cpu/kernels.h, tally): not finite, or past `limit`.
__device__ __forceinline__ void tally(float v, float limit, unsigned& nonfinite, unsigned& saturated) {
  const bool finite = formats::finite(v);
  nonfinite += !finite;
  saturated += finite && fabsf(v) >= limit;
}
#endif

}  // namespace cnccl::compress::cuda::launch

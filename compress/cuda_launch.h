// Internal to the CUDA kernels (cuda_codec.cu, cuda_frames.cu): how a launch is sized and checked.
#pragma once

#include <cuda_runtime_api.h>

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

inline void check(const char* what) {
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) throw std::runtime_error(std::string("cnccl ") + what + ": " + cudaGetErrorString(err));
}

}  // namespace cnccl::compress::cuda::launch

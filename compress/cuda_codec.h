// CUDA versions of the codec (compress/codec.h): same operations, same rounding, enqueued on a
// caller-given stream. Pointers are device pointers; no synchronisation happens here.
#pragma once

#include <cuda_runtime_api.h>

#include "compress/codec.h"
#include "compress/stochastic.h"

namespace cnccl::compress::cuda {

void cast(const float* src, uint16_t* dst, size_t n, float scale, Wire wire, cudaStream_t stream);
void cast(const double* src, uint16_t* dst, size_t n, float scale, Wire wire, cudaStream_t stream);
void restore(const uint16_t* src, float* dst, size_t n, float scale, Wire wire, cudaStream_t stream);
void restore(const uint16_t* src, double* dst, size_t n, float scale, Wire wire, cudaStream_t stream);
// The fp32 sums of `k` rows of `n` 16-bit values, `stride` elements apart, added in row order:
// rounded once to the wire (as compress::sum), or written widened and scaled (as restore() would
// write a 16-bit value).
void sum(const uint16_t* rows, size_t k, size_t stride, uint16_t* dst, size_t n, Wire wire, cudaStream_t stream);
void sum(const uint16_t* rows, size_t k, size_t stride, float* dst, size_t n, float scale, Wire wire,
         cudaStream_t stream);
void sum(const uint16_t* rows, size_t k, size_t stride, double* dst, size_t n, float scale, Wire wire,
         cudaStream_t stream);
// Stochastically rounded (stochastic.h), bit-identical to the CPU's; `first` as there.
void cast(const float* src, uint16_t* dst, size_t n, float scale, Wire wire, const Dither& dither, uint64_t first,
          cudaStream_t stream);
void cast(const double* src, uint16_t* dst, size_t n, float scale, Wire wire, const Dither& dither, uint64_t first,
          cudaStream_t stream);
void sum(const uint16_t* rows, size_t k, size_t stride, uint16_t* dst, size_t n, Wire wire, const Dither& dither,
         uint64_t first, cudaStream_t stream);

}  // namespace cnccl::compress::cuda

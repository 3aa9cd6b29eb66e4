// CUDA versions of the codec (compress/codec.h): same operations, same rounding, enqueued on a
// caller-given stream. Pointers are device pointers; no synchronisation happens here.
#pragma once

#include <cuda_runtime_api.h>

#include "compress/codec.h"
#include "compress/stochastic.h"

namespace cnccl::compress::cuda {

// What casts met, counted on the device (docs/design.md, "Telemetry"): a kernel given a CastCounts adds
// to it what compress::Census would count for the same cast; null counts nothing.
struct CastCounts {
  unsigned long long nonfinite;
  unsigned long long saturated;
};

// `scale_on_device`, where given, is read on the device in place of `scale` (PREMUL_SUM's tensor factor).
void cast(const float* src, uint16_t* dst, size_t n, float scale, Wire wire, cudaStream_t stream,
          CastCounts* counts = nullptr, const float* scale_on_device = nullptr);
void cast(const double* src, uint16_t* dst, size_t n, float scale, Wire wire, cudaStream_t stream,
          CastCounts* counts = nullptr, const float* scale_on_device = nullptr);
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
          cudaStream_t stream, CastCounts* counts = nullptr, const float* scale_on_device = nullptr);
void cast(const double* src, uint16_t* dst, size_t n, float scale, Wire wire, const Dither& dither, uint64_t first,
          cudaStream_t stream, CastCounts* counts = nullptr, const float* scale_on_device = nullptr);
void sum(const uint16_t* rows, size_t k, size_t stride, uint16_t* dst, size_t n, Wire wire, const Dither& dither,
         uint64_t first, cudaStream_t stream);

// Power-of-two frames, MX and NVFP4 blocks (backend/frames.h defines their layout and rounding; the CPU
// kernels behind it are what these are tested against). A frame of `count` values is
// frames::frame_bytes(count, wire) bytes; rows of frames lie `stride` bytes apart. `workspace`:
// frame_workspace_bytes(ranks) bytes of device memory that only this call uses, in `stream`'s order.
// No call allocates: no temporary the size of a row.
size_t frame_workspace_bytes(size_t ranks);
// A block frame's elements (MX, NVFP4) rounded stochastically: value i takes block_random_bits(*dither,
// first + i) (compress/stochastic.h). Null rounds to nearest; other wires ignore it.
struct FrameRounding {
  const Dither* dither = nullptr;
  uint64_t first = 0;
};
// frame = the n <= count values of src (then +0s) times scale, framed (frames::encode's one row).
void frame_encode(const float* src, size_t n, size_t count, float scale, Wire wire, MxScale rule, uint8_t* frame,
                  void* workspace, cudaStream_t stream, CastCounts* counts = nullptr,
                  const float* scale_on_device = nullptr, FrameRounding rounding = {});
void frame_encode(const double* src, size_t n, size_t count, float scale, Wire wire, MxScale rule, uint8_t* frame,
                  void* workspace, cudaStream_t stream, CastCounts* counts = nullptr,
                  const float* scale_on_device = nullptr, FrameRounding rounding = {});
// out = the frame of the fp32 sums of `ranks` frames in rank order (frames::sum_encode); `out` may be
// one of them.
void frame_sum_encode(const uint8_t* frames, size_t ranks, size_t stride, size_t count, Wire wire, MxScale rule,
                      uint8_t* out, void* workspace, cudaStream_t stream, CastCounts* counts = nullptr,
                      FrameRounding rounding = {});
// dst[0..count) = those sums times post in dst's precision (frames::sum, then write_scaled_sums).
void frame_sum(const uint8_t* frames, size_t ranks, size_t stride, size_t count, Wire wire, float post, float* dst,
               void* workspace, cudaStream_t stream);
void frame_sum(const uint8_t* frames, size_t ranks, size_t stride, size_t count, Wire wire, float post, double* dst,
               void* workspace, cudaStream_t stream);
// dst[0..n) = the frames' values, row after row, times post (frames::restore). A header outside
// [-126, 126] (an NVFP4 part scale outside [2^-120, FLT_MAX / 2688]), which the CPU reports by the
// sender's rank, decodes as NaN here: nothing is read back.
void frame_restore(const uint8_t* frames, size_t stride, size_t count, Wire wire, float post, float* dst, size_t n,
                   cudaStream_t stream);
void frame_restore(const uint8_t* frames, size_t stride, size_t count, Wire wire, float post, double* dst, size_t n,
                   cudaStream_t stream);

}  // namespace cnccl::compress::cuda

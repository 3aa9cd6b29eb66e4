// Moving tensors into and out of the host path's raw buffers: pack/unpack (exact copies), the
// codec's cast/restore (16-bit wire), the uncompressed scales, and the reducers the algorithms
// call. Everything that knows a tensor's dtype on the host path is here.
#pragma once

#include <ATen/ATen.h>

#include <functional>

#include "backend/host/algorithms/algorithms.h"
#include "backend/host/shm/shm_algorithms.h"
#include "backend/policy.h"
#include "compress/stochastic.h"

namespace cnccl::host {

// A flat tensor over raw memory.
at::Tensor view(char* data, int64_t numel, at::ScalarType dtype);

// Copies `src` (any strides) into raw contiguous memory, and back.
void pack(const at::Tensor& src, char* dst);
void unpack(const char* src, const at::Tensor& dst);

// Casts `src` (fp32 or fp64, contiguous) into the 16-bit workspace with the plan's pre-scale; a
// stochastic plan rounds with `dither`, src's element 0 being element `first` of its collective.
void cast_into(const at::Tensor& src, uint16_t* dst, const Plan& plan, const compress::Dither& dither = {},
               uint64_t first = 0);
// Restores the 16-bit workspace into `dst` (any strides) with the plan's post-scale.
void restore_into(const uint16_t* src, const at::Tensor& dst, const Plan& plan);

// Uncompressed AVG / PREMUL_SUM scaling and integer AVG's division, in the tensor's own dtype.
void pre_scale(char* data, int64_t numel, at::ScalarType dtype, const Plan& plan);
void post_scale(char* data, int64_t numel, at::ScalarType dtype, const Plan& plan);

// The plan's reduction on buffers of `dtype`, or on the 16-bit wire when it compresses.
Reducer reducer(const Plan& plan, at::ScalarType dtype);

// A chunked reduction's contribution (ChunkedReduction::produce, through shared memory or the
// chunked all-to-all): element i comes from source(i)
// (contiguous within one call), cast with the pre-scale (stochastic plans: with `dither`), or
// copied and scaled uncompressed.
ChunkProduce chunk_producer(std::function<const char*(size_t index)> source, const Plan& plan, at::ScalarType dtype,
                        const compress::Dither& dither = {});
// A chunked allreduce's results written straight into `dst`, contiguous memory of `dtype`:
// restored from the 16-bit wire with the post-scale, or copied and post-scaled uncompressed.
ChunkConsume chunk_consumer(char* dst, const Plan& plan, at::ScalarType dtype);
// The reduction of `size` contributions in rank order (shared memory, the chunked all-to-all, and the
// all-to-all reduce-scatter): a compressed SUM adds in fp32 and rounds once (compress::sum); anything else
// folds the plan's reducer over them. A stochastic plan rounds the sum with `dither`.
RankSum rank_sum(const Plan& plan, at::ScalarType dtype, int size, const compress::Dither& dither = {});
// A compressed SUM of `size` 16-bit contributions in fp32, in rank order, written unrounded as fp32
// (a reduce_scatter with fp32 sums); restore_sums_into then writes it to the output.
RankSum fp32_rank_sum(const Plan& plan, int size);
// dst = sums * post-scale (write_scaled_sums, backend/wide_data.h).
void restore_sums_into(const float* sums, const at::Tensor& dst, const Plan& plan);

// The cast folded into a ring's reductions (a compressed fp32 SUM): the wire element at index i
// comes from source(i). The producer casts the part the ring sends first; the reducer casts
// every other part as it adds the neighbour's partial sum to it, saving a pass over memory.
// Bit-identical to casting everything first (compress::cast_add).
struct FusedCast {
  uint16_t* wire;
  std::function<const float*(size_t index)> source;
  float scale;
  compress::Wire wire_dtype;

  // Whether `plan` on `dtype` can fold its cast this way.
  static bool applies(const Plan& plan, at::ScalarType dtype);
  Producer producer() const;
  Reducer reducer() const;
};

}  // namespace cnccl::host

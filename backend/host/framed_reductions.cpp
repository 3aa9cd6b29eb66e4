// The host path's compressed sums in frames (plan.framed; backend/frames.h), each a ChunkedReduction
// through shared memory on one host (reduce_shm) and pipelined over the transport elsewhere
// (reduce_chunked), the same functions on either: every rank's piece of part p goes to rank p, which
// decodes and adds them in fp32 in rank order. Parts and blocks are cut as the composed path's frames
// cut them, so every path gives the same bits.
//
// A power-of-two frame (framed_*_step) has one exponent for its whole part: each rank finds its parts'
// exponents first (the amax pass), then casts and sends its frames in pieces, the header in the first.
// reduce_scatter writes the owner's sum, unrounded; allreduce's owner frames its whole sum with its own
// exponent once every piece is in, and the owners' frames are allgathered in pieces, each restored as
// it comes (allgather_shm, allgather_chunked). allreduce's parts are ceil(n / size) elements (the last
// short or empty).
//
// MX blocks (mx_*_step) carry their scales, so a chunk of a part's blocks is encoded, summed and
// decoded on its own, and allreduce's results go back chunk by chunk. The unit is a block (its scale
// byte and elements: compress::mx_bytes(32)); a piece of k blocks travels as the MX run of the values
// it covers, which for the part's last block may be short.
#include <atomic>
#include <cstring>

#include "backend/frames.h"
#include "backend/host/host_path.h"
#include "backend/host/shm/shm_algorithms.h"
#include "backend/host/staging.h"
#include "backend/host/transport/comm.h"
#include "backend/host/transport/tags.h"
#include "backend/wide_data.h"

namespace cnccl::host {
namespace {

// Where blocks [block, block + k) of a run of parts, `count` elements each (`blocks` blocks), lie in the
// n elements they were cut from: the first element, the elements the blocks cover (the last part
// padded to `count` with zeros, as the all-to-all pads it), and how many of those exist.
struct BlockSpan {
  size_t first, covered, given;
  BlockSpan(size_t block, size_t k, size_t blocks, size_t count, size_t n) {
    const size_t j = block % blocks;
    first = block / blocks * count + j * compress::kMxBlock;
    covered = std::min(k * compress::kMxBlock, count - j * compress::kMxBlock);
    given = first < n ? std::min(covered, n - first) : 0;
  }
};


}  // namespace

HostPath::Step HostPath::mx_allreduce_step(const at::Tensor& tensor, const Plan& plan, bool on_shm) {
  const int size = size_;
  const size_t n = tensor.numel(), count = (n + size - 1) / size;
  const size_t blocks = (count + compress::kMxBlock - 1) / compress::kMxBlock;
  const size_t wide = tensor.element_size();
  const at::ScalarType dtype = tensor.scalar_type();
  // Results restored chunk by chunk into the tensor, or into a staging copy that replaces it once
  // every chunk is in (a strided tensor, or untouched_on_failure: docs/design.md, "Shared memory").
  const bool direct = tensor.is_contiguous() && !config_.untouched_on_failure;
  auto src = std::make_shared<at::Tensor>();
  Step step;
  step.on_shm = on_shm;
  step.workspace_bytes = direct ? 0 : n * wide;
  if (direct) step.wrote_results = std::make_shared<bool>(false);
  const std::shared_ptr<bool> wrote = step.wrote_results;
  step.pre = [=](const Buffers&) { *src = tensor.contiguous(); };
  step.algorithm = [=, this](const Buffers& b) {
    const char* x = static_cast<const char*>(src->const_data_ptr());
    char* y = direct ? static_cast<char*>(tensor.data_ptr()) : b.workspace;
    const ChunkProduce produce = [=](size_t block, size_t k, char* dst) {
      const BlockSpan s(block, k, blocks, count, n);
      with_wide_data(x + s.first * wide, dtype, [&](const auto* v) {
        compress::mx_encode(v, s.given, s.covered, float(plan.pre_scale), plan.wire, plan.mx_scale,
                            reinterpret_cast<uint8_t*>(dst));
      });
    };
    const RankSum sum = [=](const char* const* inputs, char* dst, size_t block, size_t k) {
      const BlockSpan s(block, k, blocks, count, n);
      compress::mx_sum_encode(reinterpret_cast<const uint8_t* const*>(inputs), size_t(size), s.covered, plan.wire,
                              plan.mx_scale, reinterpret_cast<uint8_t*>(dst));
    };
    const ChunkConsume consume = [=](size_t block, size_t k, const char* result) {
      const BlockSpan s(block, k, blocks, count, n);
      if (wrote) *wrote = true;
      const auto* run = reinterpret_cast<const uint8_t*>(result);
      if (dtype == at::kDouble) {
        compress::mx_restore(run, s.covered, reinterpret_cast<double*>(y) + s.first, s.given, float(plan.post_scale),
                             plan.wire);
      } else {
        compress::mx_restore(run, s.covered, reinterpret_cast<float*>(y) + s.first, s.given, float(plan.post_scale),
                             plan.wire);
      }
    };
    ChunkedReduction reduction{Parts::equal(blocks, size), compress::mx_bytes(compress::kMxBlock, plan.wire),
                           timed_producer(produce), timed_reducer(sum), nullptr, ChunkedReduction::kAll};
    reduction.consume = timed_consumer(consume);
    reduce(reduction, on_shm);
  };
  step.post = [=](const Buffers& b) {
    src->reset();
    if (!direct) unpack(b.workspace, tensor);
  };
  return step;
}

HostPath::Step HostPath::mx_reduce_scatter_step(const std::vector<at::Tensor>& inputs, const at::Tensor& output,
                                                const Plan& plan, bool on_shm) {
  const int size = size_;
  const size_t each = output.numel();
  const size_t blocks = (each + compress::kMxBlock - 1) / compress::kMxBlock;
  const size_t wide = output.element_size();
  const at::ScalarType dtype = output.scalar_type();
  auto srcs = std::make_shared<std::vector<at::Tensor>>();
  Step step;
  step.on_shm = on_shm;
  // This rank's part's fp32 sums, a block's worth of floats for each of its blocks.
  step.workspace_bytes = blocks * compress::kMxBlock * sizeof(float);
  step.pre = [=](const Buffers&) {
    for (const auto& in : inputs) srcs->push_back(in.contiguous());
  };
  step.algorithm = [=, this](const Buffers& b) {
    std::vector<const char*> x;
    for (const auto& in : *srcs) x.push_back(static_cast<const char*>(in.const_data_ptr()));
    const ChunkProduce produce = [=](size_t block, size_t k, char* dst) {
      const BlockSpan s(block, k, blocks, each, each * size_t(size));
      with_wide_data(x[block / blocks] + (s.first % std::max<size_t>(each, 1)) * wide, dtype, [&](const auto* v) {
        compress::mx_encode(v, s.covered, s.covered, float(plan.pre_scale), plan.wire, plan.mx_scale,
                            reinterpret_cast<uint8_t*>(dst));
      });
    };
    const RankSum sum = [=](const char* const* in, char* dst, size_t block, size_t k) {
      const BlockSpan s(block, k, blocks, each, each * size_t(size));
      compress::mx_sum(reinterpret_cast<const uint8_t* const*>(in), size_t(size), reinterpret_cast<float*>(dst),
                       s.covered, plan.wire);
    };
    reduce({Parts::equal(blocks, size), compress::mx_bytes(compress::kMxBlock, plan.wire), timed_producer(produce),
            timed_reducer(sum), b.workspace, ChunkedReduction::kOwn, 0, compress::kMxBlock * sizeof(float)},
           on_shm);
  };
  step.post = [=](const Buffers& b) {
    srcs->clear();
    restore_sums_into(reinterpret_cast<const float*>(b.workspace), output, plan);
  };
  return step;
}

HostPath::Step HostPath::framed_allreduce_step(const at::Tensor& tensor, const Plan& plan, bool on_shm) {
  const int size = size_, rank = rank_;
  const int64_t n = tensor.numel(), count = (n + size - 1) / size;
  const size_t width = compress::wire_bytes(plan.wire);
  const size_t units = size_t(frames::frame_bytes(count, plan.wire)) / width;
  const int64_t values_at = frames::payload_offset(plan.wire) / int64_t(width);
  const size_t wide = tensor.element_size();
  const at::ScalarType dtype = tensor.scalar_type();
  // The owners' frames are restored as their pieces come: into the tensor, or into a staging copy
  // that replaces it once every frame is in (a strided tensor, or untouched_on_failure).
  const bool direct = tensor.is_contiguous() && !config_.untouched_on_failure;
  auto src = std::make_shared<at::Tensor>();
  auto mine = std::make_shared<std::vector<int32_t>>(size);   // this rank's exponent of each part
  auto heard = std::make_shared<std::vector<int32_t>>(size);  // every rank's exponent of this owner's part
  auto told = std::make_shared<std::vector<int32_t>>(size);   // each owner's exponent of its sum
  // The largest |sum| of this owner's part so far, as the bits of a non-negative float (a NaN's exceed
  // infinity's): its frame's exponent is ready when the last piece is summed, with no pass over the sums.
  auto largest = std::make_shared<std::atomic<uint32_t>>(0);
  Step step;
  step.on_shm = on_shm;
  // This owner's fp32 sums, a float for each unit of its frame; then the staging copy, unless direct.
  const size_t sums_bytes = (units * sizeof(float) + 63) / 64 * 64;
  step.workspace_bytes = sums_bytes + (direct ? 0 : size_t(n) * wide);
  if (direct) step.wrote_results = std::make_shared<bool>(false);
  const std::shared_ptr<bool> wrote = step.wrote_results;
  step.pre = [=](const Buffers&) {
    *src = tensor.reshape({-1}).contiguous();
    const auto rows = frames::parts_of(*src, size, count);
    for (int q = 0; q < size; ++q) (*mine)[q] = frames::row_exponent(rows[q], plan.pre_scale, plan.wire);
  };
  step.algorithm = [=, this](const Buffers& b) {
    const auto rows = frames::parts_of(*src, size, count);
    const ChunkProduce produce = [=](size_t first, size_t len, char* dst) {
      const size_t q = first / units;
      frames::encode_piece(rows[q], (*mine)[q], plan.pre_scale, plan.wire, count, int64_t((first - q * units) * width),
                           int64_t(len * width), reinterpret_cast<uint8_t*>(dst));
    };
    const RankSum sum = [=](const char* const* in, char* dst, size_t first, size_t len) {
      const float a = frames::sum_pieces(reinterpret_cast<const uint8_t* const*>(in), size, heard->data(), plan.wire,
                                         count, int64_t((first - size_t(rank) * units) * width), int64_t(len * width),
                                         reinterpret_cast<float*>(dst));
      uint32_t bits, seen = largest->load(std::memory_order_relaxed);
      std::memcpy(&bits, &a, sizeof bits);
      bits &= 0x7FFFFFFFu;
      while (bits > seen && !largest->compare_exchange_weak(seen, bits, std::memory_order_relaxed)) {
      }
    };
    char* sums = b.workspace;
    reduce({Parts::equal(units, size), width, timed_producer(produce), timed_reducer(sum), sums,
            ChunkedReduction::kOwn, 0, sizeof(float)},
           on_shm);
    // The owner's frame of its sum needs the whole sum's amax: it goes out once every piece is in.
    const at::Tensor total = view(sums + values_at * int64_t(sizeof(float)), count, at::kFloat);
    int32_t k = 0;
    timed_reduce([&] {
      const compress::CensusSamplesPaused not_a_contribution;
      const uint32_t bits = largest->load(std::memory_order_relaxed);  // a NaN's bits are a NaN
      float amax;
      std::memcpy(&amax, &bits, sizeof amax);
      k = frames::sum_exponent(amax, total, plan.wire);
    });
    const ChunkProduce frame_sum = [=](size_t first, size_t len, char* dst) {
      const compress::CensusSamplesPaused not_a_contribution;
      frames::encode_piece(total, k, 1.0, plan.wire, count, int64_t((first - size_t(rank) * units) * width),
                           int64_t(len * width), reinterpret_cast<uint8_t*>(dst));
    };
    char* y = direct ? static_cast<char*>(tensor.data_ptr()) : b.workspace + sums_bytes;
    const ChunkConsume restore = [=](size_t first, size_t len, const char* piece) {
      const size_t q = first / units;
      const int64_t from_value = int64_t(q) * count;
      if (from_value >= n) return;  // a part past the tensor's end (n < size): nothing of it is read, as restore()
      frames::restore_piece(reinterpret_cast<const uint8_t*>(piece), &(*told)[q], int64_t(q), plan.wire, count,
                            std::min<int64_t>(n - from_value, count), int64_t((first - q * units) * width),
                            int64_t(len * width), plan.post_scale, dtype, y + from_value * int64_t(wide));
      if (wrote) *wrote = true;  // after the header's check: a bad one writes nothing
    };
    const Parts parts = Parts::equal(units, size);
    if (on_shm) return allgather_shm(*shm_, nullptr, parts, width, timed_producer(frame_sum), timed_consumer(restore));
    allgather_chunked(*comm_, parts, width, timed_producer(frame_sum), timed_consumer(restore), tags::kSecondPhase);
  };
  step.post = [=](const Buffers& b) {
    src->reset();
    if (!direct) unpack(b.workspace + sums_bytes, tensor);
  };
  return step;
}

HostPath::Step HostPath::framed_reduce_scatter_step(const std::vector<at::Tensor>& inputs, const at::Tensor& output,
                                                    const Plan& plan, bool on_shm) {
  const int size = size_, rank = rank_;
  const int64_t each = output.numel();
  const size_t width = compress::wire_bytes(plan.wire), units = size_t(frames::frame_bytes(each, plan.wire)) / width;
  const int64_t values_at = frames::payload_offset(plan.wire) / int64_t(width);
  auto srcs = std::make_shared<std::vector<at::Tensor>>();
  auto mine = std::make_shared<std::vector<int32_t>>(size);
  auto heard = std::make_shared<std::vector<int32_t>>(size);
  Step step;
  step.on_shm = on_shm;
  // This rank's fp32 sums, a float for each unit of its part's frame.
  step.workspace_bytes = units * sizeof(float);
  step.pre = [=](const Buffers&) {
    for (int q = 0; q < size; ++q) {
      srcs->push_back(inputs[size_t(q)].contiguous());
      (*mine)[q] = frames::row_exponent(srcs->back(), plan.pre_scale, plan.wire);
    }
  };
  step.algorithm = [=, this](const Buffers& b) {
    const ChunkProduce produce = [=](size_t first, size_t len, char* dst) {
      const size_t q = first / units;
      frames::encode_piece((*srcs)[q], (*mine)[q], plan.pre_scale, plan.wire, each,
                           int64_t((first - q * units) * width), int64_t(len * width), reinterpret_cast<uint8_t*>(dst));
    };
    const RankSum sum = [=](const char* const* in, char* dst, size_t first, size_t len) {
      frames::sum_pieces(reinterpret_cast<const uint8_t* const*>(in), size, heard->data(), plan.wire, each,
                         int64_t((first - size_t(rank) * units) * width), int64_t(len * width),
                         reinterpret_cast<float*>(dst));
    };
    reduce({Parts::equal(units, size), width, timed_producer(produce), timed_reducer(sum), b.workspace,
            ChunkedReduction::kOwn, 0, sizeof(float)},
           on_shm);
  };
  step.post = [=](const Buffers& b) {
    srcs->clear();
    restore_sums_into(reinterpret_cast<const float*>(b.workspace) + values_at, output, plan);
  };
  return step;
}

}  // namespace cnccl::host

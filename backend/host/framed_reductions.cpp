// The host path's compressed sums in frames (plan.framed; backend/frames.h): every
// rank's frame of part p goes to rank p (reduce_scatter_alltoall), which decodes and adds them in
// fp32 in rank order. allreduce frames that sum with its own exponent and allgathers the frames;
// reduce_scatter writes the sum, unrounded. allreduce's parts are ceil(n / size) elements (the last
// short or empty), as on the composed path, so both paths pick the same exponents and give the same
// bits.
//
// MX blocks go as a ChunkedReduction instead (mx_*_step): each block carries its scale, so a chunk of
// a part's blocks is encoded, summed and decoded on its own, through shared memory on one host
// (reduce_shm) and pipelined over the transport elsewhere (reduce_chunked), the same functions on
// either. The unit is a block (its scale byte and elements: compress::mx_bytes(32)); a piece of k
// blocks travels as the MX run of the values it covers, which for the part's last block may be short.
// Parts and blocks are cut as the composed path's frames cut them, so every path gives the same bits.
#include "backend/frames.h"
#include "backend/host/host_path.h"
#include "backend/host/shm/shm_algorithms.h"
#include "backend/host/staging.h"
#include "backend/host/transport/comm.h"
#include "backend/host/transport/tags.h"
#include "backend/wide_data.h"

namespace cnccl::host {
namespace {

at::Tensor frames_at(char* data, int64_t rows, int64_t frame) {
  return view(data, rows * frame, at::kByte).view({rows, frame});
}

// The frames a RankSum receives, one a rank in rank order.
std::vector<at::Tensor> received(const char* const* inputs, int size, int64_t frame) {
  std::vector<at::Tensor> out;
  for (int r = 0; r < size; ++r) out.push_back(view(const_cast<char*>(inputs[r]), frame, at::kByte));
  return out;
}

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

// An owner's fp32 sums of the pieces it reduces; the executor thread's alone.
std::shared_ptr<std::vector<float>> sums_buffer() { return std::make_shared<std::vector<float>>(); }

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
  auto sums = sums_buffer();
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
      sums->resize(std::max(sums->size(), s.covered));
      compress::mx_sum(reinterpret_cast<const uint8_t* const*>(inputs), size_t(size), sums->data(), s.covered,
                       plan.wire);
      const compress::CensusSamplesPaused not_a_contribution;
      compress::mx_encode(sums->data(), s.covered, s.covered, 1.0f, plan.wire, plan.mx_scale,
                          reinterpret_cast<uint8_t*>(dst));
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

HostPath::Step HostPath::framed_allreduce_step(const at::Tensor& tensor, const Plan& plan) {
  const int size = size_, rank = rank_;
  const int64_t n = tensor.numel(), count = (n + size - 1) / size;
  const int64_t frame = frames::frame_bytes(count, plan.wire), all = frame * size;
  Step step;
  // This rank's frame of every part, every owner's frame of its sum, then this owner's fp32 sum.
  step.workspace_bytes = size_t(2 * all + count * int64_t(sizeof(float)));
  step.pre = [=](const Buffers& b) {
    frames::encode(frames::parts_of(tensor.reshape({-1}), size, count), count, plan.pre_scale, plan.wire, plan.mx_scale,
                   frames_at(b.workspace, size, frame));
  };
  step.algorithm = [=, this](const Buffers& b) {
    const Parts parts = Parts::equal(size_t(frame), size);
    char* owners = b.workspace + all;
    const at::Tensor total = view(owners + all, count, at::kFloat);
    const RankSum sum = [=](const char* const* inputs, char* dst, size_t, size_t) {
      frames::sum(received(inputs, size, frame), count, plan.wire, total);
      const compress::CensusSamplesPaused not_a_contribution;
      frames::encode({total}, count, 1.0, plan.wire, plan.mx_scale, frames_at(dst, 1, frame));
    };
    reduce_scatter_alltoall(*comm_, b.workspace, parts, 1, timed_reducer(sum), owners + rank * frame);
    allgather_ring(*comm_, owners, parts, 1, tags::kSecondPhase);
  };
  step.post = [=](const Buffers& b) {
    frames::restore(frames_at(b.workspace + all, size, frame), count, plan.wire, plan.post_scale, tensor);
  };
  return step;
}

HostPath::Step HostPath::framed_reduce_scatter_step(const std::vector<at::Tensor>& inputs, const at::Tensor& output,
                                                    const Plan& plan) {
  const int size = size_;
  const int64_t each = output.numel();
  const int64_t frame = frames::frame_bytes(each, plan.wire), all = frame * size;
  Step step;
  // Every part's frame, then this rank's fp32 sums.
  step.workspace_bytes = size_t(all + each * int64_t(sizeof(float)));
  step.pre = [=](const Buffers& b) {
    frames::encode(inputs, each, plan.pre_scale, plan.wire, plan.mx_scale, frames_at(b.workspace, size, frame));
  };
  step.algorithm = [=, this](const Buffers& b) {
    const RankSum sum = [=](const char* const* in, char* dst, size_t, size_t) {
      frames::sum(received(in, size, frame), each, plan.wire, view(dst, each, at::kFloat));
    };
    reduce_scatter_alltoall(*comm_, b.workspace, Parts::equal(size_t(frame), size), 1, timed_reducer(sum),
                            b.workspace + all);
  };
  step.post = [=](const Buffers& b) {
    restore_sums_into(reinterpret_cast<const float*>(b.workspace + all), output, plan);
  };
  return step;
}

}  // namespace cnccl::host

// The host path's compressed sums in frames (plan.framed; backend/frames.h): every
// rank's frame of part p goes to rank p (reduce_scatter_alltoall), which decodes and adds them in
// fp32 in rank order. allreduce frames that sum with its own exponent and allgathers the frames;
// reduce_scatter writes the sum, unrounded. allreduce's parts are ceil(n / size) elements (the last
// short or empty), as on the composed path, so both paths pick the same exponents and give the same
// bits.
#include "backend/frames.h"
#include "backend/host/host_path.h"
#include "backend/host/staging.h"
#include "backend/host/transport/comm.h"
#include "backend/host/transport/tags.h"

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

}  // namespace

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

// A compressed sum with the block rotation (plan.rotated; docs/design.md, "Block rotation"): the
// reduction's own step runs on a rotated copy of the caller's values, and its result is rotated back
// into the caller's tensor after the step's post. Owners add rotated values (the rotation is linear),
// and each element is rotated back once, whatever the number of ranks. The caller's tensor is written
// only then: a failed collective leaves it as it was.
#include "backend/host/host_path.h"
#include "backend/wide_data.h"
#include "compress/codec.h"

namespace cnccl::host {
namespace {

// dst (contiguous, flat) = rotate(src) or unrotate(src): src of any strides, both fp32 or both fp64.
void rotate_into(const at::Tensor& src, const at::Tensor& dst, uint16_t signs, bool forward) {
  const at::Tensor x = src.reshape({-1}).contiguous();
  with_wide_data(dst, [&](auto* y) {
    using T = std::remove_pointer_t<decltype(y)>;
    const T* v = x.const_data_ptr<T>();
    if (forward) return compress::rotate(v, y, size_t(x.numel()), signs);
    compress::unrotate(v, y, size_t(x.numel()), signs);
  });
}

// `out` (any strides) = unrotate(`rotated`), through a contiguous copy where `out` is not contiguous.
void unrotate_into(const at::Tensor& rotated, const at::Tensor& out, uint16_t signs) {
  if (out.is_contiguous()) return rotate_into(rotated, out.view({-1}), signs, false);
  const at::Tensor flat = at::empty({out.numel()}, out.options());
  rotate_into(rotated, flat, signs, false);
  out.copy_(flat.view(out.sizes()));
}

Plan unrotated(const Plan& plan) {
  Plan inner = plan;
  inner.rotated = false;
  return inner;
}

}  // namespace

// A fresh tensor's first touch costs page faults: 30 ms to fill a new 64 MiB one here against 6 ms for one
// filled before, which made the rotation's copy most of its cost. So copies are kept: at most four buffers
// (a training loop's buckets in flight), each free once no step's view of it lives. A free buffer serves a
// request of a quarter of its size up to all of it; one outside that is replaced at the request's size, so
// that what is kept follows the calls' sizes rather than the largest call's. Past four buffers in use, a
// copy is fresh and freed after its call. A count of 1 is also an order: the executor runs one job at a
// time and drops a finished job's steps (their views) before it takes its lock for the next.
at::Tensor HostPath::RotationCopies::take(int64_t numel, at::ScalarType dtype) {
  constexpr size_t kKept = 4;
  const int64_t bytes = numel * int64_t(c10::elementSize(dtype));
  if (bytes == 0) return at::empty({0}, at::TensorOptions().dtype(dtype));
  const std::lock_guard<std::mutex> lock(mutex_);
  at::Tensor* chosen = nullptr;
  at::Tensor* misfit = nullptr;  // free, but too small or more than four times too large
  for (at::Tensor& t : kept_) {
    if (t.storage().use_count() != 1) continue;  // a step holds a view of it
    if (t.numel() < bytes || t.numel() / 4 > bytes) {
      misfit = &t;
    } else if (!chosen || t.numel() < chosen->numel()) {
      chosen = &t;  // the smallest that fits
    }
  }
  if (!chosen && misfit) {
    *misfit = at::empty({bytes}, at::kByte);
    chosen = misfit;
  }
  if (!chosen && kept_.size() < kKept) chosen = &kept_.emplace_back(at::empty({bytes}, at::kByte));
  if (!chosen) return at::empty({numel}, at::TensorOptions().dtype(dtype));
  return chosen->narrow(0, 0, bytes).view(dtype);
}

void HostPath::RotationCopies::clear() {
  const std::lock_guard<std::mutex> lock(mutex_);
  kept_.clear();
}

HostPath::Step HostPath::rotated_allreduce_step(const at::Tensor& tensor, const Plan& plan) {
  const at::Tensor copy = rotation_copies_.take(tensor.numel(), tensor.scalar_type());
  Step step = allreduce_step(copy, unrotated(plan));
  const uint16_t signs = plan.rotation_signs;
  step.pre = [tensor, copy, signs, pre = std::move(step.pre)](const Buffers& b) {
    rotate_into(tensor, copy, signs, true);
    if (pre) pre(b);
  };
  step.post = [tensor, copy, signs, post = std::move(step.post)](const Buffers& b) {
    if (post) post(b);
    unrotate_into(copy, tensor, signs);
  };
  step.wrote_results = nullptr;  // into the copy only
  return step;
}

HostPath::Step HostPath::rotated_reduce_scatter_step(const std::vector<at::Tensor>& inputs, const at::Tensor& output,
                                                     const Plan& plan) {
  // Each input is one rank's part, rotated on its own, so that its owner's output rotates back alone; the
  // copies and the result are pieces of one buffer.
  int64_t total = output.numel();
  for (const auto& in : inputs) total += in.numel();
  const at::Tensor buffer = rotation_copies_.take(total, output.scalar_type());
  std::vector<at::Tensor> copies;
  int64_t at = 0;
  for (const auto& in : inputs) {
    copies.push_back(buffer.narrow(0, at, in.numel()));
    at += in.numel();
  }
  const at::Tensor result = buffer.narrow(0, at, output.numel());
  Step step = reduce_scatter_step(copies, result, unrotated(plan));
  const uint16_t signs = plan.rotation_signs;
  step.pre = [inputs, copies, signs, pre = std::move(step.pre)](const Buffers& b) {
    for (size_t i = 0; i < inputs.size(); ++i) rotate_into(inputs[i], copies[i], signs, true);
    if (pre) pre(b);
  };
  step.post = [output, result, signs, post = std::move(step.post)](const Buffers& b) {
    if (post) post(b);
    unrotate_into(result, output, signs);
  };
  step.wrote_results = nullptr;
  return step;
}

}  // namespace cnccl::host

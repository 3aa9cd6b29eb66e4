#include "backend/composed/composed_path.h"

namespace cnccl::composed {

using WorkPtr = c10::intrusive_ptr<c10d::Work>;

ComposedPath::ComposedPath(int rank, int size, std::unique_ptr<Composition> composition)
    : c10d::Backend(rank, size), composition_(std::move(composition)) {}

WorkPtr ComposedPath::allreduce(std::vector<at::Tensor>& tensors, const c10d::AllreduceOptions& opts) {
  if (coalescing_) return engine().allreduce(tensors, opts);
  return composition_->allreduce(tensors, opts);
}

WorkPtr ComposedPath::allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                          const c10d::AllreduceCoalescedOptions& opts) {
  if (coalescing_) return engine().allreduce_coalesced(tensors, opts);
  return composition_->allreduce_coalesced(tensors, opts);
}

WorkPtr ComposedPath::reduce_scatter(std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
                                     const c10d::ReduceScatterOptions& opts) {
  if (coalescing_) return engine().reduce_scatter(outputs, inputs, opts);
  return composition_->reduce_scatter(outputs, inputs, opts);
}

WorkPtr ComposedPath::_reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                           const c10d::ReduceScatterOptions& opts) {
  if (coalescing_) return engine()._reduce_scatter_base(output, input, opts);
  return composition_->reduce_scatter_tensor(output, input, opts);
}

WorkPtr ComposedPath::reduce_scatter_tensor_coalesced(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                                      const c10d::ReduceScatterOptions& opts) {
  if (coalescing_) return engine().reduce_scatter_tensor_coalesced(outputs, inputs, opts);
  return composition_->reduce_scatter_tensor_coalesced(outputs, inputs, opts);
}

WorkPtr ComposedPath::reduce(std::vector<at::Tensor>& tensors, const c10d::ReduceOptions& opts) {
  if (coalescing_) return engine().reduce(tensors, opts);
  return composition_->reduce(tensors, opts);
}

WorkPtr ComposedPath::allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                          std::vector<at::Tensor>& inputs, const c10d::AllgatherOptions& opts) {
  if (coalescing_) return engine().allgather_coalesced(outputs, inputs, opts);
  return composition_->allgather_coalesced(outputs, inputs, opts);
}

void ComposedPath::startCoalescing() {
  engine().startCoalescing();
  coalescing_ = true;
}

WorkPtr ComposedPath::endCoalescing() {
  coalescing_ = false;
  return engine().endCoalescing();
}

WorkPtr ComposedPath::broadcast(std::vector<at::Tensor>& tensors, const c10d::BroadcastOptions& opts) {
  return engine().broadcast(tensors, opts);
}

WorkPtr ComposedPath::allgather(std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
                                const c10d::AllgatherOptions& opts) {
  return engine().allgather(outputs, inputs, opts);
}

WorkPtr ComposedPath::_allgather_base(at::Tensor& output, at::Tensor& input, const c10d::AllgatherOptions& opts) {
  return engine()._allgather_base(output, input, opts);
}

WorkPtr ComposedPath::allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                      std::vector<at::Tensor>& inputs,
                                                      const c10d::AllgatherOptions& opts) {
  return engine().allgather_into_tensor_coalesced(outputs, inputs, opts);
}

WorkPtr ComposedPath::gather(std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
                             const c10d::GatherOptions& opts) {
  return engine().gather(outputs, inputs, opts);
}

WorkPtr ComposedPath::scatter(std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
                              const c10d::ScatterOptions& opts) {
  return engine().scatter(outputs, inputs, opts);
}

WorkPtr ComposedPath::alltoall_base(at::Tensor& output, at::Tensor& input, std::vector<int64_t>& output_split_sizes,
                                    std::vector<int64_t>& input_split_sizes, const c10d::AllToAllOptions& opts) {
  return engine().alltoall_base(output, input, output_split_sizes, input_split_sizes, opts);
}

WorkPtr ComposedPath::alltoall(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                               const c10d::AllToAllOptions& opts) {
  return engine().alltoall(outputs, inputs, opts);
}

WorkPtr ComposedPath::send(std::vector<at::Tensor>& tensors, int dst_rank, int tag) {
  return engine().send(tensors, dst_rank, tag);
}

WorkPtr ComposedPath::recv(std::vector<at::Tensor>& tensors, int src_rank, int tag) {
  return engine().recv(tensors, src_rank, tag);
}

WorkPtr ComposedPath::recvAnysource(std::vector<at::Tensor>& tensors, int tag) {
  return engine().recvAnysource(tensors, tag);
}

WorkPtr ComposedPath::barrier(const c10d::BarrierOptions& opts) { return engine().barrier(opts); }

}  // namespace cnccl::composed

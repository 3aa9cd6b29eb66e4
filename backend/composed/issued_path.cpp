#include "backend/composed/issued_path.h"

#include "backend/work.h"

namespace cnccl::composed {

using WorkPtr = c10::intrusive_ptr<c10d::Work>;

IssuedPath::IssuedPath(c10::intrusive_ptr<ComposedPath> composed, c10::intrusive_ptr<c10d::Backend> engine,
                       std::string group_name, const Config& config, std::chrono::milliseconds timeout, Stats& stats,
                       std::function<std::string(int)> peer_exited)
    : c10d::Backend(composed->getRank(), composed->getSize()),
      composed_(composed),
      issuer_(std::move(engine), std::move(group_name), std::move(peer_exited)),
      config_(config),
      timeout_(timeout),
      stats_(stats) {}

// gloo itself belongs to the caller that built it (the Python registration).
// abort() never waits for peers: the issuer thread may be blocked on one until its job's timeout.
// The threads are joined by shutdown() or when the group is destroyed.
// The issuer's threads end before the members their jobs read (closures own the composed path and
// the stats live in the owning ProcessGroupCNCCL, which destroys this first).
IssuedPath::~IssuedPath() { issuer_.close("the process group was destroyed"); }

void IssuedPath::abort() { issuer_.abort("abort() was called on the process group"); }

void IssuedPath::shutdown() { issuer_.close("shutdown() was called on the process group"); }

WorkPtr IssuedPath::issue(Call call, Issuer::Issue issue) {
  for (const auto& t : call.traffic) stats_.record(t);
  const uint64_t seq = seq_.fetch_add(call.signatures.size());
  // The composition's casts run within the issue, on the issuer's thread.
  Issuer::Issue counted = [issue = std::move(issue), stats = &stats_, telemetry = config_.telemetry]() mutable {
    const CastCensus census(stats, telemetry);
    return issue();
  };
  auto work = issuer_.submit(call.type, call.name, seq, call.signature(), call.outputs, call.timeout, std::move(counted));
  profile_collective(call.type, call.outputs, call.wire(), work->getFuture());
  return work;
}

WorkPtr IssuedPath::allreduce(std::vector<at::Tensor>& tensors, const c10d::AllreduceOptions& opts) {
  return issue(calls::allreduce(tensors, opts, group()),
               [=, composed = composed_]() mutable { return composed->allreduce(tensors, opts); });
}

WorkPtr IssuedPath::allreduce_coalesced(std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) {
  return issue(calls::allreduce_coalesced(tensors, opts, group()),
               [=, composed = composed_]() mutable { return composed->allreduce_coalesced(tensors, opts); });
}

WorkPtr IssuedPath::reduce_scatter(std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
                                   const c10d::ReduceScatterOptions& opts) {
  return issue(calls::reduce_scatter(outputs, inputs, opts, group()),
               [=, composed = composed_]() mutable { return composed->reduce_scatter(outputs, inputs, opts); });
}

WorkPtr IssuedPath::_reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                         const c10d::ReduceScatterOptions& opts) {
  return issue(calls::reduce_scatter_tensor(output, input, opts, group()),
               [=, composed = composed_]() mutable { return composed->_reduce_scatter_base(output, input, opts); });
}

WorkPtr IssuedPath::reduce_scatter_tensor_coalesced(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                                    const c10d::ReduceScatterOptions& opts) {
  return issue(calls::reduce_scatter_tensor_coalesced(outputs, inputs, opts, group()),
               [=, composed = composed_]() mutable {
                 return composed->reduce_scatter_tensor_coalesced(outputs, inputs, opts);
               });
}

WorkPtr IssuedPath::reduce(std::vector<at::Tensor>& tensors, const c10d::ReduceOptions& opts) {
  return issue(calls::reduce(tensors, opts, group()),
               [=, composed = composed_]() mutable { return composed->reduce(tensors, opts); });
}

WorkPtr IssuedPath::allgather(std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
                              const c10d::AllgatherOptions& opts) {
  return issue(calls::allgather(outputs, inputs, opts, group()),
               [=, composed = composed_]() mutable { return composed->allgather(outputs, inputs, opts); });
}

WorkPtr IssuedPath::_allgather_base(at::Tensor& output, at::Tensor& input, const c10d::AllgatherOptions& opts) {
  return issue(calls::allgather_into_tensor(output, input, opts, group()),
               [=, composed = composed_]() mutable { return composed->_allgather_base(output, input, opts); });
}

WorkPtr IssuedPath::allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
                                        const c10d::AllgatherOptions& opts) {
  return issue(calls::allgather_coalesced(outputs, inputs, opts, group()),
               [=, composed = composed_]() mutable { return composed->allgather_coalesced(outputs, inputs, opts); });
}

WorkPtr IssuedPath::allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                                    const c10d::AllgatherOptions& opts) {
  return issue(calls::allgather_into_tensor_coalesced(outputs, inputs, opts, group()),
               [=, composed = composed_]() mutable {
                 return composed->allgather_into_tensor_coalesced(outputs, inputs, opts);
               });
}

WorkPtr IssuedPath::broadcast(std::vector<at::Tensor>& tensors, const c10d::BroadcastOptions& opts) {
  return issue(calls::broadcast(tensors, opts, group()),
               [=, composed = composed_]() mutable { return composed->broadcast(tensors, opts); });
}

WorkPtr IssuedPath::gather(std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
                           const c10d::GatherOptions& opts) {
  return issue(calls::gather(outputs, inputs, opts, group()),
               [=, composed = composed_]() mutable { return composed->gather(outputs, inputs, opts); });
}

WorkPtr IssuedPath::scatter(std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
                            const c10d::ScatterOptions& opts) {
  return issue(calls::scatter(outputs, inputs, opts, group()),
               [=, composed = composed_]() mutable { return composed->scatter(outputs, inputs, opts); });
}

WorkPtr IssuedPath::alltoall_base(at::Tensor& output, at::Tensor& input, std::vector<int64_t>& output_split_sizes,
                                  std::vector<int64_t>& input_split_sizes, const c10d::AllToAllOptions& opts) {
  return issue(calls::alltoall_single(output, input, output_split_sizes, input_split_sizes, opts, group()),
               [=, composed = composed_]() mutable {
                 return composed->alltoall_base(output, input, output_split_sizes, input_split_sizes, opts);
               });
}

WorkPtr IssuedPath::alltoall(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                             const c10d::AllToAllOptions& opts) {
  return issue(calls::alltoall(outputs, inputs, opts, group()),
               [=, composed = composed_]() mutable { return composed->alltoall(outputs, inputs, opts); });
}

WorkPtr IssuedPath::barrier(const c10d::BarrierOptions& opts) {
  return issue(calls::barrier(opts, group()),
               [=, composed = composed_]() mutable { return composed->barrier(opts); });
}

WorkPtr IssuedPath::send(std::vector<at::Tensor>& tensors, int dst_rank, int tag) {
  return composed_->send(tensors, dst_rank, tag);
}

WorkPtr IssuedPath::recv(std::vector<at::Tensor>& tensors, int src_rank, int tag) {
  return composed_->recv(tensors, src_rank, tag);
}

WorkPtr IssuedPath::recvAnysource(std::vector<at::Tensor>& tensors, int tag) {
  return composed_->recvAnysource(tensors, tag);
}

}  // namespace cnccl::composed

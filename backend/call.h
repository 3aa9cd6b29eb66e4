// A collective on CPU tensors, checked and described once for both CPU paths: the host path
// (host/host_path.h) and the gloo composition's issuer (composed/issued_path.h) compare its
// signature across ranks before moving any data (docs/design.md, "Agreement"). Making a Call
// validates the arguments: bad input fails here, on the caller's thread, naming the problem.
#pragma once

#include <torch/csrc/distributed/c10d/Types.hpp>

#include <chrono>
#include <string>
#include <vector>

#include "backend/policy.h"

namespace cnccl {

// What a failure leaves in the caller's tensors (ends the error message).
constexpr const char* kUntouched = "the caller's tensors were not modified";
constexpr const char* kOutputsUndefined = "output tensors may be partially written; inputs were not modified";
// Results written into the caller's tensors as they arrive (the shared-memory allreduce's default).
constexpr const char* kPartialResults =
    "the caller's tensors may hold partial results (CNCCL_UNTOUCHED_ON_FAILURE=1 / "
    "Options(untouched_on_failure=True) keeps them as they were)";
// Each tensor of a coalesced call is written once its own part completes.
constexpr const char* kCoalescedFailure =
    "tensors of this coalesced call before the one that failed may already hold their results; the others were "
    "not modified";

struct Call {
  c10d::OpType type = c10d::OpType::UNKNOWN;
  const char* name = "";  // torch's name of the collective ("allreduce", "all_to_all_single")
  std::chrono::milliseconds timeout;
  const char* on_failure = kUntouched;
  bool coalesced = false;
  // False when the caller waits for the result at once (c10d's asyncOp: `async_op=False` in Python).
  bool async_op = true;
  // Per tensor (a coalesced call has several, every other call one): what every rank must agree
  // on, what it costs on the wire, and for reductions the policy's plan.
  std::vector<std::string> signatures;
  std::vector<Traffic> traffic;
  std::vector<Plan> plans;
  std::vector<at::Tensor> outputs;  // what the work's result() and future hold

  // What ranks compare first: a coalesced call's first header names every part, so ranks that
  // disagree on any part fail before the first tensor's result is written.
  std::string signature() const;
  // The wire of its compressed tensors ("fp16", "bf16"), or "none".
  std::string wire() const;
};

// The group a call is made in.
struct Group {
  const Config& config;
  int rank;
  int size;
  std::chrono::milliseconds timeout;  // Options.timeout, for calls that leave theirs unset
};

// all_to_all_single's byte offsets and lengths, per peer.
struct AlltoallLayout {
  std::vector<size_t> send_off, send_len, recv_off, recv_len;
};

namespace calls {

Call allreduce(const std::vector<at::Tensor>& tensors, const c10d::AllreduceOptions& opts, const Group& g);
Call allreduce_coalesced(const std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts,
                         const Group& g);
Call reduce_scatter(const std::vector<at::Tensor>& outputs, const std::vector<std::vector<at::Tensor>>& inputs,
                    const c10d::ReduceScatterOptions& opts, const Group& g);
Call reduce_scatter_tensor(const at::Tensor& output, const at::Tensor& input, const c10d::ReduceScatterOptions& opts,
                           const Group& g);
Call reduce_scatter_tensor_coalesced(const std::vector<at::Tensor>& outputs, const std::vector<at::Tensor>& inputs,
                                     const c10d::ReduceScatterOptions& opts, const Group& g);
Call reduce(const std::vector<at::Tensor>& tensors, const c10d::ReduceOptions& opts, const Group& g);
Call allgather(const std::vector<std::vector<at::Tensor>>& outputs, const std::vector<at::Tensor>& inputs,
               const c10d::AllgatherOptions& opts, const Group& g);
Call allgather_into_tensor(const at::Tensor& output, const at::Tensor& input, const c10d::AllgatherOptions& opts,
                           const Group& g);
Call allgather_coalesced(const std::vector<std::vector<at::Tensor>>& outputs, const std::vector<at::Tensor>& inputs,
                         const c10d::AllgatherOptions& opts, const Group& g);
Call allgather_into_tensor_coalesced(const std::vector<at::Tensor>& outputs, const std::vector<at::Tensor>& inputs,
                                     const c10d::AllgatherOptions& opts, const Group& g);
Call broadcast(const std::vector<at::Tensor>& tensors, const c10d::BroadcastOptions& opts, const Group& g);
Call gather(const std::vector<std::vector<at::Tensor>>& outputs, const std::vector<at::Tensor>& inputs,
            const c10d::GatherOptions& opts, const Group& g);
Call scatter(const std::vector<at::Tensor>& outputs, const std::vector<std::vector<at::Tensor>>& inputs,
             const c10d::ScatterOptions& opts, const Group& g);
Call alltoall_single(const at::Tensor& output, const at::Tensor& input, const std::vector<int64_t>& output_splits,
                     const std::vector<int64_t>& input_splits, const c10d::AllToAllOptions& opts, const Group& g,
                     AlltoallLayout* layout = nullptr);
Call alltoall(const std::vector<at::Tensor>& outputs, const std::vector<at::Tensor>& inputs,
              const c10d::AllToAllOptions& opts, const Group& g);
Call barrier(const c10d::BarrierOptions& opts, const Group& g);

}  // namespace calls
}  // namespace cnccl

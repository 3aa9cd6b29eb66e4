// ProcessGroupCNCCL: the c10d Backend registered as "cnccl". Compresses allreduce and
// reduce_scatter of wide floats per the policy. CPU tensors run on the host path (UCX), or with
// cpu_engine=gloo on the composed path over torch's ProcessGroupGloo; CUDA tensors run on the
// composed path over torch's ProcessGroupNCCL.
#pragma once

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <mutex>

#include "backend/options.h"
#include "backend/policy.h"
#include "backend/stats.h"
#include "backend/work.h"

namespace cnccl {

namespace host {
class Comm;
class Executor;
}  // namespace host

namespace composed {
class Composition;
class Issuer;
}  // namespace composed

class ProcessGroupCNCCL : public c10d::Backend {
 public:
  // `cpu_engine`: with Options.cpu_engine=gloo, the ProcessGroupGloo the composed path runs CPU
  // tensors on (torch's wheel ships no gloo headers, so the caller builds it; the Python
  // registration does). Must be null otherwise.
  ProcessGroupCNCCL(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                    c10::intrusive_ptr<cnccl::Options> options = c10::make_intrusive<cnccl::Options>(),
                    c10::intrusive_ptr<c10d::Backend> cpu_engine = {});
  ~ProcessGroupCNCCL() override;

  const std::string getBackendName() const override { return "cnccl"; }
  c10::intrusive_ptr<c10d::Backend::Options> getBackendOptions() override { return options_; }
  const Config& config() const { return config_; }
  // The timeout in force: Options.timeout, which the Python registration sets to the group's.
  std::chrono::milliseconds timeout() const { return options_->timeout; }
  std::map<std::string, uint64_t> stats() const;
  uint64_t getSequenceNumberForGroup() override { return seq_.load(); }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts = {}) override;
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts = {}) override;
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                     const c10d::AllreduceCoalescedOptions& opts = {}) override;
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors,
                                        const c10d::ReduceOptions& opts = {}) override;
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts = {}) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts = {}) override;
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                     std::vector<at::Tensor>& inputs,
                                                     const c10d::AllgatherOptions& opts = {}) override;
  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                 std::vector<at::Tensor>& inputs,
                                                                 const c10d::AllgatherOptions& opts = {}) override;
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs,
                                        std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts = {}) override;
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs,
                                         std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts = {}) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts = {}) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                      const c10d::ReduceScatterOptions& opts = {}) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                 std::vector<at::Tensor>& inputs,
                                                                 const c10d::ReduceScatterOptions& opts = {}) override;
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& output_split_sizes,
                                               std::vector<int64_t>& input_split_sizes,
                                               const c10d::AllToAllOptions& opts = {}) override;
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts = {}) override;
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst_rank, int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src_rank, int tag) override;
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors, int tag) override;
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts = {}) override;

  // The NCCL version the CUDA path runs with (as ncclGetVersion reports it); 0 when this build
  // has no CUDA path.
  static int cuda_nccl_version();

  // Creates the CUDA path's NCCL communicator now (init_process_group(device_id=...)).
  void eagerConnectSingleDevice(at::Device device) override;

  // Ends every outstanding and future operation with an error; returns without waiting on peers.
  void abort() override;
  void shutdown() override;

 private:
  // A collective's body, run on the executor thread after comm.begin(). `scratch` hands out
  // reusable buffers (index 0: the wire workspace) so steady-state steps allocate nothing.
  using Body = std::function<void(HostWork&)>;

  // What the call is with cpu_engine=gloo: the engine's own call, or the composition's over it.
  using EngineCall = std::function<c10::intrusive_ptr<c10d::Work>()>;

  // The one funnel of CPU collectives. `signature`: what every rank must agree on for this call
  // (see host::Comm::begin); `body` runs it on the host path, `engine_call` with cpu_engine=gloo
  // (through the Issuer, which checks the same agreement first).
  c10::intrusive_ptr<c10d::Work> enqueue(c10d::OpType type, const char* name, std::string signature,
                                         std::vector<at::Tensor> outputs, std::chrono::milliseconds timeout,
                                         const char* on_failure, EngineCall engine_call, Body body,
                                         int seq_count = 1);
  c10::intrusive_ptr<c10d::Work> enqueue_p2p(c10d::OpType type, at::Tensor tensor, int peer, int tag, bool is_send);
  // The composed path over NCCL for CUDA tensors (the first one's device), else null. Created on
  // first use; a build without CUDA says so.
  composed::Composition* cuda_for(const at::Tensor& t, const char* op);
  composed::Composition* cuda_for(const std::vector<at::Tensor>& ts, const char* op);
  composed::Composition& cuda_composed(const char* op);
  std::shared_ptr<composed::Composition> cuda_created();  // null until the first CUDA operation

  std::chrono::milliseconds timeout_of(std::chrono::milliseconds requested) const;
  char* scratch(int which, size_t bytes);

  // Bodies shared by the list, tensor and coalesced forms.
  void run_allreduce(const at::Tensor& tensor, const Plan& plan);
  void run_reduce_scatter(const std::vector<at::Tensor>& inputs, const at::Tensor& output, const Plan& plan);
  void run_allgather(const at::Tensor& input, char* out);

  c10::intrusive_ptr<c10d::Store> store_;
  c10::intrusive_ptr<cnccl::Options> options_;
  Config config_;
  Stats stats_;
  std::atomic<uint64_t> seq_{0};
  // The host path; null with cpu_engine=gloo.
  std::unique_ptr<host::Comm> comm_;
  std::vector<std::vector<char>> scratch_;
  std::string broken_;  // executor thread only: the first failure, after which the group is unusable
  std::unique_ptr<host::Executor> executor_;
  // cpu_engine=gloo only: the composition over ProcessGroupGloo, and the thread that issues to it.
  std::shared_ptr<composed::Composition> cpu_composed_;
  std::unique_ptr<composed::Issuer> issuer_;
  c10d::Backend& engine();
  std::mutex cuda_mutex_;
  std::shared_ptr<composed::Composition> cuda_;
};

}  // namespace cnccl

// ProcessGroupCNCCL: the c10d Backend registered as "cnccl". It forwards every call to the path
// for its tensors' device (docs/design.md, "Two paths"): CPU tensors to the host path
// (host/host_path.h: cnccl's own collectives over UCX) or, with cpu_engine=gloo, to the composed
// path over torch's ProcessGroupGloo (composed/issued_path.h); CUDA tensors to the composed path
// over torch's ProcessGroupNCCL (composed/composed_path.h). Each path compresses allreduce and
// reduce_scatter of wide floats as the policy (policy.h) decides.
#pragma once

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <exception>
#include <map>
#include <mutex>
#include <optional>

#include "backend/options.h"
#include "backend/stats.h"

namespace cnccl {
namespace composed {
class Device;
}

namespace host {
class HostPath;
}  // namespace host

class ProcessGroupCNCCL : public c10d::Backend {
 public:
  // `cpu_engine`: with Options.cpu_engine=gloo, the ProcessGroupGloo the composed path runs CPU
  // tensors on (torch's wheel ships no gloo headers, so the caller builds it; the Python
  // registration does). Must be null otherwise. `cuda_path`: what CUDA tensors go to instead of
  // the composed path over ProcessGroupNCCL (a test's double); null: that path, made at the first
  // CUDA call. `cuda_engine`: with Options.cuda_engine=gloo in a build with the CUDA path, the
  // ProcessGroupGloo that path runs CUDA tensors on instead of NCCL (built by the caller, as
  // `cpu_engine`); must be null otherwise.
  ProcessGroupCNCCL(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                    c10::intrusive_ptr<cnccl::Options> options = c10::make_intrusive<cnccl::Options>(),
                    c10::intrusive_ptr<c10d::Backend> cpu_engine = {},
                    c10::intrusive_ptr<c10d::Backend> cuda_path = {},
                    c10::intrusive_ptr<c10d::Backend> cuda_engine = {});
  // No destructor of its own: each path ends itself as its engine does when the group was not shut
  // down (the host path and the gloo issuer fail what is outstanding; torch's ProcessGroupNCCL
  // aborts its communicators, never waiting for a peer).

  const std::string getBackendName() const override { return "cnccl"; }
  c10::intrusive_ptr<c10d::Backend::Options> getBackendOptions() override { return options_; }
  const Config& config() const { return config_; }
  // The timeout in force: Options.timeout, which the Python registration sets to the group's.
  std::chrono::milliseconds timeout() const { return options_->timeout; }
  std::map<std::string, uint64_t> stats() const;
  // The relative L2 error of the last compressed collective's own contribution (telemetry=error).
  double quantization_error() const { return stats_.quantization_error.load(); }
  // What carries CPU tensors' collectives: "shm", "ucx (<why not shm>)" or "gloo".
  std::string cpu_transport() const;
  // The wire of CPU tensors' sums at each level (HostPath::wire_levels).
  std::string wire_levels() const;
  uint64_t getSequenceNumberForGroup() override { return cpu_->getSequenceNumberForGroup(); }

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
  // Whether this build has the host path (cpu_engine=ucx): not in a build without UCX.
  static bool host_path_built();

  // Creates the CUDA path's NCCL communicator now (init_process_group(device_id=...)).
  void eagerConnectSingleDevice(at::Device device) override;

  // Ends every outstanding and future operation with an error; returns without waiting on peers.
  void abort() override;
  void shutdown() override;

  // A coalescing window (batch_isend_irecv, _coalescing_manager): CUDA calls in it go to NCCL as
  // one group, ProcessGroupNCCL's startCoalescing() called before the first of them; CPU calls are
  // issued as they come (their point-to-point messages never wait on each other), and the work
  // endCoalescing() returns completes once every one of the window's sends and receives has.
  bool supportsCoalescing() const override { return true; }
  void startCoalescing() override;
  c10::intrusive_ptr<c10d::Work> endCoalescing() override;

 private:
  // The path that runs a call whose first tensor is `t` (docs/design.md, "Two paths").
  c10d::Backend& path_for(const at::Tensor& t, const char* op);
  c10d::Backend& path_for(const std::vector<at::Tensor>& ts, const char* op);
  // path_for, for the calls whose bytes the settings change (allreduce, reduce_scatter): on CUDA
  // first the ranks' agreement on those settings, once (docs/design.md, "Agreement"). Never for a
  // send or receive, which torch's ProcessGroupNCCL serves between two ranks alone.
  c10d::Backend& reducing_path_for(const at::Tensor& t, const char* op);
  // What reducing_path_for refuses of a tensor, naming the setting; touches no path.
  void refuse_unsupported_reduction(const at::Tensor& t, const char* op) const;
  c10d::Backend& reducing_path_for(const std::vector<at::Tensor>& ts, const char* op);
  void agree_on_cuda_settings();
  // The composed path over NCCL (or gloo: cuda_engine), created on the first CUDA call; a build without
  // CUDA says so.
  c10d::Backend& cuda_path(const char* op);
  // Throws a ValueError for what cuda_engine=gloo cannot run on CUDA tensor `t` (op, a window, capture).
  void refuse_what_gloo_cannot(const at::Tensor& t, const char* op);
  c10::intrusive_ptr<c10d::Backend> cuda_created();  // null until the first CUDA operation
  // A point-to-point work, kept for the window's work when a window is open.
  c10::intrusive_ptr<c10d::Work> in_window(c10::intrusive_ptr<c10d::Work> work, const std::vector<at::Tensor>& tensors);

  struct Window {
    bool cuda_started = false;
    std::vector<c10::intrusive_ptr<c10d::Work>> cpu_works;
  };
  std::optional<Window> window_;  // open between startCoalescing() and endCoalescing()

  c10::intrusive_ptr<c10d::Store> store_;
  c10::intrusive_ptr<cnccl::Options> options_;
  Config config_;
  Stats stats_;
  // CPU tensors: the host path, or with cpu_engine=gloo the issued composed path.
  c10::intrusive_ptr<c10d::Backend> cpu_;
  host::HostPath* host_ = nullptr;  // cpu_ when it is the host path
  mutable std::mutex cuda_mutex_;
  c10::intrusive_ptr<c10d::Backend> cuda_;
  c10::intrusive_ptr<c10d::Backend> cuda_gloo_;  // the CUDA path's engine with cuda_engine=gloo
  std::shared_ptr<composed::Device> cuda_device_;  // cuda_'s device, whose kernels count their casts (cuda_mutex_)
  std::mutex agreement_mutex_;  // agree_on_cuda_settings
  bool cuda_agreed_ = false;
  std::exception_ptr cuda_disagreement_;
};

}  // namespace cnccl

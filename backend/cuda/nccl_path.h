// CUDA tensors (design.md §3): every collective goes to a ProcessGroupNCCL that cnccl holds;
// allreduce and reduce_scatter of eligible tensors travel as 16-bit copies and are restored in
// place. Only this directory includes CUDA and NCCL headers.
#pragma once

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <c10/core/Stream.h>

#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "backend/options.h"
#include "backend/policy.h"
#include "backend/stats.h"

namespace cnccl::cuda {

// What the outer group passes down when the CUDA path is first needed.
struct NcclPathArgs {
  c10::intrusive_ptr<c10d::Store> store;  // the group's store; the inner group uses a sub-prefix of it
  int rank = 0;
  int size = 1;
  const cnccl::Options* options = nullptr;
  const Config* config = nullptr;
  Stats* stats = nullptr;
  std::string group_uid;
  std::string group_desc;
  std::optional<at::Device> bound_device;
};

class NcclPath {
 public:
  explicit NcclPath(const NcclPathArgs& args);
  ~NcclPath();

  // The inner ProcessGroupNCCL: every collective that is not compressed goes straight to it.
  c10d::Backend& inner() { return *inner_; }

  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors, const c10d::AllreduceOptions& opts);
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                     const c10d::AllreduceCoalescedOptions& opts);
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts);
  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor(at::Tensor& output, at::Tensor& input,
                                                       const c10d::ReduceScatterOptions& opts);
  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                 std::vector<at::Tensor>& inputs,
                                                                 const c10d::ReduceScatterOptions& opts);

  // The NCCL version this process loaded (e.g. 23007 for 2.30.7).
  static int loaded_nccl_version();

 private:
  // One tensor of a compressed collective: `wire` (16-bit) is reduced by NCCL, then restored
  // into `wide`, the caller's tensor, with the plan's post-scale.
  struct Restore {
    at::Tensor wire;
    at::Tensor wide;
    Plan plan;
  };

  Plan plan(const at::Tensor& t, int64_t nbytes, const c10d::ReduceOp& op) const;
  at::Tensor cast(const at::Tensor& wide, const Plan& plan) const;
  void cast_into(const at::Tensor& wide, const at::Tensor& wire, const Plan& plan) const;
  // Enqueues the restores on the side stream behind `inner_works` and returns the work whose
  // future completes (stream-ordered) once they have run.
  c10::intrusive_ptr<c10d::Work> finish(c10d::OpType type, std::vector<c10::intrusive_ptr<c10d::Work>> inner_works,
                                        std::vector<Restore> restores, std::vector<at::Tensor> outputs);
  c10::Stream side_stream(c10::DeviceIndex device);

  const int rank_;
  const int size_;
  const Config config_;
  Stats& stats_;
  c10::intrusive_ptr<c10d::Backend> inner_;
  std::mutex streams_mutex_;
  std::vector<std::optional<c10::Stream>> side_streams_;  // one per device, taken from the pool on first use
};

}  // namespace cnccl::cuda

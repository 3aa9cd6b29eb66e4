// The CUDA path over NCCL (design.md §3): every collective goes to a ProcessGroupNCCL that cnccl
// holds; allreduce and reduce_scatter of eligible tensors travel as 16-bit copies and are restored
// in place. Only this directory's .cpp files include CUDA and NCCL headers.
#pragma once

#include <c10/core/Stream.h>

#include <mutex>
#include <optional>
#include <vector>

#include "backend/cuda/cuda_path.h"
#include "backend/policy.h"

namespace cnccl::cuda {

class NcclPath final : public CudaPath {
 public:
  explicit NcclPath(const CudaPathArgs& args);
  ~NcclPath() override;

  c10d::Backend& inner() override { return *inner_; }

  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                     const c10d::AllreduceCoalescedOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor(at::Tensor& output, at::Tensor& input,
                                                       const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                 std::vector<at::Tensor>& inputs,
                                                                 const c10d::ReduceScatterOptions& opts) override;

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

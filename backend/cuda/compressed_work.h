// The Work of a compressed CUDA collective: the inner NCCL work(s) plus the restore that runs
// after them on cnccl's side stream. Like NCCL's own works, waiting is stream-ordered: wait()
// makes the caller's current stream wait for the restore, and the future (created for the
// CUDA device, completed on the side stream after the restore was enqueued) does the same.
#pragma once

#include <ATen/core/ivalue.h>
#include <ATen/cuda/CUDAEvent.h>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <memory>

namespace cnccl::cuda {

class CompressedWork : public c10d::Work {
 public:
  CompressedWork(int rank, c10d::OpType type, std::vector<c10::intrusive_ptr<c10d::Work>> inner,
                 c10::intrusive_ptr<c10::ivalue::Future> future, std::shared_ptr<at::cuda::CUDAEvent> restored,
                 std::vector<at::Tensor> outputs);

  bool isCompleted() override;
  bool isSuccess() const override;
  std::exception_ptr exception() const override;
  bool wait(std::chrono::milliseconds timeout = kNoTimeout) override;
  void synchronize() override;
  void abort() override;
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }
  std::vector<at::Tensor> result() override { return outputs_; }
  uint64_t getSequencenumber() const override { return inner_.front()->getSequencenumber(); }

 private:
  const std::vector<c10::intrusive_ptr<c10d::Work>> inner_;
  const c10::intrusive_ptr<c10::ivalue::Future> future_;
  const std::shared_ptr<at::cuda::CUDAEvent> restored_;
  const std::vector<at::Tensor> outputs_;
};

}  // namespace cnccl::cuda

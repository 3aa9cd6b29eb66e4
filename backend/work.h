// The Work a cnccl collective returns. Its future holds the caller's own output tensors and
// completes only after the result has been written into them (restored, for compressed ops).
#pragma once

#include <ATen/core/ivalue.h>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <atomic>

namespace cnccl {

class HostWork : public c10d::Work {
 public:
  HostWork(int rank, c10d::OpType op, uint64_t seq, std::vector<at::Tensor> outputs);

  // Called once by the executor: success, or the collective's error.
  void complete();
  void fail(std::exception_ptr error);
  void set_source_rank(int rank) { source_rank_ = rank; }

  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }
  std::vector<at::Tensor> result() override { return outputs_; }
  uint64_t getSequencenumber() const override { return seq_; }
  int sourceRank() const override;

 private:
  const uint64_t seq_;
  std::vector<at::Tensor> outputs_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
  std::atomic<int> source_rank_{-1};
};

}  // namespace cnccl

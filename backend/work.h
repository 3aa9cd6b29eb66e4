// The Work a cnccl collective returns on the host path, and the torch.profiler range every cnccl
// collective records on either path. A HostWork's future holds the caller's own output tensors
// and completes only after the result has been written into them (restored, for compressed ops).
#pragma once

#include <ATen/core/ivalue.h>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <atomic>
#include <functional>
#include <string>
#include <vector>

namespace cnccl {

// Opens the profiler range of a collective, named as torch's backends name theirs
// ("cnccl:all_reduce"), with the input tensors (sizes and dtypes, under record_shapes) and the
// wire ("fp16", "bf16" or "none") as a keyword input; it closes when `future` completes. Nothing
// happens when no profiler is on.
void profile_collective(c10d::OpType type, const std::vector<at::Tensor>& inputs, const std::string& wire,
                        const c10::intrusive_ptr<c10::ivalue::Future>& future);

class HostWork : public c10d::Work {
 public:
  HostWork(int rank, c10d::OpType op, uint64_t seq, std::vector<at::Tensor> outputs);

  // Called once by the executor: success, or the collective's error.
  void complete();
  void fail(std::exception_ptr error);
  void set_source_rank(int rank) { source_rank_ = rank; }
  // Called by wait() before it blocks: lets the waiting thread run the collective itself when no
  // thread has started it yet (host/executor.h, Executor::help). Set before the work is returned.
  void set_helper(std::function<void()> help) { help_ = std::move(help); }

  bool wait(std::chrono::milliseconds timeout = kNoTimeout) override;

  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }
  std::vector<at::Tensor> result() override { return outputs_; }
  uint64_t getSequencenumber() const override { return seq_; }
  int sourceRank() const override;

 private:
  const uint64_t seq_;
  std::vector<at::Tensor> outputs_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
  std::atomic<int> source_rank_{-1};
  std::function<void()> help_;
};

// Several works as one (a coalescing window's): complete once each is, failed as the first that
// failed.
class WorkList : public c10d::Work {
 public:
  WorkList(int rank, c10d::OpType op, std::vector<c10::intrusive_ptr<c10d::Work>> works);

  bool isCompleted() override;
  bool isSuccess() const override { return exception() == nullptr; }
  std::exception_ptr exception() const override;
  bool wait(std::chrono::milliseconds timeout = kNoTimeout) override;
  void synchronize() override;
  void abort() override;

 private:
  const std::vector<c10::intrusive_ptr<c10d::Work>> works_;
};

}  // namespace cnccl

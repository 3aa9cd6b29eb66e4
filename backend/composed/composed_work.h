// The Work of a compressed collective on the composed path: the inner engine's work(s), then the
// restores. Its future completes after the restores (stream-ordered on CUDA, as NCCL's own
// futures are); wait() surfaces the inner engine's errors as DistBackendError.
#pragma once

#include <torch/csrc/distributed/c10d/Work.hpp>

#include <functional>
#include <mutex>

#include "backend/errors.h"

#include "backend/composed/device.h"

namespace cnccl::composed {

class ComposedWork : public c10d::Work {
 public:
  // `inner` holds the works the engine returned (none when it ran synchronously); `result` is
  // completed, or failed, by the composition once the restores ran. `context` starts every
  // error message ("cnccl allreduce (over gloo)").
  ComposedWork(int rank, c10d::OpType type, std::string context, uint64_t seq,
               std::vector<c10::intrusive_ptr<c10d::Work>> inner, FuturePtr result, std::vector<at::Tensor> outputs);

  // Set by the composition when the restores are enqueued: whether the device has run them.
  void set_done_probe(std::function<bool()> probe);

  bool isCompleted() override;
  bool isSuccess() const override;
  std::exception_ptr exception() const override;
  // Stream-ordered on CUDA: the caller's current stream waits for the restores; the host blocks
  // only where the inner engine's wait() does (gloo; NCCL with TORCH_NCCL_BLOCKING_WAIT=1).
  bool wait(std::chrono::milliseconds timeout = kNoTimeout) override;
  void synchronize() override;
  void blockCurrentStream() override;
  void abort() override;
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return result_; }
  std::vector<at::Tensor> result() override { return outputs_; }
  uint64_t getSequencenumber() const override { return seq_; }

 private:
  const std::string context_;
  const uint64_t seq_;
  const std::vector<c10::intrusive_ptr<c10d::Work>> inner_;
  const FuturePtr result_;
  const std::vector<at::Tensor> outputs_;
  std::mutex probe_mutex_;
  std::function<bool()> done_probe_;
};

}  // namespace cnccl::composed

// The Work of a compressed collective on the composed path: the inner engine's work(s), then the
// restores. Its future completes once the restores are enqueued, on the stream they run on (as
// NCCL's own futures do); wait() orders the caller's current stream after them and surfaces the
// inner engine's errors as DistBackendError, including those its watchdog sets later.
#pragma once

#include <torch/csrc/distributed/c10d/Work.hpp>

#include <mutex>

#include "backend/errors.h"

#include "backend/composed/device.h"

namespace cnccl::composed {

using FuturePtr = c10::intrusive_ptr<c10::ivalue::Future>;

class ComposedWork : public c10d::Work {
 public:
  // `inner` holds the engine's works (none for calls it ran synchronously); `result` is completed,
  // or failed, by the composition once the restores are enqueued. `context` starts every error
  // message ("cnccl allreduce (over gloo)").
  ComposedWork(int rank, c10d::OpType type, std::string context, uint64_t seq,
               std::vector<c10::intrusive_ptr<c10d::Work>> inner, FuturePtr result, std::vector<at::Tensor> outputs,
               std::shared_ptr<Device> device);

  // Set by the composition with the restores: the point after them on the stream they run on.
  void set_restored(EventPtr restored);

  bool isCompleted() override;
  bool isSuccess() const override;
  // The first inner work's error (an NCCL watchdog may set one after the restores were enqueued),
  // else the composition's own.
  std::exception_ptr exception() const override;
  // The caller's current stream waits for the restores; the host blocks only where the inner
  // engine's wait() does (gloo; NCCL with TORCH_NCCL_BLOCKING_WAIT=1).
  bool wait(std::chrono::milliseconds timeout = kNoTimeout) override;
  void synchronize() override;
  void blockCurrentStream() override;
  void abort() override;
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return result_; }
  std::vector<at::Tensor> result() override { return outputs_; }
  uint64_t getSequencenumber() const override { return seq_; }

 private:
  // Waits for the result future, rethrows its error, and orders the current stream after the restores.
  void wait_restored();

  const std::string context_;
  const uint64_t seq_;
  const std::vector<c10::intrusive_ptr<c10d::Work>> inner_;
  const FuturePtr result_;
  const std::vector<at::Tensor> outputs_;
  const std::shared_ptr<Device> device_;
  std::mutex mutex_;
  EventPtr restored_;
};

}  // namespace cnccl::composed

#include "backend/composed/composed_work.h"

#include <c10/util/Exception.h>

namespace cnccl::composed {

ComposedWork::ComposedWork(int rank, c10d::OpType type, std::string context, uint64_t seq,
                           std::vector<c10::intrusive_ptr<c10d::Work>> inner, FuturePtr result,
                           std::vector<at::Tensor> outputs, std::shared_ptr<Device> device)
    : c10d::Work(rank, type),
      context_(std::move(context)),
      seq_(seq),
      inner_(std::move(inner)),
      result_(std::move(result)),
      outputs_(std::move(outputs)),
      device_(std::move(device)) {}

void ComposedWork::set_restored(EventPtr restored) {
  std::lock_guard<std::mutex> lock(mutex_);
  restored_ = std::move(restored);
}

bool ComposedWork::isCompleted() {
  // Each inner work is still asked: WorkNCCL::isCompleted() is where the engine checks its communicator
  // for errors. Its answer does not complete this work: the result completes from the inner works'
  // futures, and the restore's event follows the inner collectives on the device; gloo marks its work
  // completed only after its future's callbacks (this work's restore) ran (ProcessGroupGloo.cpp,
  // AsyncWork::finishWorkGloo), so a caller whose future wait() returned could see it not completed.
  for (const auto& w : inner_) w->isCompleted();
  if (exception()) return true;
  if (!result_->completed()) return false;
  std::lock_guard<std::mutex> lock(mutex_);
  return restored_ && restored_->query();
}

// Not the inner works' isSuccess(): WorkNCCL's throws ("deprecated").
bool ComposedWork::isSuccess() const { return exception() == nullptr; }

std::exception_ptr ComposedWork::exception() const {
  for (const auto& w : inner_) {
    if (auto e = w->exception()) return errors::as_backend_error(e, context_ + ": the inner collective failed");
  }
  return result_->completed() && result_->hasError() ? result_->exception_ptr() : nullptr;
}

void ComposedWork::wait_restored() {
  result_->wait();
  if (result_->hasError()) std::rethrow_exception(result_->exception_ptr());
  EventPtr restored;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    restored = restored_;
  }
  device_->wait(restored);
}

bool ComposedWork::wait(std::chrono::milliseconds timeout) {
  try {
    // The engine's own wait raises its errors and timeouts (and blocks the host where its
    // configuration says so) before the result is consulted.
    for (const auto& w : inner_) w->wait(timeout);
  } catch (...) {
    std::rethrow_exception(
        errors::as_backend_error(std::current_exception(), context_ + ": the inner collective failed"));
  }
  wait_restored();
  return true;
}

void ComposedWork::synchronize() { wait(); }

void ComposedWork::blockCurrentStream() {
  if (auto e = exception()) std::rethrow_exception(e);
  wait_restored();
}

void ComposedWork::abort() {
  for (const auto& w : inner_) w->abort();
}

}  // namespace cnccl::composed

#include "backend/composed/composed_work.h"

#include <c10/util/Exception.h>

namespace cnccl::composed {

ComposedWork::ComposedWork(int rank, c10d::OpType type, std::string context, uint64_t seq,
                           std::vector<c10::intrusive_ptr<c10d::Work>> inner, FuturePtr result,
                           std::vector<at::Tensor> outputs)
    : c10d::Work(rank, type),
      context_(std::move(context)),
      seq_(seq),
      inner_(std::move(inner)),
      result_(std::move(result)),
      outputs_(std::move(outputs)) {}

void ComposedWork::set_done_probe(std::function<bool()> probe) {
  std::lock_guard<std::mutex> lock(probe_mutex_);
  done_probe_ = std::move(probe);
}

bool ComposedWork::isCompleted() {
  if (!result_->completed()) return false;
  if (result_->hasError()) return true;
  std::lock_guard<std::mutex> lock(probe_mutex_);
  return done_probe_ && done_probe_();
}

bool ComposedWork::isSuccess() const { return exception() == nullptr; }

std::exception_ptr ComposedWork::exception() const {
  return result_->completed() && result_->hasError() ? result_->exception_ptr() : nullptr;
}

bool ComposedWork::wait(std::chrono::milliseconds timeout) {
  try {
    // The engine's own wait raises its errors and timeouts (and blocks the host where its
    // configuration says so) before the result future is consulted.
    for (const auto& w : inner_) w->wait(timeout);
  } catch (...) {
    std::rethrow_exception(
        errors::as_backend_error(std::current_exception(), context_ + ": the inner collective failed"));
  }
  result_->wait();
  if (result_->hasError()) std::rethrow_exception(result_->exception_ptr());
  return true;
}

void ComposedWork::synchronize() { wait(); }

void ComposedWork::blockCurrentStream() {
  result_->wait();
  if (result_->hasError()) std::rethrow_exception(result_->exception_ptr());
}

void ComposedWork::abort() {
  for (const auto& w : inner_) w->abort();
}

}  // namespace cnccl::composed

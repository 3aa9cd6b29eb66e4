#include "backend/host/executor.h"

namespace cnccl::host {

Executor::Executor(Comm& comm) : comm_(comm), thread_([this] { loop(); }) {}

Executor::~Executor() { stop(); }

void Executor::submit(std::function<void()> job) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    queue_.push_back(std::move(job));
  }
  cv_.notify_one();
}

void Executor::stop() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (stopping_ && !thread_.joinable()) return;
    stopping_ = true;
  }
  cv_.notify_one();
  if (thread_.joinable()) thread_.join();
}

void Executor::loop() {
  for (;;) {
    std::function<void()> job;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      if (comm_.has_background()) {
        // Point-to-point messages in flight: poll at a short interval instead of sleeping.
        cv_.wait_for(lock, std::chrono::microseconds(50), [&] { return !queue_.empty() || stopping_; });
      } else {
        cv_.wait(lock, [&] { return !queue_.empty() || stopping_; });
      }
      if (!queue_.empty()) {
        job = std::move(queue_.front());
        queue_.pop_front();
      } else if (stopping_ && !comm_.has_background()) {
        return;
      }
    }
    if (job) {
      job();
    } else {
      if (stopping_) comm_.abort("the process group was shut down");
      while (comm_.poll()) {
      }
    }
  }
}

}  // namespace cnccl::host

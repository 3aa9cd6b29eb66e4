// The host path's single communication thread: runs queued collectives in submission order
// (the order every rank issues them) and keeps background point-to-point messages moving.
// Sleeps on a condition variable when there is nothing to do.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

#include "backend/host/comm.h"

namespace cnccl::host {

class Executor {
 public:
  explicit Executor(Comm& comm);
  ~Executor();
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;

  void submit(std::function<void()> job);
  // Finishes the queued jobs (they fail fast once the comm is aborted), then joins the thread.
  void stop();

 private:
  void loop();

  Comm& comm_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace cnccl::host

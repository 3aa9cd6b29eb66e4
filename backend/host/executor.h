// The host path's communication threads: run queued collectives in submission order (the order
// every rank issues them) and keep background point-to-point messages moving.
//
// One thread at a time leads: it owns the comm and runs the next job. Completions (a Work's
// future, whose callbacks run user code) are deferred until the leader has handed the lead on,
// because a callback may issue another collective on this group and wait for it, as PowerSGD's
// hook does: when a callback submits a job and no thread is idle, another thread is started to
// lead. Threads sleep on condition variables when there is nothing to do.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "backend/host/comm.h"

namespace cnccl::host {

class Executor {
 public:
  explicit Executor(Comm& comm);
  ~Executor();
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;

  void submit(std::function<void()> job);
  // Called by a job (or a point-to-point completion) on the leading thread: `completion` runs
  // after that thread has handed the lead on.
  void defer(std::function<void()> completion);
  // Finishes the queued jobs (they fail fast once the comm is aborted), then joins the threads.
  // Called from a completion on one of its own threads (a callback that dropped the group's last
  // reference), that thread runs what is left itself and is not joined: it finishes its callbacks
  // and exits without touching the executor again.
  void stop();

 private:
  void loop();
  // Runs one job, or polls background messages when there is none. Called while leading.
  void lead(std::unique_lock<std::mutex>& lock);
  // Runs the deferred completions, unlocked.
  void complete(std::unique_lock<std::mutex>& lock);

  Comm& comm_;
  std::mutex mutex_;
  std::condition_variable lead_cv_;  // threads waiting to lead
  std::deque<std::function<void()>> queue_;
  std::vector<std::function<void()>> completions_;  // touched by the leading thread only
  bool leading_ = false;
  bool background_ = false;  // the comm had messages in flight when the last leader finished
  bool stopping_ = false;
  int idle_ = 0;
  std::vector<std::thread> threads_;
};

}  // namespace cnccl::host

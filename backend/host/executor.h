// The host path's communication threads: run queued collectives in submission order (the order
// every rank issues them) and keep background point-to-point messages moving.
//
// One thread at a time leads: it owns the comm and runs the next job. Completions (a Work's
// future, whose callbacks run user code) are deferred until the leader has handed the lead on,
// because a callback may issue another collective on this group and wait for it, as PowerSGD's
// hook does: when a callback submits a job and no thread is idle, another thread is started to
// lead. Threads sleep on condition variables when there is nothing to do. A caller's thread may
// lead too, saving the two thread wake-ups a hand-off costs: a synchronous collective issued while
// nothing is queued runs on it at once (run_here), and a thread that waits for a job no thread has
// started runs the queue up to it (help). Such a thread runs the jobs with the executor's
// floating-point environment (MXCSR: flush-to-zero, rounding), so that which thread runs a job
// never changes a result.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "backend/host/transport/comm.h"

namespace cnccl::host {

class Executor {
 public:
  // `comm` carries the group's messages; `across`, where the group spans hosts that share memory,
  // the messages between hosts (HostPath::cross_). The idle loop polls both while either has
  // messages in flight (point-to-point ones, a failed call's notices).
  explicit Executor(Comm& comm, Comm* across = nullptr);
  ~Executor();
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;

  // Returns the job's ticket: jobs run in ticket order.
  uint64_t submit(std::function<void()> job);
  // Runs `job` on this thread, leading, then its completions, when no thread leads, nothing is
  // queued and no point-to-point message is in flight (so it keeps its place in the order);
  // otherwise returns false and `job` is untouched.
  bool run_here(std::function<void()>& job);
  // Runs the queued jobs up to the one with `ticket` on this thread, then their completions, when
  // no thread leads and none has started that job; otherwise returns false.
  bool help(uint64_t ticket);
  // Whether this thread is one of `executor`'s own (not a caller's leading through run_here/help).
  // Compares addresses only: safe while another thread destroys that executor.
  static bool on_own_thread(const Executor* executor);
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
  // Runs `job` on a caller's thread that leads (run_here, help): below autograd and in the
  // executor's floating-point environment, as on its own threads; the lead is handed back even if
  // the job throws.
  void run_leading_here(std::function<void()>& job, std::unique_lock<std::mutex>& lock);
  // Hands the lead on from a caller's thread (run_here, help), then runs its completions, unlocked.
  void finish_leading_here(std::unique_lock<std::mutex>& lock);
  // Runs the deferred completions, unlocked.
  void complete(std::unique_lock<std::mutex>& lock);

  // Whether either Comm has messages in flight; polls both.
  bool has_background() const;
  bool poll();

  Comm& comm_;
  Comm* const across_;
  std::mutex mutex_;
  std::condition_variable lead_cv_;  // threads waiting to lead
  std::deque<std::function<void()>> queue_;
  std::vector<std::function<void()>> completions_;  // touched by the leading thread only
  bool leading_ = false;
  bool background_ = false;  // the comm had messages in flight when the last leader finished
  bool stopping_ = false;
  bool stopped_ = false;
  uint64_t submitted_ = 0, started_ = 0;  // tickets
  unsigned fp_environment_ = 0;  // MXCSR of the thread that made the executor: its threads run with it
  int idle_ = 0;
  std::vector<std::thread> threads_;
};

}  // namespace cnccl::host

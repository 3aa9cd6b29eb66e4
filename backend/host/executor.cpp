#include "backend/host/executor.h"

#include <ATen/core/LegacyTypeDispatch.h>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "backend/release_gate.h"

namespace cnccl::host {
namespace {

// Bounds the threads a chain of blocking callbacks can pull in (each one nests a collective).
constexpr size_t kMaxThreads = 16;

// The longest a leader with only point-to-point messages in flight sleeps between polls.
constexpr std::chrono::milliseconds kIdleWait{10};

// The executor whose completions this thread is running, if any.
thread_local const Executor* running_completions_of = nullptr;
// Set when a completion on this thread stopped (and so destroyed) the executor running it.
thread_local bool orphaned = false;
// The executor this thread belongs to, if any.
thread_local const Executor* own_thread_of = nullptr;

}  // namespace

namespace {

unsigned fp_environment() {
#if defined(__x86_64__)
  return _mm_getcsr();
#else
  return 0;
#endif
}

void set_fp_environment([[maybe_unused]] unsigned environment) {
#if defined(__x86_64__)
  _mm_setcsr(environment);
#endif
}

}  // namespace

Executor::Executor(Comm& comm, Comm* across) : comm_(comm), across_(across), fp_environment_(fp_environment()) {
  std::lock_guard<std::mutex> lock(mutex_);
  threads_.emplace_back([this] { loop(); });
}

Executor::~Executor() { stop(); }

bool Executor::has_background() const { return comm_.has_background() || (across_ && across_->has_background()); }

bool Executor::poll() {
  const bool progressed = comm_.poll();
  return (across_ && across_->poll()) || progressed;
}

uint64_t Executor::submit(std::function<void()> job) {
  uint64_t ticket;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    ticket = submitted_++;
    queue_.push_back(std::move(job));
    // A callback submitting on its own group will likely wait for the result: someone must lead.
    if (running_completions_of == this && idle_ == 0 && !stopping_ && threads_.size() < kMaxThreads) {
      threads_.emplace_back([this] { loop(); });
    }
  }
  lead_cv_.notify_one();
  comm_.wake();  // a leader may be waiting on the network for point-to-point messages
  return ticket;
}

bool Executor::run_here(std::function<void()>& job) {
  std::unique_lock<std::mutex> lock(mutex_);
  if (leading_ || !queue_.empty() || background_ || stopping_) return false;
  leading_ = true;
  ++submitted_;
  ++started_;
  run_leading_here(job, lock);
  finish_leading_here(lock);
  return true;
}

bool Executor::help(uint64_t ticket) {
  std::unique_lock<std::mutex> lock(mutex_);
  if (leading_ || background_ || stopping_ || started_ > ticket) return false;
  leading_ = true;
  while (started_ <= ticket && !queue_.empty()) {
    std::function<void()> job = std::move(queue_.front());
    queue_.pop_front();
    ++started_;
    run_leading_here(job, lock);
  }
  finish_leading_here(lock);
  return true;
}

void Executor::run_leading_here(std::function<void()>& job, std::unique_lock<std::mutex>& lock) {
  lock.unlock();
  const unsigned callers = fp_environment();
  set_fp_environment(fp_environment_);
  try {
    // As on the executor's threads (loop()).
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    job();
  } catch (...) {
    set_fp_environment(callers);
    lock.lock();
    finish_leading_here(lock);
    throw;
  }
  set_fp_environment(callers);
  lock.lock();
}

void Executor::finish_leading_here(std::unique_lock<std::mutex>& lock) {
  std::vector<std::function<void()>> done;
  done.swap(completions_);
  background_ = has_background();
  leading_ = false;
  // Jobs submitted meanwhile, and stop(), wait for the lead. Only they: a needless wake-up of the
  // idle executor thread costs a context switch on the caller's core at every call.
  if (!queue_.empty() || background_ || stopping_) lead_cv_.notify_all();
  lock.unlock();
  const Executor* outer = running_completions_of;
  running_completions_of = this;
  for (auto& completion : done) release_gate::run_then_drop(completion);
  running_completions_of = outer;
}

void Executor::defer(std::function<void()> completion) { completions_.push_back(std::move(completion)); }

void Executor::stop() {
  std::vector<std::thread> threads;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (stopped_) return;  // the comm it holds may be gone
    stopping_ = true;
  }
  lead_cv_.notify_all();
  comm_.wake();
  const bool own_thread = running_completions_of == this;
  if (own_thread) {
    std::unique_lock<std::mutex> lock(mutex_);
    lead_cv_.wait(lock, [&] { return !leading_; });
    while (!queue_.empty()) {
      leading_ = true;
      lead(lock);
      leading_ = false;
      complete(lock);
    }
  }
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mutex_);
      // A caller's thread may still be leading (run_here).
      if (!own_thread) lead_cv_.wait(lock, [&] { return !leading_; });
      if (threads_.empty()) {
        stopped_ = true;
        return;
      }
      threads.swap(threads_);
    }
    // A leader may have started one more thread while these were being joined.
    for (auto& t : threads) {
      if (own_thread && t.get_id() == std::this_thread::get_id()) {
        orphaned = true;
        t.detach();
      } else {
        t.join();
      }
    }
    threads.clear();
  }
}

void Executor::complete(std::unique_lock<std::mutex>& lock) {
  std::vector<std::function<void()>> done;
  done.swap(completions_);
  lock.unlock();
  for (auto& completion : done) release_gate::run_then_drop(completion);
  lock.lock();
}

bool Executor::on_own_thread(const Executor* executor) { return own_thread_of == executor; }

void Executor::loop() {
  own_thread_of = this;
  // A thread started from a completion on a caller's thread would inherit the caller's.
  set_fp_environment(fp_environment_);
  // This thread writes into the caller's tensors while the caller's thread may be running autograd
  // on them (DDP with create_graph=True): docs/design.md, "Threads and autograd".
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    ++idle_;
    lead_cv_.wait(lock, [&] { return !leading_ && (!queue_.empty() || background_ || stopping_); });
    --idle_;
    if (queue_.empty() && !background_ && stopping_) {
      lead_cv_.notify_all();
      return;
    }
    leading_ = true;
    lead(lock);
    std::vector<std::function<void()>> done;
    done.swap(completions_);
    background_ = has_background();
    leading_ = false;
    if (!queue_.empty() || background_) lead_cv_.notify_one();
    lock.unlock();
    running_completions_of = this;
    // A work may hold the last reference to a caller's tensors, its future's callbacks Python
    // objects (docs/design.md, "Threads", at exit).
    for (auto& completion : done) release_gate::run_then_drop(completion);
    running_completions_of = nullptr;
    if (orphaned) return;  // a completion stopped this executor, which is gone
    lock.lock();
  }
}

void Executor::lead(std::unique_lock<std::mutex>& lock) {
  if (queue_.empty() && background_ && !stopping_) {
    // Point-to-point messages in flight and no job: sleep in the kernel until the network has
    // something, submit() or stop() wakes it, or kIdleWait passes (a message's deadline is checked
    // that often), rather than poll: a rank blocked in irecv for seconds uses next to no CPU.
    lock.unlock();
    while (poll()) {
    }
    comm_.wait_for_activity(kIdleWait);
    lock.lock();
  }
  std::function<void()> job;
  if (!queue_.empty()) {
    job = std::move(queue_.front());
    queue_.pop_front();
    ++started_;
  }
  const bool stopping = stopping_;
  lock.unlock();
  if (job) {
    job();
    release_gate::drop(job);
  } else {
    if (stopping) {
      comm_.abort("the process group was shut down");
      if (across_) across_->abort("the process group was shut down");
    }
    while (poll()) {
    }
  }
  lock.lock();
}

}  // namespace cnccl::host

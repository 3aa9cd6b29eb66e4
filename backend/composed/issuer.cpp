#include "backend/composed/issuer.h"

#include <ATen/ATen.h>
#include <ATen/core/LegacyTypeDispatch.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>

#include "backend/composed/composed_work.h"
#include "backend/release_gate.h"
#include "backend/signature.h"
#include "backend/work.h"

namespace cnccl::composed {
namespace {

using errors::as_backend_error;
using errors::backend_error;
using errors::message_of;

// Signatures travel as fixed-size, zero-padded byte strings (fit_signature).
constexpr size_t kSignatureBytes = 256;

// How long a failed agreement looks for a same-host peer whose exit explains it (see agree()): a
// process's exit shows through its pidfd within milliseconds of its connections resetting.
constexpr auto kExitGrace = std::chrono::seconds(1);

// A test-only pause at a named point of the issuer thread, so that a test can destroy or abort a
// group exactly there (tests/python/test_threads.py): CNCCL_TEST_ISSUER_DELAY="<point>:<ms>".
constexpr const char* kBeforeIssue = "before_issue";  // agreed and not settled; the engine not yet called
constexpr const char* kBeforeRelease = "before_release";  // a work completed; the completion not yet dropped

void delay_for_tests(const char* point) {
  static const std::string chosen = [] {
    const char* value = std::getenv("CNCCL_TEST_ISSUER_DELAY");
    return std::string(value ? value : "");
  }();
  if (chosen.empty() || chosen.rfind(std::string(point) + ":", 0) != 0) return;
  std::this_thread::sleep_for(std::chrono::milliseconds(std::stoll(chosen.substr(std::strlen(point) + 1))));
}

}  // namespace

struct Issuer::State : std::enable_shared_from_this<Issuer::State> {
  // A member type, not one of this file's own: a type in an anonymous namespace would give State's
  // fields internal linkage (GCC's -Wsubobject-linkage, where a unity build includes this file).
  struct Job {
    c10::intrusive_ptr<HostWork> work;
    std::string what;  // "cnccl allreduce (seq 3) in group 'x'"
    std::string signature;
    std::chrono::milliseconds timeout;
    Issuer::Issue issue;
    std::atomic<bool> settled{false};
    bool issued = false;  // under State::mutex: once stopped is set, no job becomes issued
  };

  // Released by ~Issuer on the destroying thread once no thread of ours and no engine callback
  // can reach it: gloo's own threads must never drop the last reference (its destructor joins them).
  c10::intrusive_ptr<c10d::Backend> engine;
  int rank = 0;  // the engine's, kept: close() releases the engine while submit() still names it
  std::string group;
  std::function<std::string(int)> peer_exited;
  std::mutex mutex;
  std::condition_variable cv;
  std::deque<std::shared_ptr<Job>> queue;
  std::vector<std::shared_ptr<Job>> outstanding;  // issued or queued, not yet settled
  std::string stopped;                            // why no job may run any more
  std::string broken;                             // the first failure: the group is unusable after it

  // Completions run user code (a work's then() callbacks), which may issue another collective of
  // this group and wait for it, as PowerSGD's hook does. So they never run on the issuer thread
  // (which that collective needs) nor on gloo's two workers: they run on completion threads, and
  // one that finds none idle starts another (an idle one ends after a while).
  // Every thread started here is kept and joined by ~Issuer (docs/design.md, "Threads"); one that
  // idles past kIdle ends and is joined by the next post() or by ~Issuer.
  std::mutex done_mutex;
  std::condition_variable done_cv;
  std::deque<std::function<void()>> done_queue;
  int done_idle = 0;
  bool closing = false;  // ~Issuer runs: idle completion threads end at once
  std::vector<std::thread> done_threads;
  std::vector<std::thread::id> done_ended;  // ended, not yet joined
  // Engine works whose callback has not yet run: ~Issuer waits for them before releasing anything.
  int engine_callbacks = 0;
  std::condition_variable engine_cv;

  static constexpr auto kIdle = std::chrono::seconds(10);

  void post(std::function<void()> completion) {
    std::unique_lock<std::mutex> lock(done_mutex);
    if (closing) {
      // close() has joined the completion threads: an abort() racing it completes its works here.
      lock.unlock();
      return release_gate::run_then_drop(completion);
    }
    done_queue.push_back(std::move(completion));
    // Each queued completion has an idle thread of its own (one woken may not have taken its job
    // yet), so none waits behind a callback that waits for it.
    if (done_queue.size() <= size_t(done_idle)) {
      lock.unlock();
      done_cv.notify_one();
      return;
    }
    join_ended(lock);
    // The state's last reference may go with this thread (a group closed from a callback), and
    // with it jobs that hold a caller's tensors.
    done_threads.emplace_back([state = shared_from_this()]() mutable {
      state->complete_jobs();
      release_gate::drop(state);
    });
  }

  void complete_jobs() {
    at::AutoDispatchBelowADInplaceOrView below_autograd;  // docs/design.md, "Threads and autograd"
    std::unique_lock<std::mutex> lock(done_mutex);
    while (true) {
      if (done_queue.empty()) {
        ++done_idle;
        const bool woken = done_cv.wait_for(lock, kIdle, [&] { return !done_queue.empty() || closing; });
        --done_idle;
        if (!woken || done_queue.empty()) break;
      }
      auto next = std::move(done_queue.front());
      done_queue.pop_front();
      lock.unlock();
      // The work may hold the last reference to a caller's tensors, its future's callbacks Python
      // objects (docs/design.md, "Threads", at exit).
      release_gate::run_then_drop(next, [] { delay_for_tests(kBeforeRelease); });
      lock.lock();
    }
    done_ended.push_back(std::this_thread::get_id());
  }

  // Joins the completion threads that have ended (each is past its last touch of the state).
  void join_ended(std::unique_lock<std::mutex>& lock) {
    std::vector<std::thread> ended;
    for (auto it = done_threads.begin(); it != done_threads.end();) {
      if (std::find(done_ended.begin(), done_ended.end(), it->get_id()) != done_ended.end()) {
        std::erase(done_ended, it->get_id());
        ended.push_back(std::move(*it));
        it = done_threads.erase(it);
      } else {
        ++it;
      }
    }
    lock.unlock();
    for (auto& t : ended) t.join();
    lock.lock();
  }

  // Completes or fails a job's work exactly once (abort() may have failed it already).
  void settle(const std::shared_ptr<Job>& job, std::exception_ptr error) {
    if (job->settled.exchange(true)) return;
    {
      std::lock_guard<std::mutex> lock(mutex);
      std::erase(outstanding, job);
      if (error && broken.empty()) broken = message_of(error);
    }
    post([work = job->work, error] {
      if (error) {
        work->fail(error);
      } else {
        work->complete();
      }
    });
  }

  void fail(const std::shared_ptr<Job>& job, const std::string& msg) {
    bool issued;
    {
      std::lock_guard<std::mutex> lock(mutex);
      issued = job->issued;
    }
    settle(job, std::make_exception_ptr(backend_error(
                    job->what + ": " + msg +
                    (issued ? " (it was already issued to the engine: the caller's tensors may still be written "
                              "when the engine ends it)"
                            : " (the caller's tensors were not modified)"))));
  }

  // Waits for the engine's `work` until it ends, the job's timeout passes (throws), or the job is
  // settled by abort() or shutdown() (returns at once: the issuer thread must not wait on peers that
  // will never come, or close() would). gloo goes on with the work; its callback touches only `done`.
  static void wait_unless_settled(c10d::Work& work, const Job& job) {
    struct Done {
      std::mutex mutex;
      std::condition_variable cv;
      bool done = false;
    };
    auto done = std::make_shared<Done>();
    work.getFuture()->addCallback([done](c10::ivalue::Future&) {
      std::lock_guard<std::mutex> lock(done->mutex);
      done->done = true;
      done->cv.notify_all();
    });
    const auto deadline = std::chrono::steady_clock::now() + job.timeout;
    std::unique_lock<std::mutex> lock(done->mutex);
    while (!done->done) {
      if (job.settled) return;
      TORCH_CHECK(std::chrono::steady_clock::now() < deadline, "timed out");
      done->cv.wait_for(lock, std::chrono::milliseconds(20));
    }
    lock.unlock();
    work.wait();  // rethrows the engine's error, if any
  }

  // Every rank shows its signature; all must be equal.
  void agree(const std::shared_ptr<Job>& job) {
    at::Tensor mine = at::zeros({int64_t(kSignatureBytes)}, at::kByte);
    const std::string sig = fit_signature(job->signature, kSignatureBytes);
    std::memcpy(mine.data_ptr(), sig.data(), sig.size());
    std::vector<std::vector<at::Tensor>> all(1);
    for (int r = 0; r < engine->getSize(); ++r) all[0].push_back(at::empty_like(mine));
    std::vector<at::Tensor> in{mine};
    c10d::AllgatherOptions opts;
    opts.timeout = job->timeout;
    const int rank = engine->getRank(), size = engine->getSize();
    const auto start = std::chrono::steady_clock::now();
    try {
      auto work = engine->allgather(all, in, opts);
      if (work) wait_unless_settled(*work, *job);
    } catch (...) {
      // gloo's allgather is a ring: this rank waits on the one before it, unless a peer on this host is
      // known gone (gloo's error names a connection, not a rank). A peer that died fails it at once (its
      // connection resets), long before the timeout: say which of the two it was.
      const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start);
      const bool timed_out = waited >= job->timeout;
      int peer = (rank + size - 1) % size;
      std::string gone;
      const auto find_gone = [&] {
        for (int r = 0; r < size && gone.empty() && peer_exited; ++r) {
          if (r != rank && !(gone = peer_exited(r)).empty()) peer = r;
        }
      };
      find_gone();
      // A connection resets when its process closes its files, before the process is reaped and its pidfd
      // turns readable, and a survivor that failed first resets its connections while it still runs: an
      // early failure waits a moment for the peer whose exit caused it to show.
      for (auto grace = std::chrono::steady_clock::now() + kExitGrace;
           !timed_out && gone.empty() && peer_exited && std::chrono::steady_clock::now() < grace;) {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
        find_gone();
      }
      throw backend_error(job->what + " [peer rank " + std::to_string(peer) + "]: " +
                          (gone.empty() ? "" : "rank " + std::to_string(peer) + ": " + gone + "; ") +
                          (timed_out ? "timed out after " : "failed after ") + std::to_string(waited.count()) +
                          " ms (the group's timeout is " + std::to_string(job->timeout.count()) + " ms) waiting for " +
                          "every rank to reach this collective (gloo: " + message_of(std::current_exception()) + ")");
    }
    if (job->settled) return;  // gloo may still be writing `all`
    for (int r = 0; r < size; ++r) {
      if (at::equal(all[0][r], mine)) continue;
      const std::string theirs = peer_text(static_cast<const char*>(all[0][r].const_data_ptr()), kSignatureBytes);
      throw backend_error(job->what + ": ranks disagree on this collective: rank " + std::to_string(rank) + " called " +
                          sig + ", rank " + std::to_string(r) + " called " + theirs);
    }
  }

  // The issuer thread: runs the queued jobs in order until abort() or close() stops it.
  void issue_jobs() {
    at::AutoDispatchBelowADInplaceOrView below_autograd;  // docs/design.md, "Threads and autograd"
    std::unique_lock<std::mutex> lock(mutex);
    while (true) {
      cv.wait(lock, [&] { return !queue.empty() || !stopped.empty(); });
      // Once stopped, queued jobs were failed by abort(): none runs.
      if (!stopped.empty()) return;
      auto job = std::move(queue.front());
      queue.pop_front();
      lock.unlock();
      if (!job->settled) run(job);
      // The closure owns the composed path, and with it the engine, which must never be released
      // on gloo's thread, where the job itself may end: it goes here (docs/design.md, "Threads").
      // Either may hold the last reference to a caller's tensors.
      release_gate::drop(job->issue);
      release_gate::drop(job);
      lock.lock();
    }
  }

  void run(const std::shared_ptr<Job>& job) {
    std::string why;
    {
      std::lock_guard<std::mutex> lock(mutex);
      why = broken;
    }
    if (!why.empty()) {
      return settle(job, std::make_exception_ptr(backend_error(
                             job->what + ": the group is unusable after an earlier failure, and the caller's tensors "
                                         "were not modified. The earlier failure: " + why)));
    }
    try {
      agree(job);
      delay_for_tests(kBeforeIssue);
      {
        // Checked and marked under the mutex abort() takes: a job is either failed before it is
        // issued (its tensors untouched, as its error says) or issued and failed as such.
        std::lock_guard<std::mutex> lock(mutex);
        if (job->settled || !stopped.empty()) return;
        job->issued = true;
      }
      auto inner = job->issue();
      if (!inner) return settle(job, nullptr);  // the engine ran it synchronously
      c10::intrusive_ptr<c10::ivalue::Future> future;
      try {
        future = inner->getFuture();
      } catch (const c10::Error&) {
        inner->wait();  // a gloo work without a future (reduce_scatter_single in torch 2.15)
        return settle(job, nullptr);
      }
      {
        std::lock_guard<std::mutex> lock(done_mutex);
        ++engine_callbacks;
      }
      // Runs on gloo's thread. ~Issuer waits for it, so the state outlives it.
      future->addCallback([this, job = job](c10::ivalue::Future& f) mutable {
        settle(job, f.hasError() ? as_backend_error(f.exception_ptr(), job->what) : nullptr);
        release_gate::drop(job);  // may be the work's last reference, on gloo's thread
        std::lock_guard<std::mutex> lock(done_mutex);
        --engine_callbacks;
        engine_cv.notify_all();
      });
    } catch (...) {
      const std::string msg = message_of(std::current_exception());
      bool issued;
      {
        std::lock_guard<std::mutex> lock(mutex);
        issued = job->issued;
      }
      // Once issued, the engine may have written some outputs (a coalesced call's earlier dtypes).
      settle(job, std::make_exception_ptr(backend_error(
                      msg + (issued ? " (the caller's tensors may hold partial results)"
                                    : " (the caller's tensors were not modified)"))));
    }
  }
};

Issuer::Issuer(c10::intrusive_ptr<c10d::Backend> engine, std::string group_name,
               std::function<std::string(int)> peer_exited)
    : state_(std::make_shared<State>()) {
  state_->rank = engine->getRank();
  state_->peer_exited = std::move(peer_exited);
  state_->engine = std::move(engine);
  state_->group = std::move(group_name);
  // The state's last reference may go with this thread (a group closed from its own job), and with
  // it queued jobs that hold a caller's tensors.
  thread_ = std::thread([state = state_]() mutable {
    state->issue_jobs();
    release_gate::drop(state);
  });
}

Issuer::~Issuer() { close("the process group was destroyed"); }

void Issuer::close(const std::string& why) {
  abort(why);
  // One close does the joining; another (a callback calling shutdown() while a close joins its
  // thread, or the destructor after shutdown()) has nothing left to do.
  if (closed_.exchange(true)) return;
  // The issuer thread ends after the job it runs, which waits on peers at most its timeout; the
  // engine's callbacks come when gloo finishes what it was given, within the same bound.
  const auto self = std::this_thread::get_id();
  // Closed from one of our own threads, that thread cannot join itself: its own reference keeps
  // the state alive until it returns (the issuer runs no further job: stopped is set), and the
  // engine goes with the state then.
  bool on_our_thread = thread_.get_id() == self;
  if (on_our_thread) {
    thread_.detach();
  } else {
    thread_.join();
  }
  std::vector<std::thread> threads;
  {
    std::unique_lock<std::mutex> lock(state_->done_mutex);
    state_->engine_cv.wait(lock, [&] { return state_->engine_callbacks == 0; });
    state_->closing = true;
    threads = std::move(state_->done_threads);
  }
  state_->done_cv.notify_all();
  for (auto& t : threads) {
    if (t.get_id() == self) {
      t.detach();  // a completion (a user's callback) closed the group
      on_our_thread = true;
    } else {
      t.join();
    }
  }
  // Nothing of ours can reach the engine any more: it is released here, never on gloo's threads.
  if (!on_our_thread) state_->engine.reset();
}

c10::intrusive_ptr<c10d::Work> Issuer::submit(c10d::OpType type, const char* name, uint64_t seq, std::string signature,
                                              std::vector<at::Tensor> outputs, std::chrono::milliseconds timeout,
                                              Issue issue) {
  auto job = std::make_shared<State::Job>();
  job->work = c10::make_intrusive<HostWork>(state_->rank, type, seq, std::move(outputs));
  job->what = std::string("cnccl ") + name + " (seq " + std::to_string(seq) + ") in group '" + state_->group + "'";
  job->signature = std::string(name) + "(" + signature + ")";
  job->timeout = timeout;
  job->issue = std::move(issue);
  std::unique_lock<std::mutex> lock(state_->mutex);
  TORCH_CHECK(state_->stopped.empty(), "cnccl ", name, ": the process group has been shut down or aborted (",
              state_->stopped, ")");
  state_->outstanding.push_back(job);
  state_->queue.push_back(job);
  lock.unlock();
  state_->cv.notify_one();
  return job->work;
}

void Issuer::abort(const std::string& why) {
  std::vector<std::shared_ptr<State::Job>> outstanding;
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    if (state_->stopped.empty()) state_->stopped = why;
    outstanding = state_->outstanding;
  }
  state_->cv.notify_one();
  for (const auto& job : outstanding) state_->fail(job, why);
}

}  // namespace cnccl::composed

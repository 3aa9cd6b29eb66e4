#include "backend/composed/issuer.h"

#include <ATen/ATen.h>
#include <ATen/core/LegacyTypeDispatch.h>
#include <c10/util/Exception.h>

#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>

#include "backend/composed/composed_work.h"
#include "backend/signature.h"
#include "backend/work.h"

namespace cnccl::composed {
namespace {

using errors::as_backend_error;
using errors::backend_error;
using errors::message_of;

// Signatures travel as fixed-size, zero-padded byte strings (fit_signature).
constexpr size_t kSignatureBytes = 256;

struct Job {
  c10::intrusive_ptr<HostWork> work;
  std::string what;  // "cnccl allreduce (seq 3) in group 'x'"
  std::string signature;
  std::chrono::milliseconds timeout;
  Issuer::Issue issue;
  std::atomic<bool> settled{false};
};

}  // namespace

struct Issuer::State : std::enable_shared_from_this<Issuer::State> {
  c10::intrusive_ptr<c10d::Backend> engine;
  std::string group;
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
  std::mutex done_mutex;
  std::condition_variable done_cv;
  std::deque<std::function<void()>> done_queue;
  int done_idle = 0;

  void post(std::function<void()> completion) {
    std::unique_lock<std::mutex> lock(done_mutex);
    done_queue.push_back(std::move(completion));
    if (done_idle > 0) {
      lock.unlock();
      done_cv.notify_one();
      return;
    }
    std::thread([state = shared_from_this()] {
      at::AutoDispatchBelowADInplaceOrView below_autograd;  // docs/design.md, "Threads and autograd"
      std::unique_lock<std::mutex> lock(state->done_mutex);
      while (true) {
        if (state->done_queue.empty()) {
          ++state->done_idle;
          const bool woken = state->done_cv.wait_for(lock, std::chrono::seconds(10),
                                                     [&] { return !state->done_queue.empty(); });
          --state->done_idle;
          if (!woken) return;
        }
        auto next = std::move(state->done_queue.front());
        state->done_queue.pop_front();
        lock.unlock();
        next();
        lock.lock();
      }
    }).detach();
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
    settle(job, std::make_exception_ptr(
                    backend_error(job->what + ": " + msg + " (the caller's tensors were not modified)")));
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
    try {
      auto work = engine->allgather(all, in, opts);
      if (work) work->wait(job->timeout);
    } catch (...) {
      // gloo's allgather is a ring: this rank waits on the one before it.
      const int left = (rank + size - 1) % size;
      throw backend_error(job->what + " [peer rank " + std::to_string(left) + "]: timed out or failed after " +
                          std::to_string(job->timeout.count()) + " ms waiting for every rank to reach this " +
                          "collective (gloo: " + message_of(std::current_exception()) + ")");
    }
    for (int r = 0; r < size; ++r) {
      if (at::equal(all[0][r], mine)) continue;
      const std::string theirs = peer_text(static_cast<const char*>(all[0][r].const_data_ptr()), kSignatureBytes);
      throw backend_error(job->what + ": ranks disagree on this collective: rank " + std::to_string(rank) + " called " +
                          sig + ", rank " + std::to_string(r) + " called " + theirs);
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
      if (job->settled) return;  // aborted while the ranks were agreeing: never issued
      auto inner = job->issue();
      if (!inner) return settle(job, nullptr);  // the engine ran it synchronously
      c10::intrusive_ptr<c10::ivalue::Future> future;
      try {
        future = inner->getFuture();
      } catch (const c10::Error&) {
        inner->wait();  // a gloo work without a future (reduce_scatter_single in torch 2.15)
        return settle(job, nullptr);
      }
      future->addCallback([this, job](c10::ivalue::Future& f) {
        settle(job, f.hasError() ? as_backend_error(f.exception_ptr(), job->what) : nullptr);
      });
    } catch (...) {
      const std::string msg = message_of(std::current_exception());
      settle(job, std::make_exception_ptr(backend_error(msg + " (the caller's tensors were not modified)")));
    }
  }
};

Issuer::Issuer(c10::intrusive_ptr<c10d::Backend> engine, std::string group_name) : state_(std::make_shared<State>()) {
  state_->engine = std::move(engine);
  state_->group = std::move(group_name);
  // The thread owns a reference to the state: shutdown() need not wait for a job blocked on peers
  // that will never come (it ends at the job's timeout).
  std::thread([state = state_] {
    at::AutoDispatchBelowADInplaceOrView below_autograd;  // docs/design.md, "Threads and autograd"
    std::unique_lock<std::mutex> lock(state->mutex);
    while (true) {
      state->cv.wait(lock, [&] { return !state->queue.empty() || !state->stopped.empty(); });
      if (state->queue.empty()) return;
      auto job = std::move(state->queue.front());
      state->queue.pop_front();
      lock.unlock();
      if (!job->settled) state->run(job);
      lock.lock();
    }
  }).detach();
}

Issuer::~Issuer() { abort("the process group was destroyed"); }

c10::intrusive_ptr<c10d::Work> Issuer::submit(c10d::OpType type, const char* name, uint64_t seq, std::string signature,
                                              std::vector<at::Tensor> outputs, std::chrono::milliseconds timeout,
                                              Issue issue) {
  auto job = std::make_shared<Job>();
  job->work = c10::make_intrusive<HostWork>(state_->engine->getRank(), type, seq, std::move(outputs));
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
  std::vector<std::shared_ptr<Job>> outstanding;
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    if (state_->stopped.empty()) state_->stopped = why;
    outstanding = state_->outstanding;
  }
  state_->cv.notify_one();
  for (const auto& job : outstanding) state_->fail(job, why);
}

}  // namespace cnccl::composed

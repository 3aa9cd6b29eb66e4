// A double of torch's ProcessGroupGloo for the threads that touch cnccl's composed path
// (cpu_engine=gloo), whose headers torch's wheel does not ship (they include gloo's own). It copies,
// as torch/csrc/distributed/c10d/ProcessGroupGloo.cpp has them (torch 2.15):
// - ProcessGroupGloo::enqueue and runLoop: a collective is queued and run by a worker thread of
//   the group, in the order it was queued (one worker here; gloo's two run on separate contexts);
// - AsyncWork::execute: the worker runs it, then completes the work's future on itself
//   (finishWorkGloo / finishWorkGlooError), so a C++ callback added to that future runs on the
//   worker, with the worker's own thread-local state (grad mode on), and before the work itself
//   is marked completed (finish(), after the future's callbacks ran);
// - ~ProcessGroupGloo: waits until the queue is empty, then stops and joins the workers; a
//   destructor that runs on a worker would join itself (std::system_error, then terminate);
// - a collective whose peers do not come fails at the op's timeout, and one whose peer's group is
//   gone fails at once (gloo's pair sees the connection closed).
// The ranks' data meet on a Fabric in this process, where gloo uses its pairs.
#pragma once

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>

#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

namespace cnccl::testing {

// What the ranks of one group share: each collective, by its sequence number, gathers every rank's
// input before any rank computes its output from them.
struct Fabric {
  explicit Fabric(int world) : world(world), left(world, false) {}
  const int world;
  std::mutex mutex;
  std::condition_variable cv;
  std::vector<bool> left;  // the rank's group is destroyed
  std::map<uint64_t, std::vector<at::Tensor>> posted;
  std::map<uint64_t, int> read;
};

class GlooDoubleWork : public c10d::Work {
 public:
  GlooDoubleWork(c10d::OpType op, std::vector<at::Tensor> outputs)
      : c10d::Work(-1, op),
        outputs_(std::move(outputs)),
        future_(c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()))) {}

  // As AsyncWork::wait: waits for the future and rethrows its error.
  bool wait(std::chrono::milliseconds /*timeout*/) override {
    future_->wait();
    if (future_->hasError()) std::rethrow_exception(future_->exception_ptr());
    return true;
  }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }
  std::vector<at::Tensor> result() override { return outputs_; }

  // As finishWorkGloo and finishWorkGlooError: the future first, then the work's own flag.
  void complete() {
    future_->markCompleted(c10::IValue(outputs_));
    finish();
  }
  void fail(std::exception_ptr error) {
    future_->setError(error);
    finish(error);
  }

  const std::vector<at::Tensor> outputs_;
  const c10::intrusive_ptr<c10::ivalue::Future> future_;
};

class GlooDouble : public c10d::Backend {
 public:
  GlooDouble(std::shared_ptr<Fabric> fabric, int rank)
      : c10d::Backend(rank, fabric->world), fabric_(std::move(fabric)) {
    worker_ = std::thread([this] { run_loop(); });
  }

  ~GlooDouble() override {
    if (std::this_thread::get_id() == worker_.get_id()) {
      std::fprintf(stderr, "gloo double: the group was released on its own worker thread\n");
      std::abort();  // where ~ProcessGroupGloo would join itself
    }
    {
      std::unique_lock<std::mutex> lock(mutex_);
      drained_.wait(lock, [&] { return queue_.empty(); });
      stop_ = true;
    }
    queued_.notify_all();
    {
      std::lock_guard<std::mutex> lock(fabric_->mutex);
      fabric_->left[getRank()] = true;
    }
    fabric_->cv.notify_all();
    worker_.join();  // throws on the worker itself, as ~ProcessGroupGloo would
  }

  const std::string getBackendName() const override { return "gloo"; }

  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override {
    TORCH_CHECK(opts.reduceOp == c10d::ReduceOp::SUM, "the gloo double sums only");
    at::Tensor t = tensors.at(0);
    return enqueue(c10d::OpType::ALLREDUCE, {t}, t, opts.timeout, [t](const std::vector<at::Tensor>& all) {
      at::Tensor sum = all[0].clone();
      for (size_t r = 1; r < all.size(); ++r) sum.add_(all[r]);
      t.copy_(sum);
    });
  }

  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts) override {
    std::vector<at::Tensor> outs = outputs.at(0);
    return enqueue(c10d::OpType::ALLGATHER, outs, inputs.at(0), opts.timeout, [outs](const std::vector<at::Tensor>& all) {
      for (size_t r = 0; r < all.size(); ++r) outs[r].copy_(all[r]);
    });
  }

  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts) override {
    at::Tensor out = output;
    return enqueue(c10d::OpType::_ALLGATHER_BASE, {out}, input, opts.timeout,
                   [out](const std::vector<at::Tensor>& all) { out.copy_(at::cat(all).view_as(out)); });
  }

  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override {
    return enqueue(c10d::OpType::BARRIER, {}, at::zeros({1}), opts.timeout, [](const std::vector<at::Tensor>&) {});
  }

 private:
  struct Op {
    uint64_t seq;
    at::Tensor input;
    std::chrono::milliseconds timeout;
    std::function<void(const std::vector<at::Tensor>&)> compute;
    c10::intrusive_ptr<GlooDoubleWork> work;
  };

  c10::intrusive_ptr<c10d::Work> enqueue(c10d::OpType type, std::vector<at::Tensor> outputs, const at::Tensor& input,
                                         std::chrono::milliseconds timeout,
                                         std::function<void(const std::vector<at::Tensor>&)> compute) {
    auto work = c10::make_intrusive<GlooDoubleWork>(type, std::move(outputs));
    {
      std::lock_guard<std::mutex> lock(mutex_);
      queue_.push_back({seq_++, input.clone(), timeout, std::move(compute), work});
    }
    queued_.notify_one();
    return work;
  }

  void run_loop() {
    std::unique_lock<std::mutex> lock(mutex_);
    while (!stop_) {
      if (queue_.empty()) {
        queued_.wait(lock);
        continue;
      }
      Op op = std::move(queue_.front());
      queue_.pop_front();
      drained_.notify_all();
      lock.unlock();
      try {
        op.compute(exchange(op));
        op.work->complete();
      } catch (...) {
        op.work->fail(std::current_exception());
      }
      op = Op{};  // the work, its tensors and closure are released on the worker, as gloo's are
      lock.lock();
    }
  }

  // Every rank's input to `op`, once all have posted theirs.
  std::vector<at::Tensor> exchange(const Op& op) {
    std::unique_lock<std::mutex> lock(fabric_->mutex);
    auto& posted = fabric_->posted[op.seq];
    posted.resize(fabric_->world);
    posted[getRank()] = op.input;
    fabric_->cv.notify_all();
    // An unset timeout is the group's (gloo's Options::timeout).
    const auto timeout = op.timeout.count() < 0 ? kTimeout : op.timeout;
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (true) {
      bool all = true;
      for (int r = 0; r < fabric_->world; ++r) {
        if (posted[r].defined()) continue;
        all = false;
        TORCH_CHECK(!fabric_->left[r], "gloo double: connection closed by peer ", r);
      }
      if (all) break;
      TORCH_CHECK(std::chrono::steady_clock::now() < deadline, "gloo double: timed out waiting for peers");
      fabric_->cv.wait_until(lock, deadline);
    }
    std::vector<at::Tensor> all = posted;
    if (++fabric_->read[op.seq] == fabric_->world) {
      fabric_->posted.erase(op.seq);
      fabric_->read.erase(op.seq);
    }
    return all;
  }

  static constexpr std::chrono::milliseconds kTimeout{60000};
  const std::shared_ptr<Fabric> fabric_;
  std::mutex mutex_;
  std::condition_variable queued_, drained_;
  std::deque<Op> queue_;
  bool stop_ = false;
  uint64_t seq_ = 0;
  std::thread worker_;
};

}  // namespace cnccl::testing

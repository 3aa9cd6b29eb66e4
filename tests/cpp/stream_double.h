// CUDA's stream order and ProcessGroupNCCL's contract, kept on the CPU for the composed path's tests
// (docs/design.md, "Stream order"). Work "enqueued on a stream" is deferred: it runs later, when the
// test calls Streams::run(), in its stream's order, on the test's thread; which stream goes next is
// the test's choice (Order). Events and stream waits are explicit. What is copied, and from where:
//
// - Streams and events: cudaEventRecord marks the point after everything enqueued on a stream so far;
//   cudaStreamWaitEvent makes later work on a stream wait for that point (at::cuda::CUDAEvent's
//   record() and block(), ATen/cuda/CUDAEvent.h). Work on different streams is unordered.
// - StreamEngine, as torch's ProcessGroupNCCL::collective() (torch/csrc/distributed/c10d/
//   ProcessGroupNCCL.cpp) runs a collective: with asyncOp=false on the caller's current stream,
//   returning no Work (`return asyncOp ? work : nullptr`); with asyncOp=true on its own stream after
//   syncStream() (that stream waits on an event recorded on the current stream), then
//   ncclEndEvent_->record(ncclStream), and its future marked complete at issue. WorkNCCL::synchronize()
//   makes the current stream wait on the end event (synchronizeStream); wait() is synchronize() and,
//   once the work has an exception, rethrows it; isCompleted() is `exception() || end event reached`;
//   isSuccess() throws NotImplementedError ("deprecated"); the watchdog sets a work's exception after
//   the fact (Watchdog::runLoop: checkAndSetException, checkTimeout) and never fails its future.
//   startCoalescing()/endCoalescing() bracket calls that NCCL then issues as one group.
// - A c10 future's events are only those of the storages its value holds (ivalue_inl.h,
//   Future::markCompleted): the engine's futures here are CPU futures with no events at all, so an
//   order that came from a future would be no order.
// - StreamDevice, as backend/cuda/cuda_device.cpp: every operation on tensor data goes to the current
//   stream, the side stream is one more stream, wait(Work&) is the work's synchronize().
#pragma once

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <gtest/gtest.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>

#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "backend/composed/device.h"

namespace cnccl::testing {

class Streams {
 public:
  using Id = int;
  enum class Order {
    kIssue,        // the oldest runnable work first: the order the host enqueued it
    kAdversarial,  // the newest runnable work first: anything not ordered runs before what it needs
  };
  struct Point {
    Id stream;
    uint64_t position;  // reached once this many operations of the stream have run
  };

  explicit Streams(Order order) : order_(order) { current_ = create("caller"); }

  Id create(std::string name) {
    queues_.emplace_back();
    names_.push_back(std::move(name));
    enqueued_.push_back(0);
    ran_.push_back(0);
    return Id(queues_.size() - 1);
  }
  Id current() const { return current_; }
  void set_current(Id s) { current_ = s; }
  const std::string& name(Id s) const { return names_.at(s); }

  // `gate`: the work also waits for it to be open (the network, for an engine's kernel).
  void enqueue(Id s, std::function<void()> fn, std::string label, std::shared_ptr<bool> gate = nullptr) {
    queues_[s].push_back({std::move(fn), std::move(label), next_seq_++, std::nullopt, std::move(gate)});
    ++enqueued_[s];
  }
  Point record(Id s) const { return {s, enqueued_[s]}; }
  void wait(Id s, Point p) {
    if (p.stream == s) return;  // a stream is ordered with itself
    queues_[s].push_back({nullptr, "wait for " + names_[p.stream], next_seq_++, p, nullptr});
    ++enqueued_[s];
  }
  bool reached(Point p) const { return ran_[p.stream] >= p.position; }
  // Whether the caller of a device operation is a stream's work (then it runs inside it, now).
  bool executing() const { return executing_; }

  // Runs work until none is runnable (work behind a closed gate, or behind a wait for it, stays).
  void run() {
    for (;;) {
      Id pick = -1;
      for (Id s = 0; s < Id(queues_.size()); ++s) {
        if (queues_[s].empty() || !runnable(queues_[s].front())) continue;
        if (pick < 0) {
          pick = s;
          continue;
        }
        const uint64_t a = queues_[s].front().seq, b = queues_[pick].front().seq;
        if (order_ == Order::kIssue ? a < b : a > b) pick = s;
      }
      if (pick < 0) return;
      Op op = std::move(queues_[pick].front());
      queues_[pick].pop_front();
      if (op.fn) {
        executing_ = true;
        op.fn();
        executing_ = false;
        log.push_back(names_[pick] + ": " + op.label);
      }
      ++ran_[pick];
    }
  }
  size_t pending() const {
    size_t n = 0;
    for (const auto& q : queues_) n += q.size();
    return n;
  }

  std::vector<std::string> log;  // "stream: label" of every operation that ran, in order

 private:
  struct Op {
    std::function<void()> fn;  // null: a wait
    std::string label;
    uint64_t seq;
    std::optional<Point> after;
    std::shared_ptr<bool> gate;
  };
  bool runnable(const Op& op) const { return (!op.after || reached(*op.after)) && (!op.gate || *op.gate); }

  const Order order_;
  std::vector<std::deque<Op>> queues_;
  std::vector<std::string> names_;
  std::vector<uint64_t> enqueued_, ran_;
  uint64_t next_seq_ = 0;
  Id current_;
  bool executing_ = false;
};

// The CPU device's arithmetic, each operation deferred to the current stream.
class StreamDevice final : public composed::Device {
 public:
  explicit StreamDevice(Streams& streams) : streams_(streams), side_(streams.create("cnccl side")) {}

  struct Kept {
    const void* data;
    Streams::Point until;
  };
  std::vector<Kept> kept;  // what keep() was asked to hold, and until which point
  std::vector<c10::Device> premul_devices;  // the device each PREMUL_SUM factor was asked for, either way
  int premul_host_reads = 0;                 // premul_factor() calls: the factor read as a number
  bool capture = false;                      // the current stream is being captured (as cuda_device.cpp's)

  bool capturing(const at::Tensor&) override { return capture; }

  // The stream current when the call's future completed: where a CUDA future records its events.
  std::vector<Streams::Id> completed_on;
  void complete(c10::ivalue::Future& future, const c10::IValue& value) override {
    completed_on.push_back(streams_.current());
    future.markCompleted(value);
  }

  double premul_factor(const c10d::ReduceOp& op, const at::Tensor& t) override {
    premul_devices.push_back(t.device());
    ++premul_host_reads;
    return cpu_->premul_factor(op, t);
  }
  // As cuda_device.cpp's: a tensor factor (here on the CPU, standing for t's device) is the kernels' to
  // read, when they run (cast() and encode_frames() below read it then).
  at::Tensor premul_factor_tensor(const c10d::ReduceOp& op, const at::Tensor& t) override {
    premul_devices.push_back(t.device());
    const at::Tensor factor = premul_tensor_factor(op);
    return factor.defined() && factor.device() == t.device() ? factor.reshape({}).to(at::kFloat) : at::Tensor();
  }
  void cast(const at::Tensor& wide, const at::Tensor& wire, const Plan& plan, const compress::Dither& dither,
            uint64_t first) override {
    defer("cast", [cpu = cpu_, wide, wire, plan, dither, first] {
      cpu->cast(wide, wire, read_pre_scale(plan), dither, first);
    });
  }
  void restore(const at::Tensor& wire, const at::Tensor& wide, const Plan& plan) override {
    defer("restore", [cpu = cpu_, wire, wide, plan] { cpu->restore(wire, wide, plan); });
  }
  void sum(const at::Tensor& rows, const at::Tensor& wire, const Plan& plan, const compress::Dither& dither,
           uint64_t first) override {
    defer("sum", [cpu = cpu_, rows, wire, plan, dither, first] { cpu->sum(rows, wire, plan, dither, first); });
  }
  void sum_wide(const at::Tensor& rows, const at::Tensor& wide, const Plan& plan) override {
    defer("sum_wide", [cpu = cpu_, rows, wide, plan] { cpu->sum_wide(rows, wide, plan); });
  }
  void encode_frames(const std::vector<at::Tensor>& rows, int64_t count, const Plan& plan, const at::Tensor& frames,
                     const compress::Dither& dither) override {
    defer("encode_frames", [cpu = cpu_, rows, count, plan, frames, dither] {
      cpu->encode_frames(rows, count, read_pre_scale(plan), frames, dither);
    });
  }
  void sum_frames(const at::Tensor& frames, int64_t count, const Plan& plan, const at::Tensor& out,
                  const compress::Dither& dither, uint64_t first) override {
    defer("sum_frames", [cpu = cpu_, frames, count, plan, out, dither, first] {
      cpu->sum_frames(frames, count, plan, out, dither, first);
    });
  }
  void sum_frames_wide(const at::Tensor& frames, int64_t count, const Plan& plan, const at::Tensor& wide) override {
    defer("sum_frames_wide", [cpu = cpu_, frames, count, plan, wide] { cpu->sum_frames_wide(frames, count, plan, wide); });
  }
  void restore_frames(const at::Tensor& frames, int64_t count, const Plan& plan, const at::Tensor& wide) override {
    defer("restore_frames", [cpu = cpu_, frames, count, plan, wide] { cpu->restore_frames(frames, count, plan, wide); });
  }
  void run(const std::function<void()>& work) override { defer("aten", work); }

  composed::EventPtr record() override { return std::make_shared<Event>(streams_, streams_.record(streams_.current())); }
  void wait(const composed::EventPtr& event) override {
    streams_.wait(streams_.current(), static_cast<Event&>(*event).point);
  }
  void wait(c10d::Work& work) override { work.synchronize(); }
  std::shared_ptr<void> use_side_stream() override {
    const Streams::Id previous = streams_.current();
    streams_.set_current(side_);
    return std::shared_ptr<void>(nullptr, [this, previous](void*) { streams_.set_current(previous); });
  }
  void keep(const std::vector<at::Tensor>& buffers) override {
    for (const auto& b : buffers) kept.push_back({b.const_data_ptr(), streams_.record(streams_.current())});
  }

  Streams::Id side_stream() const { return side_; }

 private:
  // The plan as a kernel that reads its pre-scale on the device sees it when it runs.
  static Plan read_pre_scale(Plan plan) {
    if (plan.pre_scale_tensor.defined()) plan.pre_scale = plan.pre_scale_tensor.item<float>();
    plan.pre_scale_tensor = at::Tensor();
    return plan;
  }
  struct Event final : composed::Event {
    Event(Streams& s, Streams::Point p) : streams(s), point(p) {}
    bool query() override { return streams.reached(point); }
    Streams& streams;
    Streams::Point point;
  };
  void defer(const char* label, std::function<void()> fn) {
    if (streams_.executing()) return fn();
    streams_.enqueue(streams_.current(), std::move(fn), label);
  }

  Streams& streams_;
  const Streams::Id side_;
  std::shared_ptr<composed::Device> cpu_ = composed::make_cpu_device();
};

// ProcessGroupNCCL on Streams, rank `rank` of `world` ranks whose peers all hold what this rank
// holds: SUM multiplies by the world size in the tensor's own dtype (one rounding, as one 16-bit add
// rounds), MIN/MAX leave it; an all-to-all gives this rank every peer's part for it, which is its own.
class StreamEngine : public c10d::Backend {
 public:
  StreamEngine(Streams& streams, int rank, int world)
      : c10d::Backend(rank, world), streams_(streams), stream_(streams.create("nccl")) {}
  ~StreamEngine() override { lifetime->destroyed = true; }
  const std::string getBackendName() const override { return "nccl-like"; }

  // What each call received, in order: its name, the tensors' dtypes and the op.
  struct Call {
    std::string name;
    std::vector<at::ScalarType> dtypes;
    RedOp op = RedOp::UNUSED;
    bool async = true;
  };
  std::vector<Call> calls;
  std::vector<const void*> touched;  // the memory every call read or wrote
  int waits = 0;         // Work::wait() calls (ProcessGroupNCCL's blocks the host with blocking wait)
  int stream_waits = 0;  // Work::synchronize() calls (a stream wait, never the host)
  struct Lifetime {
    int shutdowns = 0, aborts = 0;
    bool destroyed = false;
  };
  std::shared_ptr<Lifetime> lifetime = std::make_shared<Lifetime>();  // outlives the engine
  bool fail_next = false;           // the next async call's future fails (as gloo's do)
  // The `throw_on_nth` call named `throw_on` throws at issue, as ProcessGroupNCCL's do on a communicator
  // in error (C10D_NCCL_CHECK in ProcessGroupNCCL::collective), after the earlier calls were enqueued.
  std::string throw_on;
  int throw_on_nth = 1;
  // ENABLE_INTRA_NODE_COMM=1: allreduce runs its kernel on the caller's current stream and returns a
  // work that orders nothing and has no future (IntraNodeCommWork, torch's
  // csrc/distributed/c10d/symm_mem/intra_node_comm.hpp: wait() returns true, synchronize() and
  // getFuture() are c10d::Work's; ProcessGroupNCCL::allreduce returns it when intraNodeComm_ picks an
  // algorithm).
  bool intra_node = false;
  // The network: while closed, no collective's kernel runs.
  std::shared_ptr<bool> network = std::make_shared<bool>(true);

  // The watchdog finds the work failed (a timeout, an aborted communicator), after the fact.
  static void watchdog_fails(c10d::Work& work, const std::string& why) {
    dynamic_cast<Work&>(work).set_exception(why);
  }

  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override {
    if (intra_node && !coalescing_) {
      calls.push_back({"allreduce (intra-node)", {}, opts.reduceOp.op_, opts.asyncOp});
      streams_.enqueue(streams_.current(), [tensors, op = opts.reduceOp.op_, this] {
        for (const auto& t : tensors) reduce(t, op);
      }, "intra-node allreduce", network);
      return c10::make_intrusive<IntraNodeWork>();
    }
    return issue("allreduce", tensors, opts.reduceOp.op_, opts.asyncOp, [tensors, op = opts.reduceOp.op_, this] {
      for (const auto& t : tensors) reduce(t, op);
    });
  }
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                     const c10d::AllreduceCoalescedOptions& opts) override {
    return allreduce(tensors, opts);
  }
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input, std::vector<int64_t>& out_splits,
                                               std::vector<int64_t>& in_splits,
                                               const c10d::AllToAllOptions& opts) override {
    EXPECT_TRUE(out_splits.empty() && in_splits.empty()) << "equal splits expected";
    std::vector<at::Tensor> ts{input, output};
    return issue("alltoall_base", ts, RedOp::UNUSED, opts.asyncOp, [output, input, this] {
      const int64_t part = input.numel() / size_;
      for (int q = 0; q < size_; ++q) output.narrow(0, q * part, part).copy_(input.narrow(0, rank_ * part, part));
    });
  }
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts) override {
    std::vector<at::Tensor> ts{input, output};
    return issue("_allgather_base", ts, RedOp::UNUSED, opts.asyncOp, [output, input, this] {
      for (int q = 0; q < size_; ++q) output.narrow(0, q * input.numel(), input.numel()).copy_(input);
    });
  }
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                      const c10d::ReduceScatterOptions& opts) override {
    std::vector<at::Tensor> ts{input, output};
    return issue("_reduce_scatter_base", ts, opts.reduceOp.op_, opts.asyncOp,
                 [output, input, op = opts.reduceOp.op_, this] {
                   at::Tensor mine = input.narrow(0, rank_ * output.numel(), output.numel()).clone();
                   reduce(mine, op);
                   output.copy_(mine);
                 });
  }
  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                 std::vector<at::Tensor>& inputs,
                                                                 const c10d::ReduceScatterOptions& opts) override {
    std::vector<at::Tensor> ts = inputs;
    ts.insert(ts.end(), outputs.begin(), outputs.end());
    return issue("reduce_scatter_tensor_coalesced", ts, opts.reduceOp.op_, opts.asyncOp,
                 [outputs, inputs, op = opts.reduceOp.op_, this] {
                   for (size_t i = 0; i < inputs.size(); ++i) {
                     at::Tensor mine = inputs[i].narrow(0, rank_ * outputs[i].numel(), outputs[i].numel()).clone();
                     reduce(mine, op);
                     outputs[i].copy_(mine);
                   }
                 });
  }
  // Point-to-point: ProcessGroupNCCL::pointToPoint always runs on its own stream.
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int, int) override {
    return issue("send", tensors, RedOp::UNUSED, true, [] {});
  }
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int, int) override {
    return issue("recv", tensors, RedOp::UNUSED, true, [] {});
  }

  bool supportsCoalescing() const override { return true; }
  void startCoalescing() override {
    calls.push_back({"startCoalescing"});
    coalescing_ = true;
  }
  // The calls of the group run as one kernel at the end; its work (a null one when the group is
  // empty, as ProcessGroupNCCL's endCoalescing returns).
  c10::intrusive_ptr<c10d::Work> endCoalescing() override {
    calls.push_back({"endCoalescing"});
    coalescing_ = false;
    if (grouped_.empty()) return {};
    auto kernels = std::move(grouped_);
    grouped_.clear();
    return launch([kernels] {
      for (const auto& k : kernels) k();
    }, {});
  }
  void shutdown() override { ++lifetime->shutdowns; }
  void abort() override { ++lifetime->aborts; }
  // The last work an asynchronous call returned.
  c10::intrusive_ptr<c10d::Work> last_work() const { return last_work_; }

 private:
  class IntraNodeWork final : public c10d::Work {
   public:
    bool wait(std::chrono::milliseconds) override { return true; }
  };

  class Work final : public c10d::Work {
   public:
    Work(StreamEngine& engine, Streams::Point end, c10::intrusive_ptr<c10::ivalue::Future> future)
        : engine_(engine), end_(end), future_(std::move(future)) {}
    void set_exception(const std::string& why) {
      std::lock_guard<std::mutex> lock(mutex_);
      exception_ = std::make_exception_ptr(c10::DistBackendError({__func__, __FILE__, uint32_t(__LINE__)}, why));
    }
    void synchronize() override {
      ++engine_.stream_waits;
      engine_.streams_.wait(engine_.streams_.current(), end_);
    }
    bool wait(std::chrono::milliseconds) override {
      ++engine_.waits;
      synchronize();
      if (auto e = exception()) std::rethrow_exception(e);
      return true;
    }
    bool isCompleted() override { return exception() || engine_.streams_.reached(end_); }
    bool isSuccess() const override {
      TORCH_CHECK(false, "WorkNCCL::isSuccess() is deprecated");
    }
    c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }

   private:
    StreamEngine& engine_;
    const Streams::Point end_;
    const c10::intrusive_ptr<c10::ivalue::Future> future_;
  };

  void reduce(const at::Tensor& t, RedOp op) {
    if (op == RedOp::SUM) t.mul_(size_);
    EXPECT_TRUE(op == RedOp::SUM || op == RedOp::MIN || op == RedOp::MAX) << "the engine got op " << int(op);
  }

  c10::intrusive_ptr<c10d::Work> issue(const char* name, const std::vector<at::Tensor>& tensors, RedOp op,
                                       bool async_op, std::function<void()> kernel) {
    if (name == throw_on && --throw_on_nth == 0) {
      C10_THROW_ERROR(DistBackendError, std::string(name) + ": NCCL communicator was aborted");
    }
    Call call{name, {}, op, async_op};
    for (const auto& t : tensors) {
      call.dtypes.push_back(t.scalar_type());
      touched.push_back(t.const_data_ptr());
    }
    calls.push_back(call);
    if (coalescing_) {
      grouped_.push_back(std::move(kernel));
      return {};
    }
    if (!async_op) {
      streams_.enqueue(streams_.current(), std::move(kernel), name, network);
      return {};
    }
    return launch(std::move(kernel), tensors);
  }

  c10::intrusive_ptr<c10d::Work> launch(std::function<void()> kernel, const std::vector<at::Tensor>& outputs) {
    streams_.wait(stream_, streams_.record(streams_.current()));  // syncStream
    streams_.enqueue(stream_, std::move(kernel), "collective", network);
    const Streams::Point end = streams_.record(stream_);  // ncclEndEvent_->record(ncclStream)
    auto future = c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()));
    if (std::exchange(fail_next, false)) {
      future->setError(std::make_exception_ptr(
          c10::DistBackendError({__func__, __FILE__, uint32_t(__LINE__)}, "NCCL communicator was aborted")));
    } else {
      future->markCompleted(c10::IValue(outputs));
    }
    last_work_ = c10::make_intrusive<Work>(*this, end, future);
    return last_work_;
  }

  Streams& streams_;
  const Streams::Id stream_;
  bool coalescing_ = false;
  std::vector<std::function<void()>> grouped_;
  c10::intrusive_ptr<c10d::Work> last_work_;
};

}  // namespace cnccl::testing

// The composed path against a test double that keeps ProcessGroupNCCL's contract (torch >= 2.8):
// no Work for a synchronous call, futures that complete later than the call returns, failures
// raised as DistBackendError. Oracles are plain ATen arithmetic written here, not cnccl's code.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>

#include <algorithm>
#include <deque>
#include <functional>

#include "backend/composed/composition.h"

namespace cnccl::composed {
namespace {

constexpr int kWorld = 4;

// A group of kWorld ranks whose peers all hold what this rank holds: SUM multiplies by kWorld in
// the tensor's own dtype (one rounding, as one 16-bit add would round), MIN/MAX leave it.
class NcclLikeEngine : public c10d::Backend {
 public:
  explicit NcclLikeEngine(int rank = 0) : c10d::Backend(rank, kWorld) {}
  const std::string getBackendName() const override { return "nccl-like"; }

  // What each call received: the tensors' dtypes, and the op.
  std::vector<std::pair<std::vector<at::ScalarType>, RedOp>> calls;
  // The memory every call read or wrote.
  std::vector<const void*> touched;
  // How often a work's wait() was called (ProcessGroupNCCL's blocks the host with blocking wait),
  // and its synchronize() (ProcessGroupNCCL's makes the current stream wait, never the host).
  int waits = 0;
  int stream_waits = 0;
  bool fail_next = false;

  // Runs the calls left pending, oldest first, and completes their futures ("late").
  void complete_pending() {
    while (!pending_.empty()) {
      auto run = std::move(pending_.front());
      pending_.pop_front();
      run();
    }
  }
  size_t pending() const { return pending_.size(); }
  // Device work on the current stream: it runs after every call issued before it, as a kernel
  // queued behind a stream wait would.
  void enqueue_on_stream(std::function<void()> run) { pending_.push_back(std::move(run)); }

  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override {
    return issue(tensors, opts.reduceOp.op_, opts.asyncOp, [tensors, op = opts.reduceOp.op_] {
      for (const auto& t : tensors) reduce(t, op);
    });
  }

  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                     const c10d::AllreduceCoalescedOptions& opts) override {
    return allreduce(tensors, opts);
  }

  // Every peer holds this rank's input, so what each sends this rank is its own part for this rank.
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input, std::vector<int64_t>& out_splits,
                                               std::vector<int64_t>& in_splits,
                                               const c10d::AllToAllOptions& opts) override {
    EXPECT_TRUE(out_splits.empty() && in_splits.empty()) << "equal splits expected";
    std::vector<at::Tensor> ts{input, output};
    return issue(ts, RedOp::UNUSED, opts.asyncOp, [output, input, rank = rank_] {
      const int64_t part = input.numel() / kWorld;
      for (int q = 0; q < kWorld; ++q) output.narrow(0, q * part, part).copy_(input.narrow(0, rank * part, part));
    });
  }

  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts) override {
    std::vector<at::Tensor> ts{input, output};
    return issue(ts, RedOp::UNUSED, opts.asyncOp, [output, input] {
      for (int q = 0; q < kWorld; ++q) output.narrow(0, q * input.numel(), input.numel()).copy_(input);
    });
  }

  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                      const c10d::ReduceScatterOptions& opts) override {
    std::vector<at::Tensor> ts{input, output};
    return issue(ts, opts.reduceOp.op_, opts.asyncOp, [output, input, rank = rank_, op = opts.reduceOp.op_] {
      at::Tensor mine = input.narrow(0, rank * output.numel(), output.numel()).clone();
      reduce(mine, op);
      output.copy_(mine);
    });
  }

 private:
  class Work : public c10d::Work {
   public:
    Work(c10::intrusive_ptr<c10::ivalue::Future> f, int* waits, int* stream_waits)
        : future_(std::move(f)), waits_(waits), stream_waits_(stream_waits) {}
    void synchronize() override { ++*stream_waits_; }
    bool wait(std::chrono::milliseconds) override {
      ++*waits_;
      future_->wait();
      if (future_->hasError()) std::rethrow_exception(future_->exception_ptr());
      return true;
    }
    bool isCompleted() override { return future_->completed(); }
    c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }

   private:
    c10::intrusive_ptr<c10::ivalue::Future> future_;
    int* waits_;
    int* stream_waits_;
  };

  static void reduce(const at::Tensor& t, RedOp op) {
    if (op == RedOp::SUM) t.mul_(kWorld);
    ASSERT_TRUE(op == RedOp::SUM || op == RedOp::MIN || op == RedOp::MAX) << "the engine got op " << int(op);
  }

  c10::intrusive_ptr<c10d::Work> issue(const std::vector<at::Tensor>& tensors, RedOp op, bool async_op,
                                       std::function<void()> run) {
    std::vector<at::ScalarType> dtypes;
    for (const auto& t : tensors) {
      dtypes.push_back(t.scalar_type());
      touched.push_back(t.const_data_ptr());
    }
    calls.emplace_back(dtypes, op);
    if (!async_op) {
      run();
      return {};  // ProcessGroupNCCL since torch 2.8: the kernel ran on the current stream, no Work
    }
    auto future = c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()));
    const bool fail = std::exchange(fail_next, false);
    pending_.push_back([future, run, fail, tensors] {
      if (fail) {
        future->setError(std::make_exception_ptr(
            c10::DistBackendError({__func__, __FILE__, uint32_t(__LINE__)}, "NCCL communicator was aborted")));
        return;
      }
      run();
      future->markCompleted(c10::IValue(tensors));
    });
    return c10::make_intrusive<Work>(future, &waits, &stream_waits);
  }

  std::deque<std::function<void()>> pending_;
};

// torch's ReduceOp(op, supplement) constructor drops the supplement, so the fields are set here.
c10d::ReduceOp premul_sum(const at::Tensor& factor) {
  c10d::ReduceOp op;
  op.op_ = RedOp::PREMUL_SUM;
  op.supplement_ = c10::make_intrusive<c10d::NCCLPreMulSumSupplement>(factor);
  return op;
}

// The CPU device, noting which buffers the composition asks it to keep from the allocator until the
// restores are done (the CUDA device records them on its side stream). Between engine calls it
// behaves as the CUDA device does: a stream wait, then work queued behind it.
class KeepingDevice : public Device {
 public:
  explicit KeepingDevice(NcclLikeEngine& engine) : engine_(engine) {}
  std::vector<const void*> kept;

  void order_after(const c10::intrusive_ptr<c10d::Work>& work) override {
    if (work) work->synchronize();
  }
  void sum(const at::Tensor& rows, const at::Tensor& wire, const Plan& plan, const compress::Dither& dither,
           uint64_t first) override {
    engine_.enqueue_on_stream(
        [cpu = cpu_, rows, wire, plan, dither, first] { cpu->sum(rows, wire, plan, dither, first); });
  }
  void sum_wide(const at::Tensor& rows, const at::Tensor& wide, const Plan& plan) override {
    cpu_->sum_wide(rows, wide, plan);
  }

  double premul_factor(const c10d::ReduceOp& op) override { return cpu_->premul_factor(op); }
  void cast(const at::Tensor& wide, const at::Tensor& wire, const Plan& plan, const compress::Dither& dither,
            uint64_t first) override {
    cpu_->cast(wide, wire, plan, dither, first);
  }
  void restore(const at::Tensor& wire, const at::Tensor& wide, const Plan& plan) override {
    cpu_->restore(wire, wide, plan);
  }
  void after(const std::vector<FuturePtr>& inner, const std::vector<at::Tensor>& buffers,
             const std::function<void()>& body) override {
    for (const auto& b : buffers) kept.push_back(b.const_data_ptr());
    cpu_->after(inner, buffers, body);
  }
  std::function<bool()> done_probe() override { return cpu_->done_probe(); }

 private:
  NcclLikeEngine& engine_;
  std::shared_ptr<Device> cpu_ = make_cpu_device();
};

class CompositionTest : public ::testing::Test {
 protected:
  CompositionTest()
      : engine_(c10::make_intrusive<NcclLikeEngine>()), device_(std::make_shared<KeepingDevice>(*engine_)) {
    config_.min_bytes = 1024;
    composition_ = std::make_unique<Composition>(Engine{engine_, "nccl-like"}, device_, config_, &stats_, 0, kWorld);
  }

  // The composition as rank `rank` of a group with accumulate=fp32.
  void use_fp32_sums(int rank = 0) {
    config_.accumulate = Accumulate::kFp32;
    engine_ = c10::make_intrusive<NcclLikeEngine>(rank);
    device_ = std::make_shared<KeepingDevice>(*engine_);
    composition_ =
        std::make_unique<Composition>(Engine{engine_, "nccl-like"}, device_, config_, &stats_, rank, kWorld);
  }

  NcclLikeEngine& engine() { return *engine_; }
  Composition& composition() { return *composition_; }

  // What the composed path must produce for an allreduce of `x` on kWorld identical ranks:
  // round16(x * pre) summed (one rounding), widened, times post. Plain ATen, fp16 wire.
  static at::Tensor expected_sum(const at::Tensor& x, double pre, double post) {
    at::Tensor wire = (x.to(at::kFloat) * pre).to(at::kHalf);
    return (wire * kWorld).to(at::kFloat).mul(post).to(x.scalar_type());
  }

  static at::Tensor values(int64_t n) {
    return at::linspace(-3.0, 5.0, n, at::kFloat).add(1.0 / 3.0);
  }

  Config config_;
  Stats stats_;
  c10::intrusive_ptr<NcclLikeEngine> engine_;
  std::shared_ptr<KeepingDevice> device_;
  std::unique_ptr<Composition> composition_;
};

TEST_F(CompositionTest, SynchronousCallWithNoEngineWorkRestoresBeforeReturning) {
  at::Tensor x = values(4096);
  std::vector<at::Tensor> ts{x.clone()};
  c10d::AllreduceOptions opts;
  opts.asyncOp = false;
  auto work = composition().allreduce(ts, opts);
  ASSERT_TRUE(work) << "cnccl returns a Work even when the engine returns none";
  EXPECT_TRUE(work->isCompleted());
  EXPECT_TRUE(at::equal(ts[0], expected_sum(x, 1.0, 1.0)));
  EXPECT_EQ(engine().calls.at(0).first, std::vector<at::ScalarType>{at::kHalf});
  EXPECT_TRUE(work->wait());
}

TEST_F(CompositionTest, FutureCompletesOnlyAfterTheEngineAndTheRestore) {
  at::Tensor x = values(4096);
  std::vector<at::Tensor> ts{x.clone()};
  c10d::AllreduceOptions opts;
  opts.reduceOp = c10d::ReduceOp(RedOp::AVG);
  auto work = composition().allreduce(ts, opts);
  auto future = work->getFuture();
  EXPECT_FALSE(future->completed());
  EXPECT_FALSE(work->isCompleted());
  EXPECT_TRUE(at::equal(ts[0], x)) << "the tensor changed before the engine finished";
  engine().complete_pending();
  ASSERT_TRUE(future->completed());
  EXPECT_TRUE(work->isCompleted());
  EXPECT_TRUE(at::equal(ts[0], expected_sum(x, 1.0 / kWorld, 1.0)));
  const auto value = future->value().toTensorVector();
  ASSERT_EQ(value.size(), 1u);
  EXPECT_TRUE(value[0].is_same(ts[0])) << "the future holds the caller's own tensor";
  EXPECT_EQ(engine().calls.at(0).second, RedOp::SUM) << "AVG's division was applied in the cast";
}

TEST_F(CompositionTest, EngineFailureIsADistBackendErrorAndLeavesTheTensor) {
  at::Tensor x = values(4096);
  std::vector<at::Tensor> ts{x.clone()};
  engine().fail_next = true;
  auto work = composition().allreduce(ts, c10d::AllreduceOptions());
  engine().complete_pending();
  EXPECT_TRUE(work->isCompleted());
  EXPECT_FALSE(work->isSuccess());
  EXPECT_THROW(work->wait(), c10::DistBackendError);
  EXPECT_TRUE(work->getFuture()->hasError());
  EXPECT_TRUE(at::equal(ts[0], x)) << "a failed collective wrote into the caller's tensor";
  try {
    work->wait();
  } catch (const c10::DistBackendError& e) {
    const std::string what = e.what_without_backtrace();
    EXPECT_NE(what.find("cnccl allreduce (over nccl-like)"), std::string::npos) << what;
    EXPECT_NE(what.find("communicator was aborted"), std::string::npos) << what;
  }
}

TEST_F(CompositionTest, CoalescedCallSplitsByKindAndCompletesAfterEveryPart) {
  at::Tensor big = values(4096), small = values(16), ints = at::arange(10, at::kLong);
  std::vector<at::Tensor> ts{big.clone(), small.clone(), ints.clone()};
  auto work = composition().allreduce_coalesced(ts, c10d::AllreduceCoalescedOptions());
  ASSERT_EQ(engine().calls.size(), 2u) << "one call for the compressed tensor, one for the plain ones";
  EXPECT_EQ(engine().calls[0].first, std::vector<at::ScalarType>{at::kHalf});
  EXPECT_EQ(engine().calls[1].first, (std::vector<at::ScalarType>{at::kFloat, at::kLong}));
  EXPECT_EQ(engine().pending(), 2u);
  EXPECT_FALSE(work->getFuture()->completed());
  engine().complete_pending();
  ASSERT_TRUE(work->getFuture()->completed());
  EXPECT_TRUE(at::equal(ts[0], expected_sum(big, 1.0, 1.0)));
  EXPECT_TRUE(at::equal(ts[1], small * kWorld));
  EXPECT_TRUE(at::equal(ts[2], ints * kWorld));
}

TEST_F(CompositionTest, UncompressedPremulSumNeverReadsItsTensorFactor) {
  // A meta tensor cannot be read on the host: reading it would throw.
  const at::Tensor factor = at::ones({1}, at::TensorOptions().device(at::kMeta));
  c10d::AllreduceOptions opts;
  opts.reduceOp = premul_sum(factor);
  std::vector<at::Tensor> small{values(16)};  // below min_bytes: goes to the engine as it is
  EXPECT_NO_THROW(composition().allreduce(small, opts));
  EXPECT_EQ(engine().calls.back().second, RedOp::PREMUL_SUM) << "the engine applies the factor itself";
  std::vector<at::Tensor> big{values(4096)};
  try {
    composition().allreduce(big, opts);
    ADD_FAILURE() << "compressing needs the factor on the host, which a meta tensor cannot give";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("meta"), std::string::npos) << e.what();
  }
}

TEST_F(CompositionTest, PremulSumTensorFactorIsAppliedInTheCast) {
  const at::Tensor x = values(4 * 1024);
  at::Tensor out = at::empty({1024});
  at::Tensor in = x.clone();
  c10d::ReduceScatterOptions opts;
  opts.reduceOp = premul_sum(at::full({1}, 0.5));
  auto work = composition().reduce_scatter_tensor(out, in, opts);
  engine().complete_pending();
  work->wait();
  EXPECT_TRUE(at::equal(out, expected_sum(x.narrow(0, 0, 1024), 0.5, 1.0)));
  EXPECT_TRUE(at::equal(in, x)) << "reduce_scatter must not modify its input";
}

TEST_F(CompositionTest, StridedTensorIsReducedThroughAContiguousStage) {
  at::Tensor base = values(64 * 64).view({64, 64});
  at::Tensor view = base.t();
  const at::Tensor expected = expected_sum(view.contiguous(), 1.0, 1.0);
  std::vector<at::Tensor> ts{view};
  composition().allreduce(ts, c10d::AllreduceOptions());
  engine().complete_pending();
  EXPECT_TRUE(at::equal(view, expected)) << "the result must land in the caller's memory through the view";
}

TEST_F(CompositionTest, EveryBufferTheEngineTouchedIsKeptUntilTheRestoresRan) {
  at::Tensor in = values(4 * 1024);
  at::Tensor out = at::empty({1024});
  // reduce_scatter's 16-bit input is read by the engine and by nothing after it: the buffer most
  // easily handed back to the allocator while the engine still reads it.
  auto work = composition().reduce_scatter_tensor(out, in, c10d::ReduceScatterOptions());
  std::vector<at::Tensor> ts{in.clone()};
  auto work2 = composition().allreduce(ts, c10d::AllreduceOptions());
  engine().complete_pending();
  work->wait();
  work2->wait();
  ASSERT_FALSE(engine().touched.empty());
  for (const void* p : engine().touched) {
    EXPECT_NE(std::find(device_->kept.begin(), device_->kept.end(), p), device_->kept.end())
        << "a buffer the engine used was not kept until the restores ran";
  }
}

TEST_F(CompositionTest, IssuingNeverWaitsOnTheEngine) {
  // With TORCH_NCCL_BLOCKING_WAIT=1, ProcessGroupNCCL's wait() blocks the host: calling it while
  // issuing would make every compressed collective synchronous.
  std::vector<at::Tensor> ts{values(4096)};
  auto work = composition().allreduce(ts, c10d::AllreduceOptions());
  std::vector<at::Tensor> parts{values(4096), values(16)};
  auto work2 = composition().allreduce_coalesced(parts, c10d::AllreduceCoalescedOptions());
  EXPECT_EQ(engine().waits, 0);
  engine().complete_pending();
  EXPECT_EQ(engine().waits, 0) << "the restores ran on completion, without waiting on the engine";
  work->wait();
  EXPECT_EQ(engine().waits, 1) << "the caller's wait() is the engine's (its errors, its blocking mode)";
}

TEST_F(CompositionTest, BlockCurrentStreamWaitsForTheRestoreNotTheEngine) {
  std::vector<at::Tensor> ts{values(4096)};
  const at::Tensor x = ts[0].clone();
  auto work = composition().allreduce(ts, c10d::AllreduceOptions());
  engine().complete_pending();
  work->blockCurrentStream();
  EXPECT_EQ(engine().waits, 0);
  EXPECT_TRUE(at::equal(ts[0], expected_sum(x, 1.0, 1.0)));
  engine().fail_next = true;
  std::vector<at::Tensor> ts2{values(4096)};
  auto failed = composition().allreduce(ts2, c10d::AllreduceOptions());
  engine().complete_pending();
  EXPECT_THROW(failed->blockCurrentStream(), c10::DistBackendError);
}

TEST_F(CompositionTest, Fp32SumsGoToTheOwnersAndBackWithoutTheHostWaiting) {
  use_fp32_sums(/*rank=*/1);
  const at::Tensor x = values(4097);  // not a multiple of the world size: the last part is padded
  for (RedOp op : {RedOp::SUM, RedOp::AVG}) {
    engine().calls.clear();
    engine().waits = 0;
    std::vector<at::Tensor> ts{x.clone()};
    c10d::AllreduceOptions opts;
    opts.reduceOp = c10d::ReduceOp(op);
    auto work = composition().allreduce(ts, opts);
    ASSERT_EQ(engine().calls.size(), 2u) << "an all-to-all to the owners, then an allgather";
    EXPECT_EQ(engine().calls[0].first, (std::vector<at::ScalarType>{at::kHalf, at::kHalf}));
    EXPECT_EQ(engine().waits, 0) << "the host never waits between the two";
    EXPECT_GE(engine().stream_waits, 1) << "the sum waits on the all-to-all on the stream";
    EXPECT_TRUE(at::equal(ts[0], x)) << "the tensor changed before the engine finished";
    engine().complete_pending();
    work->wait();
    // kWorld equal rows summed in fp32 and rounded once: the same bits as one 16-bit multiply.
    // This double's allgather can only give back this rank's own part, so that part is checked
    // here; tests/python/test_accumulate.py checks every part over gloo at 2-4 ranks.
    const int64_t part = (x.numel() + kWorld - 1) / kWorld;
    const at::Tensor want = expected_sum(x, op == RedOp::AVG ? 1.0 / kWorld : 1.0, 1.0);
    EXPECT_TRUE(at::equal(ts[0].narrow(0, part, part), want.narrow(0, part, part))) << op_name(op);
  }
}

TEST_F(CompositionTest, Fp32SumsReduceScatterNeverRoundsTheSumTo16Bits) {
  use_fp32_sums(/*rank=*/2);
  // 30000 is exact in fp16; four of them (120000) are not representable there (fp16 overflows
  // above 65504), but are in fp32.
  at::Tensor in = at::full({4 * 1000}, 30000.0f);
  in.narrow(0, 2 * 1000, 1000).copy_(values(1000));  // rank 2's own part
  at::Tensor out = at::empty({1000});
  auto work = composition().reduce_scatter_tensor(out, in, c10d::ReduceScatterOptions());
  EXPECT_EQ(engine().calls.at(0).second, RedOp::UNUSED) << "an all-to-all, not a reduce-scatter";
  engine().complete_pending();
  work->wait();
  const at::Tensor own = values(1000).to(at::kHalf).to(at::kFloat);
  EXPECT_TRUE(at::equal(out, own * kWorld));
  at::Tensor big = at::full({4 * 1000}, 30000.0f);
  auto work2 = composition().reduce_scatter_tensor(out, big, c10d::ReduceScatterOptions());
  engine().complete_pending();
  work2->wait();
  EXPECT_TRUE(at::equal(out, at::full({1000}, 120000.0f))) << out[0].item<float>();
}

TEST_F(CompositionTest, Fp32SumsFailureOfTheAllToAllFailsTheWorkAndLeavesTheTensor) {
  use_fp32_sums();
  const at::Tensor x = values(4096);
  std::vector<at::Tensor> ts{x.clone()};
  engine().fail_next = true;  // the all-to-all
  auto work = composition().allreduce(ts, c10d::AllreduceOptions());
  engine().complete_pending();
  EXPECT_THROW(work->wait(), c10::DistBackendError);
  EXPECT_TRUE(at::equal(ts[0], x)) << "a failed collective wrote into the caller's tensor";
}

}  // namespace
}  // namespace cnccl::composed

// The composed path over a double of ProcessGroupNCCL that keeps CUDA's stream order on the CPU
// (stream_double.h, which cites the torch sources it copies): kernels run later, in stream order,
// with the newest runnable work first where the order lets it, so a restore that is not ordered
// after the engine reads a stage the engine has not written, and a caller that is not ordered after
// the restore reads its tensor before the result is there. Oracles are plain ATen arithmetic written
// here, not cnccl's code.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <algorithm>
#include <future>
#include <optional>

#include "backend/composed/composed_path.h"
#include "backend/composed/issuer.h"
#include "backend/composed/composition.h"
#include "backend/frames.h"
#include "backend/process_group.h"
#include "tests/cpp/counting_allocator.h"
#include "tests/cpp/gloo_double.h"
#include "tests/cpp/stream_double.h"

namespace cnccl::composed {
namespace {

using testing::StreamDevice;
using testing::StreamEngine;
using testing::Streams;

constexpr int kWorld = 4;
constexpr Streams::Order kOrders[] = {Streams::Order::kIssue, Streams::Order::kAdversarial};

const char* order_name(Streams::Order order) {
  return order == Streams::Order::kIssue ? "issue order" : "adversarial order";
}

Config base_config() {
  Config config;
  config.min_bytes = 1024;
  return config;
}

Config fp32_sums_config() {
  Config config = base_config();
  config.accumulate = Accumulate::kFp32;
  return config;
}

constexpr compress::Wire kFramedWires[] = {compress::Wire::kFp16,  compress::Wire::kBf16,       compress::Wire::kE4m3,
                                            compress::Wire::kE5m2,  compress::Wire::kMxfp8,      compress::Wire::kMxfp8E5m2,
                                            compress::Wire::kMxfp4};

// Every part in a frame (backend/frames.h): power-of-two frames for the 16- and 8-bit wires, MX blocks.
Config framed_config(compress::Wire wire) {
  Config config = fp32_sums_config();
  config.wire = wire;
  if (!compress::is_mx(wire)) config.scaling = Scaling::kPow2;
  return config;
}

// One rank's composition over the double, on streams run in `order`.
struct Rig {
  explicit Rig(Streams::Order order = Streams::Order::kAdversarial, const Config& config = base_config(), int rank = 0,
               int world = kWorld)
      : streams(order),
        engine(c10::make_intrusive<StreamEngine>(streams, rank, world)),
        device(std::make_shared<StreamDevice>(streams)),
        composition(Engine{engine, "nccl-like"}, device, config, &stats, rank, world) {}

  // `x`, written into a fresh tensor by a kernel on the caller's stream: the collective's cast must
  // run after it.
  at::Tensor produced(const at::Tensor& x) {
    at::Tensor t = at::full_like(x, -7.0);
    streams.enqueue(streams.current(), [t, x] { t.copy_(x); }, "caller writes its input");
    return t;
  }
  // `t` as a kernel the caller enqueues now on its stream reads it, once every stream has run.
  at::Tensor observe(const at::Tensor& t) {
    auto seen = std::make_shared<at::Tensor>();
    streams.enqueue(streams.current(), [t, seen] { *seen = t.clone(); }, "caller reads");
    streams.run();
    EXPECT_TRUE(seen->defined()) << "the caller's stream never got to its read";
    return seen->defined() ? *seen : at::full_like(t, std::nan(""));
  }

  Streams streams;
  c10::intrusive_ptr<StreamEngine> engine;
  std::shared_ptr<StreamDevice> device;
  Stats stats;
  Composition composition;
};

// What the composed path must produce for an allreduce of `x` on kWorld identical ranks:
// round16(x * pre) summed (one rounding), widened, times post. Plain ATen, fp16 wire.
at::Tensor expected_sum(const at::Tensor& x, double pre, double post) {
  at::Tensor wire = (x.to(at::kFloat) * pre).to(at::kHalf);
  return (wire * kWorld).to(at::kFloat).mul(post).to(x.scalar_type());
}

at::Tensor values(int64_t n) { return at::linspace(-3.0, 5.0, n, at::kFloat).add(1.0 / 3.0); }

// torch's ReduceOp(op, supplement) constructor drops the supplement, so the fields are set here.
template <typename Factor>
c10d::ReduceOp premul_sum(const Factor& factor) {
  c10d::ReduceOp op;
  op.op_ = RedOp::PREMUL_SUM;
  op.supplement_ = c10::make_intrusive<c10d::NCCLPreMulSumSupplement>(factor);
  return op;
}

template <typename Opts>
Opts synchronous() {
  Opts opts;
  opts.asyncOp = false;
  return opts;
}

// --- Stream order -------------------------------------------------------------------------------

// ProcessGroupNCCL runs a synchronous call on the caller's stream and returns no Work: the restore
// must still follow the cast and the engine's kernel, and the caller's next kernel the restore
// (FSDP2's reduce-scatter, dist.all_reduce with async_op=False).
TEST(StreamOrder, EverySynchronousFormIsOrderedAfterTheEngineAndBeforeTheCallersNextKernel) {
  for (const auto order : kOrders) {
    SCOPED_TRACE(order_name(order));
    const at::Tensor x = values(4 * 1024);
    {
      Rig rig(order);
      std::vector<at::Tensor> ts{rig.produced(x)};
      ASSERT_TRUE(rig.composition.allreduce(ts, synchronous<c10d::AllreduceOptions>()));
      EXPECT_FALSE(rig.engine->calls.at(0).async);
      EXPECT_TRUE(at::equal(rig.observe(ts[0]), expected_sum(x, 1.0, 1.0))) << "allreduce";
    }
    {
      Rig rig(order);
      std::vector<at::Tensor> ts{rig.produced(x), rig.produced(values(16))};
      rig.composition.allreduce_coalesced(ts, synchronous<c10d::AllreduceCoalescedOptions>());
      EXPECT_TRUE(at::equal(rig.observe(ts[0]), expected_sum(x, 1.0, 1.0))) << "allreduce_coalesced";
      EXPECT_TRUE(at::equal(rig.observe(ts[1]), values(16) * kWorld)) << "allreduce_coalesced, passed through";
    }
    {
      Rig rig(order);
      at::Tensor in = rig.produced(x), out = at::full({1024}, -7.0f);
      auto opts = synchronous<c10d::ReduceScatterOptions>();
      opts.reduceOp = c10d::ReduceOp(RedOp::AVG);
      rig.composition.reduce_scatter_tensor(out, in, opts);
      EXPECT_TRUE(at::equal(rig.observe(out), expected_sum(x.narrow(0, 0, 1024), 1.0 / kWorld, 1.0)))
          << "reduce_scatter_tensor";
    }
    {
      Rig rig(order);
      std::vector<at::Tensor> outs{at::full({1024}, -7.0f)};
      std::vector<std::vector<at::Tensor>> ins{{}};
      for (int q = 0; q < kWorld; ++q) ins[0].push_back(rig.produced(x.narrow(0, q * 1024, 1024).clone()));
      rig.composition.reduce_scatter(outs, ins, synchronous<c10d::ReduceScatterOptions>());
      EXPECT_TRUE(at::equal(rig.observe(outs[0]), expected_sum(x.narrow(0, 0, 1024), 1.0, 1.0))) << "reduce_scatter";
    }
    {
      Config none = base_config();
      none.wire.reset();
      Rig rig(order, none);  // a strided tensor goes through a contiguous stage even uncompressed
      at::Tensor base = rig.produced(values(64 * 64).view({64, 64}));
      std::vector<at::Tensor> ts{base.t()};
      rig.composition.allreduce(ts, synchronous<c10d::AllreduceOptions>());
      EXPECT_TRUE(at::equal(rig.observe(base), values(64 * 64).view({64, 64}) * kWorld)) << "strided, wire none";
    }
    {
      Rig rig(order, fp32_sums_config(), /*rank=*/1);
      std::vector<at::Tensor> ts{rig.produced(x)};
      rig.composition.allreduce(ts, synchronous<c10d::AllreduceOptions>());
      // The double's allgather gives back this rank's own part only (every peer holds this rank's
      // values), so that part is checked; tests/python/test_accumulate.py checks every part over gloo.
      EXPECT_TRUE(at::equal(rig.observe(ts[0]).narrow(0, 1024, 1024), expected_sum(x, 1.0, 1.0).narrow(0, 1024, 1024)))
          << "allreduce with fp32 sums";
    }
    {
      Rig rig(order, fp32_sums_config(), /*rank=*/2);
      at::Tensor in = rig.produced(x), out = at::full({1024}, -7.0f);
      rig.composition.reduce_scatter_tensor(out, in, synchronous<c10d::ReduceScatterOptions>());
      const at::Tensor own = x.narrow(0, 2 * 1024, 1024).to(at::kHalf).to(at::kFloat);
      EXPECT_TRUE(at::equal(rig.observe(out), own * kWorld)) << "reduce_scatter with fp32 sums";
    }
  }
}

// DDP's allreduces are asynchronous: the caller's stream sees the result once it waited on the work.
TEST(StreamOrder, AnAsynchronousCallIsSeenByTheCallerAfterWait) {
  for (const auto order : kOrders) {
    SCOPED_TRACE(order_name(order));
    for (const Config& config : {base_config(), fp32_sums_config()}) {
      Rig rig(order, config);
      const at::Tensor x = values(4 * 1024);
      std::vector<at::Tensor> ts{rig.produced(x)};
      auto work = rig.composition.allreduce(ts, c10d::AllreduceOptions());
      EXPECT_FALSE(work->isCompleted()) << "the restore has not run yet";
      work->wait();
      const at::Tensor seen = rig.observe(ts[0]);
      EXPECT_TRUE(work->isCompleted());
      EXPECT_TRUE(at::equal(seen.narrow(0, 0, 1024), expected_sum(x, 1.0, 1.0).narrow(0, 0, 1024)))
          << config.accumulate_name();
      EXPECT_EQ(rig.engine->waits, config.accumulate == Accumulate::kFp32 ? 2 : 1)
          << "the caller's wait() is the engine's, for each of its works (their errors, their blocking mode)";
    }
  }
}

// With fp32 sums the owner's sum sits between two engine calls. It runs on cnccl's side stream: the
// caller's stream must go on with its compute (DDP's backward) while the network is busy.
TEST(StreamOrder, Fp32SumsNeverMakeTheCallersStreamWaitForTheNetwork) {
  for (const auto order : kOrders) {
    SCOPED_TRACE(order_name(order));
    Rig rig(order, fp32_sums_config());
    const at::Tensor x = values(4 * 1024);
    std::vector<at::Tensor> ts{rig.produced(x)};
    *rig.engine->network = false;
    auto work = rig.composition.allreduce(ts, c10d::AllreduceOptions());
    bool computed = false;
    rig.streams.enqueue(rig.streams.current(), [&computed] { computed = true; }, "caller's compute");
    rig.streams.run();
    EXPECT_TRUE(computed) << "the caller's stream waited for the network";
    EXPECT_FALSE(work->isCompleted());
    *rig.engine->network = true;
    work->wait();
    EXPECT_TRUE(at::equal(rig.observe(ts[0]).narrow(0, 0, 1024), expected_sum(x, 1.0, 1.0).narrow(0, 0, 1024)));
    EXPECT_EQ(rig.engine->waits, 2) << "the host waits only in the caller's wait(), once for each engine work";
  }
}

// ProcessGroupNCCL's watchdog sets a work's exception after the fact (a timeout, an aborted
// communicator), when cnccl has long enqueued its restore and completed its future.
TEST(StreamOrder, AnErrorTheWatchdogSetsLaterFailsTheWork) {
  Rig rig;
  std::vector<at::Tensor> ts{values(4096)};
  auto work = rig.composition.allreduce(ts, c10d::AllreduceOptions());
  rig.streams.run();
  ASSERT_TRUE(work->isCompleted());
  ASSERT_TRUE(work->isSuccess());
  StreamEngine::watchdog_fails(*rig.engine->last_work(), "Watchdog caught collective operation timeout");
  EXPECT_TRUE(work->isCompleted());
  EXPECT_FALSE(work->isSuccess());
  ASSERT_TRUE(work->exception());
  try {
    std::rethrow_exception(work->exception());
  } catch (const c10::DistBackendError& e) {
    const std::string what = e.what_without_backtrace();
    EXPECT_NE(what.find("cnccl allreduce (over nccl-like): the inner collective failed"), std::string::npos) << what;
    EXPECT_NE(what.find("Watchdog caught collective operation timeout"), std::string::npos) << what;
  }
  EXPECT_THROW(work->wait(), c10::DistBackendError);
  EXPECT_THROW(work->blockCurrentStream(), c10::DistBackendError);
}

// The capture state that decides whether a tensor factor may be read is the collective's device's.
TEST(StreamOrder, PremulSumFactorIsReadForTheCollectivesDevice) {
  Rig rig;
  c10d::AllreduceOptions opts;
  opts.reduceOp = premul_sum(at::full({1}, 0.5));
  std::vector<at::Tensor> ts{values(4096)};
  rig.composition.allreduce(ts, opts);
  ASSERT_EQ(rig.device->premul_devices.size(), 1u);
  EXPECT_EQ(rig.device->premul_devices[0], ts[0].device());
}

// A compressed call's kernels read a tensor factor on its device when they run, never the host (a read
// there would wait for the device, and is refused during CUDA graph capture): a factor changed after the
// call was issued, before its kernels ran, gives what that value as a number gives; on every kind of
// cast (16-bit, stochastic, frames, MX blocks).
TEST(StreamOrder, ACompressedCallsKernelsReadATensorFactorWhenTheyRun) {
  Config stochastic = fp32_sums_config();
  stochastic.rounding = Rounding::kStochastic;
  for (const Config& config : {base_config(), fp32_sums_config(), stochastic, framed_config(compress::Wire::kE4m3),
                               framed_config(compress::Wire::kMxfp8)}) {
    const at::Tensor x = values(4096);
    Rig by_number(Streams::Order::kIssue, config);
    c10d::AllreduceOptions number;
    number.reduceOp = premul_sum(0.25);
    std::vector<at::Tensor> want{x.clone()};
    by_number.composition.allreduce(want, number)->wait();
    Rig by_tensor(Streams::Order::kAdversarial, config);
    const at::Tensor factor = at::full({1}, 0.5);
    c10d::AllreduceOptions tensor;
    tensor.reduceOp = premul_sum(factor);
    std::vector<at::Tensor> got{by_tensor.produced(x)};
    auto work = by_tensor.composition.allreduce(got, tensor);
    factor.fill_(0.25);  // after the issue, before the streams run
    work->wait();
    const std::string what = std::string(config.wire_name()) + " " + config.accumulate_name() + " " +
                             (config.rounding == Rounding::kStochastic ? "sr" : "rne");
    EXPECT_TRUE(at::equal(by_tensor.observe(got[0]), by_number.observe(want[0]))) << what;
    EXPECT_EQ(by_tensor.device->premul_host_reads, 0) << what;
  }
}

// ENABLE_INTRA_NODE_COMM=1: the engine's kernel runs on the issuing stream and its work orders
// nothing; the asynchronous restore, on the side stream, must still follow it.
TEST(StreamOrder, AnAsynchronousRestoreFollowsAnIntraNodeAllreduce) {
  for (const auto order : kOrders) {
    SCOPED_TRACE(order_name(order));
    Rig rig(order);
    rig.engine->intra_node = true;
    const at::Tensor x = values(4 * 1024);
    std::vector<at::Tensor> ts{rig.produced(x)};
    auto work = rig.composition.allreduce(ts, c10d::AllreduceOptions{});
    ASSERT_EQ(rig.engine->calls.at(0).name, "allreduce (intra-node)");
    work->wait();
    EXPECT_TRUE(at::equal(rig.observe(ts[0]), expected_sum(x, 1.0, 1.0)));
  }
}

// A PREMUL_SUM factor is asked for once per tensor and call, also for a tensor with fp32 sums in a
// coalesced call (a host read of a CUDA tensor factor is a device sync).
TEST(StreamOrder, APremulSumTensorFactorIsAskedForOncePerTensor) {
  Rig rig(Streams::Order::kIssue, fp32_sums_config());
  c10d::AllreduceCoalescedOptions opts;
  opts.reduceOp = premul_sum(at::full({1}, 0.5));
  std::vector<at::Tensor> ts{values(4096), values(8192)};
  rig.composition.allreduce_coalesced(ts, opts);
  rig.streams.run();
  EXPECT_EQ(rig.device->premul_devices.size(), ts.size());
}

size_t calls_named(const StreamEngine& engine, const std::string& name) {
  size_t count = 0;
  for (const auto& call : engine.calls) count += call.name == name;
  return count;
}

// Peak bytes per element an allreduce of `x` holds on `rank` (a counting allocator standing for the
// caching allocator), and x's result.
// `all_to_alls`, if given, is set to how many all-to-alls the call made.
std::pair<double, at::Tensor> allreduce_peak(const Config& config, const at::Tensor& x, int rank,
                                             Streams::Order order = Streams::Order::kIssue, int world = kWorld,
                                             size_t* all_to_alls = nullptr) {
  Rig rig(order, config, rank, world);
  std::vector<at::Tensor> ts{rig.produced(x)};
  int64_t peak = 0;
  {
    cnccl::testing::CountingAllocator counting;
    rig.composition.allreduce(ts, c10d::AllreduceOptions{});
    rig.streams.run();
    peak = counting.peak();
  }
  if (all_to_alls) *all_to_alls = calls_named(*rig.engine, "alltoall_base");
  return {double(peak) / double(x.numel()), rig.observe(ts[0])};
}

// The peaks are plans, held both ways: a counting allocator that counted nothing, or a buffer that doubled,
// fails. The slack is the calls' small tensors (signatures, scales) over 16K-4M elements.
constexpr double kPeakSlack = 0.005;

// Bytes an element a call in frames holds: one buffer of frames, and beside it the all-to-all's receive
// buffer, or from 8 MiB of frames (the 16-bit frames here) one chunk in eight each way.
double planned_frames_peak(compress::Wire wire) {
  const double frame = compress::is_mx(wire) ? double(compress::mx_bytes(1 << 20, wire)) / (1 << 20)
                                             : double(compress::wire_bytes(wire));
  return compress::wire_bytes(wire) == 2 && !compress::is_mx(wire) ? frame * (1 + 2.0 / 8) : 2 * frame;
}

// An allreduce with fp32 sums holds, to its restore, the 16-bit contributions sent and those received:
// its own part's sum lands in its row of the buffer sent, and the allgather gathers there in place.
// 2 + 2 bytes per element below 4 MiB of stage (4.5 at these 4 ranks with a sum buffer of its own, 6.5
// with a gathered buffer too; the GPU measured 8 at world size 1 before).
TEST(Composition, AnAllreduceWithFp32SumsSumsAndGathersInTheBufferItSent) {
  const int64_t n = int64_t(1) << 14;  // below ATen's grain: no OpenMP threads (uninstrumented under TSan)
  const auto [peak, got] = allreduce_peak(fp32_sums_config(), values(n), 0);
  EXPECT_NEAR(peak, 4.0, kPeakSlack) << "bytes per element held by the call";
  // The double's peers hold what this rank holds: this rank's own part is the one to check.
  EXPECT_TRUE(at::equal(got.narrow(0, 0, n / kWorld), expected_sum(values(n), 1.0, 1.0).narrow(0, 0, n / kWorld)));
}

// From 4 MiB of stage on the all-to-all goes in four column chunks through one buffer each way, each
// chunk summed before the next is received: 2 + 4/4 bytes per element (the issue's goal for fp32 sums:
// 3, against the hook's 2). In adversarial order a chunk received before the last one's sum read the
// rows, or copied out before the engine read the last, gives a wrong part. Every rank's part is checked:
// each owns different columns of every chunk.
TEST(Composition, ALargeAllreduceWithFp32SumsGoesToTheOwnersInChunksThroughOneBuffer) {
  at::set_num_threads(1);  // 2M elements: ATen's own loops stay on this thread (TSan)
  const int64_t n = (int64_t(1) << 21) + 7, part = (n + kWorld - 1) / kWorld;
  const at::Tensor x = values(n);
  const at::Tensor want = expected_sum(x, 1.0, 1.0);
  for (auto order : kOrders) {
    for (int rank = 0; rank < kWorld; ++rank) {
      const auto [peak, got] = allreduce_peak(fp32_sums_config(), x, rank, order);
      EXPECT_NEAR(peak, 3.0, kPeakSlack) << order_name(order) << ", rank " << rank
                                         << ": bytes per element held by the call";
      const int64_t first = rank * part, len = std::min(part, n - first);
      EXPECT_TRUE(at::equal(got.narrow(0, first, len), want.narrow(0, first, len)))
          << order_name(order) << ", rank " << rank << ": its part";
    }
  }
}

// The 16-bit wires hold what fp16_compress_hook holds, the 16-bit copy the engine reduces in place (2 bytes
// an element); stochastic rounding, fp32 sums' (3 from 2M elements).
TEST(Composition, EveryUnframedWireHoldsItsPlannedPeak) {
  at::set_num_threads(1);
  const at::Tensor x = values((int64_t(1) << 21) + 7);
  Config bf16 = base_config();
  bf16.wire = compress::Wire::kBf16;
  Config stochastic = fp32_sums_config();
  stochastic.rounding = Rounding::kStochastic;
  for (const auto& [config, plan] : {std::pair{base_config(), 2.0}, {bf16, 2.0}, {stochastic, 3.0}}) {
    EXPECT_NEAR(allreduce_peak(config, x, 1).first, plan, kPeakSlack) << config.wire_name() << " "
                                                                      << config.accumulate_name();
  }
}

// A call that throws at issue after earlier chunks were enqueued: the buffers those chunks and their
// sums use were kept (record_stream on CUDA) before the throw drops the composition's references, so
// the allocator cannot hand them to the caller's next tensor while the side stream still writes them.
TEST(Composition, BuffersOfEnqueuedChunksAreKeptWhenALaterCallThrowsAtIssue) {
  at::set_num_threads(1);
  // The second chunk's all-to-all, or the allgather after the last.
  for (const auto& [thrown, nth] : {std::pair{"alltoall_base", 2}, std::pair{"_allgather_base", 1}}) {
    Rig rig(Streams::Order::kAdversarial, fp32_sums_config());
    std::vector<at::Tensor> ts{rig.produced(values((int64_t(1) << 21) + 7))};
    rig.engine->throw_on = thrown;
    rig.engine->throw_on_nth = nth;
    EXPECT_THROW(rig.composition.allreduce(ts, c10d::AllreduceOptions{}), c10::DistBackendError) << thrown;
    ASSERT_FALSE(rig.engine->touched.empty()) << thrown;
    for (const void* touched : rig.engine->touched) {
      const bool kept = std::any_of(rig.device->kept.begin(), rig.device->kept.end(), [&](const auto& k) {
        return k.data == touched && k.until.stream == rig.device->side_stream();
      });
      EXPECT_TRUE(kept) << thrown << ": a buffer an enqueued call used was never kept on the side stream";
    }
    rig.streams.run();
  }
}

// Stochastic rounding in chunks: an allreduce chunk's owner sum rounds its elements with the dither of
// their place in the tensor, as one sum of the whole part would (the CPU device's codec, run once over
// the part, is the oracle). Three ranks: three equal values' sum is not always a 16-bit value.
TEST(Composition, ChunkedCallsRoundStochasticallyByEachElementsPlace) {
  at::set_num_threads(1);
  Config config = fp32_sums_config();
  config.rounding = Rounding::kStochastic;
  config.sr_seed = 1234;
  constexpr int kWorld = 3;
  const int64_t part = (int64_t(1) << 21) / kWorld + 1000, n = part * kWorld;  // past 4 MiB of stage
  const at::Tensor x = values(n).mul(1.0 / 3.0);
  const int rank = 2;
  const at::Tensor got = allreduce_peak(config, x, rank, Streams::Order::kIssue, kWorld).second;
  const Plan p = plan_reduction(config, at::kFloat, x.nbytes(), RedOp::SUM, 1.0, kWorld);
  ASSERT_TRUE(p.stochastic && p.fp32_sum && !p.framed);
  const auto cpu = make_cpu_device();
  const at::Tensor wire = at::empty({n}, x.options().dtype(at::kHalf));
  cpu->cast(x, wire, p, compress::contribution_dither(config.sr_seed, 0, rank), 0);
  // The double's peers send what this rank sends: every row of this rank's part is its own.
  const at::Tensor rows = wire.narrow(0, rank * part, part).unsqueeze(0).repeat({kWorld, 1});
  const at::Tensor sum = at::empty({part}, wire.options());
  cpu->sum(rows, sum, p, compress::sum_dither(config.sr_seed, 0), uint64_t(rank * part));
  const at::Tensor want = at::empty({part}, x.options());
  cpu->restore(sum, want, p);
  EXPECT_TRUE(at::equal(got.narrow(0, rank * part, part), want));

  // A reduce_scatter's chunks cast every element with the dither of its place in the input: each peer's
  // row of this rank's part is this rank's own cast of it, summed in fp32 (exact: three equal values).
  Rig rig(Streams::Order::kAdversarial, config, rank, kWorld);
  at::Tensor out = at::empty({part});
  at::Tensor in = x.clone();
  rig.composition.reduce_scatter_tensor(out, in, c10d::ReduceScatterOptions())->wait();
  EXPECT_TRUE(at::equal(rig.observe(out), wire.narrow(0, rank * part, part).to(at::kFloat) * kWorld));
}

// A captured stochastic call would replay its dither: refused before anything is enqueued, naming
// the setting; uncaptured, and rne under capture, run.
TEST(StreamOrder, StochasticRoundingIsRefusedUnderCapture) {
  Config config = fp32_sums_config();
  config.rounding = Rounding::kStochastic;
  Rig rig(Streams::Order::kIssue, config);
  c10d::AllreduceOptions opts;
  std::vector<at::Tensor> ts{values(4096)};
  rig.device->capture = true;
  try {
    rig.composition.allreduce(ts, opts);
    ADD_FAILURE() << "a stochastic allreduce was captured";
  } catch (const c10::ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("rounding=sr"), std::string::npos) << e.what();
  }
  EXPECT_EQ(rig.streams.pending(), 0u) << "work was enqueued before the refusal";
  rig.device->capture = false;
  rig.composition.allreduce(ts, opts);
  rig.streams.run();
  Rig rne(Streams::Order::kIssue, fp32_sums_config());
  rne.device->capture = true;
  rne.composition.allreduce(ts, opts);
  rne.streams.run();
}

// --- The work and its future --------------------------------------------------------------------

TEST(Composition, WorkCompletesOnlyOnceTheDeviceRanTheRestore) {
  Rig rig;
  const at::Tensor x = values(4096);
  std::vector<at::Tensor> ts{x.clone()};
  c10d::AllreduceOptions opts;
  opts.reduceOp = c10d::ReduceOp(RedOp::AVG);
  auto work = rig.composition.allreduce(ts, opts);
  EXPECT_FALSE(work->isCompleted());
  EXPECT_TRUE(at::equal(ts[0], x)) << "the tensor changed before the streams ran";
  rig.streams.run();
  EXPECT_TRUE(work->isCompleted());
  EXPECT_TRUE(at::equal(ts[0], expected_sum(x, 1.0 / kWorld, 1.0)));
  const auto value = work->getFuture()->value().toTensorVector();
  ASSERT_EQ(value.size(), 1u);
  EXPECT_TRUE(value[0].is_same(ts[0])) << "the future holds the caller's own tensor";
  EXPECT_EQ(rig.engine->calls.at(0).op, RedOp::SUM) << "AVG's division was applied in the cast";
}

// A CUDA future records its events where it completes, and DDP's callbacks order their stream after
// those: an asynchronous call's future completes with the restore's side stream current, a
// synchronous one's with the caller's.
TEST(StreamOrder, TheFutureCompletesOnTheStreamTheRestoreRanOn) {
  Rig rig(Streams::Order::kIssue);
  const Streams::Id caller = rig.streams.current();
  std::vector<at::Tensor> ts{values(4096)};
  rig.composition.allreduce(ts, c10d::AllreduceOptions{});
  rig.composition.allreduce(ts, synchronous<c10d::AllreduceOptions>());
  rig.streams.run();
  ASSERT_EQ(rig.device->completed_on.size(), 2u);
  EXPECT_EQ(rig.device->completed_on[0], rig.device->side_stream()) << "asynchronous";
  EXPECT_EQ(rig.device->completed_on[1], caller) << "synchronous";
}

// gloo completes a work's future, running its callbacks (the composition's restore, which completes the
// composed future and runs its callbacks), before it marks its own work completed (the double copies
// AsyncWork::finishWorkGloo). A caller whose future completed must find the composed work completed.
TEST(Composition, AWorkIsCompletedWhenItsFutureIsThoughTheEnginesWorkIsNotYet) {
  auto fabric = std::make_shared<cnccl::testing::Fabric>(2);
  auto engine = c10::make_intrusive<cnccl::testing::GlooDouble>(fabric, 0);
  auto peer = c10::make_intrusive<cnccl::testing::GlooDouble>(fabric, 1);
  Composition composition(Engine{engine, "gloo"}, make_cpu_device(), base_config(), nullptr, 0, 2);
  const at::Tensor x = values(4096);
  std::vector<at::Tensor> ts{x.clone()};
  auto work = composition.allreduce(ts, c10d::AllreduceOptions{});
  ASSERT_FALSE(work->getFuture()->completed()) << "the peer has not posted yet";
  std::promise<bool> completed_in_callback;
  work->getFuture()->addCallback(
      [&, w = work.get()](c10::ivalue::Future&) { completed_in_callback.set_value(w->isCompleted()); });
  // The peer's half of the same engine call: the 16-bit wire's values, as the composition cast them.
  std::vector<at::Tensor> peer_ts{x.to(at::kHalf)};
  auto peer_work = peer->allreduce(peer_ts, c10d::AllreduceOptions{});
  EXPECT_TRUE(completed_in_callback.get_future().get()) << "the future completed, the work did not";
  work->wait();
  peer_work->wait();
  EXPECT_TRUE(work->isCompleted());
  EXPECT_TRUE(at::allclose(ts[0], x * 2, 1e-2, 1e-2));
}

TEST(Composition, EngineFailureIsADistBackendErrorAndLeavesTheTensor) {
  Rig rig;
  const at::Tensor x = values(4096);
  std::vector<at::Tensor> ts{x.clone()};
  rig.engine->fail_next = true;
  auto work = rig.composition.allreduce(ts, c10d::AllreduceOptions());
  rig.streams.run();
  EXPECT_TRUE(work->isCompleted());
  EXPECT_FALSE(work->isSuccess());
  EXPECT_TRUE(work->getFuture()->hasError());
  EXPECT_TRUE(at::equal(ts[0], x)) << "a failed collective wrote into the caller's tensor";
  try {
    work->wait();
    ADD_FAILURE() << "wait() returned";
  } catch (const c10::DistBackendError& e) {
    const std::string what = e.what_without_backtrace();
    EXPECT_NE(what.find("cnccl allreduce (over nccl-like)"), std::string::npos) << what;
    EXPECT_NE(what.find("communicator was aborted"), std::string::npos) << what;
  }
}

TEST(Composition, CoalescedCallSplitsByKindAndCompletesAfterEveryPart) {
  Rig rig;
  at::Tensor big = values(4096), small = values(16), ints = at::arange(10, at::kLong);
  std::vector<at::Tensor> ts{big.clone(), small.clone(), ints.clone()};
  auto work = rig.composition.allreduce_coalesced(ts, c10d::AllreduceCoalescedOptions());
  ASSERT_EQ(rig.engine->calls.size(), 2u) << "one call for the compressed tensor, one for the plain ones";
  EXPECT_EQ(rig.engine->calls[0].dtypes, std::vector<at::ScalarType>{at::kHalf});
  EXPECT_EQ(rig.engine->calls[1].dtypes, (std::vector<at::ScalarType>{at::kFloat, at::kLong}));
  work->wait();
  EXPECT_TRUE(at::equal(rig.observe(ts[0]), expected_sum(big, 1.0, 1.0)));
  EXPECT_TRUE(at::equal(rig.observe(ts[1]), small * kWorld));
  EXPECT_TRUE(at::equal(rig.observe(ts[2]), ints * kWorld));
}

TEST(Composition, UncompressedPremulSumNeverReadsItsTensorFactor) {
  Rig rig;
  // A meta tensor cannot be read on the host: reading it would throw.
  const at::Tensor factor = at::ones({1}, at::TensorOptions().device(at::kMeta));
  c10d::AllreduceOptions opts;
  opts.reduceOp = premul_sum(factor);
  std::vector<at::Tensor> small{values(16)};  // below min_bytes: goes to the engine as it is
  EXPECT_NO_THROW(rig.composition.allreduce(small, opts));
  EXPECT_EQ(rig.engine->calls.back().op, RedOp::PREMUL_SUM) << "the engine applies the factor itself";
  std::vector<at::Tensor> big{values(4096)};
  try {
    rig.composition.allreduce(big, opts);
    ADD_FAILURE() << "compressing needs the factor on the host, which a meta tensor cannot give";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("meta"), std::string::npos) << e.what();
  }
}

TEST(Composition, PremulSumTensorFactorIsAppliedInTheCast) {
  Rig rig;
  const at::Tensor x = values(4 * 1024);
  at::Tensor out = at::empty({1024});
  at::Tensor in = x.clone();
  c10d::ReduceScatterOptions opts;
  opts.reduceOp = premul_sum(at::full({1}, 0.5));
  rig.composition.reduce_scatter_tensor(out, in, opts)->wait();
  EXPECT_TRUE(at::equal(rig.observe(out), expected_sum(x.narrow(0, 0, 1024), 0.5, 1.0)));
  EXPECT_TRUE(at::equal(rig.observe(in), x)) << "reduce_scatter must not modify its input";
}

TEST(Composition, StridedTensorIsReducedThroughAContiguousStage) {
  Rig rig;
  at::Tensor base = values(64 * 64).view({64, 64});
  at::Tensor view = base.t();
  const at::Tensor expected = expected_sum(view.contiguous(), 1.0, 1.0);
  std::vector<at::Tensor> ts{view};
  rig.composition.allreduce(ts, c10d::AllreduceOptions())->wait();
  rig.observe(base);
  EXPECT_TRUE(at::equal(view, expected)) << "the result must land in the caller's memory through the view";
}

TEST(Composition, EveryBufferTheEngineTouchedIsKeptUntilTheRestoresRan) {
  for (const Config& config : {base_config(), fp32_sums_config()}) {
    Rig rig(Streams::Order::kAdversarial, config);
    at::Tensor in = values(4 * 1024);
    at::Tensor out = at::empty({1024});
    // reduce_scatter's 16-bit input is read by the engine and by nothing after it: the buffer most
    // easily handed back to the allocator while the engine still reads it.
    auto work = rig.composition.reduce_scatter_tensor(out, in, c10d::ReduceScatterOptions());
    std::vector<at::Tensor> ts{in.clone()};
    auto work2 = rig.composition.allreduce(ts, c10d::AllreduceOptions());
    // A coalesced call with a tensor the engine reduces as it is (below min_bytes) beside one it
    // reduces staged: the plain input is read by the engine alone.
    std::vector<at::Tensor> outs{at::empty({1024}), at::empty({16})}, ins{values(4 * 1024), values(4 * 16)};
    auto work3 = rig.composition.reduce_scatter_tensor_coalesced(outs, ins, c10d::ReduceScatterOptions());
    ASSERT_FALSE(rig.engine->touched.empty());
    for (const void* p : rig.engine->touched) {
      const auto& kept = rig.device->kept;
      auto it = std::find_if(kept.begin(), kept.end(), [p](const auto& k) { return k.data == p; });
      ASSERT_NE(it, kept.end()) << "a buffer the engine used was not kept until the restores ran";
      EXPECT_EQ(it->until.stream, rig.device->side_stream()) << "kept on the stream the restore runs on";
    }
    rig.streams.run();
  }
}

TEST(Composition, IssuingNeverWaitsOnTheEngine) {
  // With TORCH_NCCL_BLOCKING_WAIT=1, ProcessGroupNCCL's wait() blocks the host: calling it while
  // issuing would make every compressed collective synchronous.
  for (const Config& config : {base_config(), fp32_sums_config()}) {
    Rig rig(Streams::Order::kAdversarial, config);
    std::vector<at::Tensor> ts{values(4096)};
    auto work = rig.composition.allreduce(ts, c10d::AllreduceOptions());
    std::vector<at::Tensor> parts{values(4096), values(16)};
    auto work2 = rig.composition.allreduce_coalesced(parts, c10d::AllreduceCoalescedOptions());
    rig.streams.run();
    EXPECT_EQ(rig.engine->waits, 0) << config.accumulate_name();
    work->wait();
    EXPECT_EQ(rig.engine->waits, config.accumulate == Accumulate::kFp32 ? 2 : 1)
        << "the caller's wait() is the engine's, for each of its works";
  }
}

TEST(Composition, BlockCurrentStreamWaitsForTheRestoreNotTheEngine) {
  Rig rig;
  std::vector<at::Tensor> ts{values(4096)};
  const at::Tensor x = ts[0].clone();
  auto work = rig.composition.allreduce(ts, c10d::AllreduceOptions());
  work->blockCurrentStream();
  EXPECT_EQ(rig.engine->waits, 0);
  EXPECT_TRUE(at::equal(rig.observe(ts[0]), expected_sum(x, 1.0, 1.0)));
  rig.engine->fail_next = true;
  std::vector<at::Tensor> ts2{values(4096)};
  auto failed = rig.composition.allreduce(ts2, c10d::AllreduceOptions());
  EXPECT_THROW(failed->blockCurrentStream(), c10::DistBackendError);
}

TEST(Composition, Fp32SumsGoToTheOwnersAndBackWithoutTheHostWaiting) {
  const at::Tensor x = values(4097);  // not a multiple of the world size: the last part is padded
  for (RedOp op : {RedOp::SUM, RedOp::AVG}) {
    Rig rig(Streams::Order::kAdversarial, fp32_sums_config(), /*rank=*/1);
    std::vector<at::Tensor> ts{x.clone()};
    c10d::AllreduceOptions opts;
    opts.reduceOp = c10d::ReduceOp(op);
    auto work = rig.composition.allreduce(ts, opts);
    ASSERT_EQ(rig.engine->calls.size(), 2u) << "an all-to-all to the owners, then an allgather";
    EXPECT_EQ(rig.engine->calls[0].dtypes, (std::vector<at::ScalarType>{at::kHalf, at::kHalf}));
    EXPECT_EQ(rig.engine->waits, 0) << "the host never waits between the two";
    EXPECT_GE(rig.engine->stream_waits, 1) << "the sum waits on the all-to-all on the stream";
    work->wait();
    // kWorld equal rows summed in fp32 and rounded once: the same bits as one 16-bit multiply.
    const int64_t part = (x.numel() + kWorld - 1) / kWorld;
    const at::Tensor want = expected_sum(x, op == RedOp::AVG ? 1.0 / kWorld : 1.0, 1.0);
    EXPECT_TRUE(at::equal(rig.observe(ts[0]).narrow(0, part, part), want.narrow(0, part, part))) << op_name(op);
  }
}

TEST(Composition, Fp32SumsReduceScatterNeverRoundsTheSumTo16Bits) {
  Rig rig(Streams::Order::kAdversarial, fp32_sums_config(), /*rank=*/2);
  // 30000 is exact in fp16; four of them (120000) are not representable there (fp16 overflows
  // above 65504), but are in fp32.
  at::Tensor in = at::full({4 * 1000}, 30000.0f);
  in.narrow(0, 2 * 1000, 1000).copy_(values(1000));  // rank 2's own part
  at::Tensor out = at::empty({1000});
  auto work = rig.composition.reduce_scatter_tensor(out, in, c10d::ReduceScatterOptions());
  EXPECT_EQ(rig.engine->calls.at(0).name, "alltoall_base") << "an all-to-all, not a reduce-scatter";
  work->wait();
  const at::Tensor own = values(1000).to(at::kHalf).to(at::kFloat);
  EXPECT_TRUE(at::equal(rig.observe(out), own * kWorld));
  at::Tensor big = at::full({4 * 1000}, 30000.0f);
  rig.composition.reduce_scatter_tensor(out, big, c10d::ReduceScatterOptions())->wait();
  EXPECT_TRUE(at::equal(rig.observe(out), at::full({1000}, 120000.0f))) << out[0].item<float>();
}

// From 4 MiB of stage on, a reduce_scatter with fp32 sums sends its parts in four column chunks into one
// buffer of rows, each chunk summed (fp32, unscaled) into the stage it was sent from; the restore scales
// them into the output: 2 + 2/4 bytes per element of the input (4 in one piece; the issue's goal 3).
// sum_scaling=world puts a scale on both sides, and an fp64 output widens the fp32 sum before its scale.
// In adversarial order a chunk received before the last one was summed, or a sum written over a chunk
// not yet sent, gives a wrong output.
TEST(Composition, ALargeReduceScatterWithFp32SumsSumsInChunksWhereItSent) {
  at::set_num_threads(1);  // as the allreduce's: 2M elements
  const int64_t each = (int64_t(1) << 19) + 5;
  Config config = fp32_sums_config();
  config.sum_scaling = SumScaling::kWorld;
  config.compress_fp64 = true;
  for (auto dtype : {at::kFloat, at::kDouble}) {
    for (auto order : kOrders) {
      for (int rank = 0; rank < kWorld; ++rank) {
        Rig rig(order, config, rank);
        at::Tensor in = rig.produced(values(each * kWorld).mul(1.0 + rank).to(dtype));
        at::Tensor out = at::full({each}, -1.0, in.options());
        c10d::ReduceScatterOptions opts;
        int64_t peak = 0;
        {
          cnccl::testing::CountingAllocator counting;
          rig.composition.reduce_scatter_tensor(out, in, opts);
          rig.streams.run();
          peak = counting.peak();
        }
        // 2.5 bytes an fp32 element: per element of a double, the same bytes over twice the input's.
        EXPECT_NEAR(double(peak) / double(in.numel() * in.element_size() / 4), 2.5 * 4 / double(in.element_size()),
                    kPeakSlack)
            << order_name(order) << ", rank " << rank << ": bytes per fp32 element held by the call";
        size_t all_to_alls = 0;
        for (const auto& call : rig.engine->calls) all_to_alls += call.name == "alltoall_base";
        EXPECT_EQ(all_to_alls, 4u);
        // Every peer sends what this rank sends: its own part's 16-bit cast of x / world, kWorld times,
        // summed in fp32, then times the world (both exact: kWorld is a power of two).
        const at::Tensor own = values(each * kWorld).mul(1.0 + rank).to(dtype).narrow(0, rank * each, each);
        const at::Tensor wire = (own.to(at::kFloat) * float(1.0 / kWorld)).to(at::kHalf).to(at::kFloat);
        const at::Tensor want = (wire * kWorld).to(dtype) * kWorld;
        EXPECT_TRUE(at::equal(rig.observe(out), want)) << order_name(order) << ", rank " << rank << ", " << dtype;
      }
    }
  }
}

// What an allreduce in frames gives part q on kWorld ranks that all hold x: x's part q framed, the
// owner's fp32 sum of kWorld copies of that frame framed again, decoded. Written with frames.h's CPU
// functions one step at a time (test_frames.cpp holds them to an emulation in ATen operations).
at::Tensor expected_in_frames(const at::Tensor& x, compress::Wire wire, int64_t q) {
  const int64_t n = x.numel(), part = (n + kWorld - 1) / kWorld, bytes = frames::frame_bytes(part, wire);
  const at::Tensor own = frames::parts_of(x, kWorld, part)[size_t(q)];
  at::Tensor sent = at::empty({1, bytes}, at::kByte), summed = at::empty({1, bytes}, at::kByte);
  frames::encode({own}, part, 1.0, wire, compress::MxScale::kRceil, sent);
  const at::Tensor sums = frames::sum(sent.expand({kWorld, bytes}).contiguous().unbind(0), part, wire, at::empty({part}));
  frames::encode({sums}, part, 1.0, wire, compress::MxScale::kRceil, summed);
  at::Tensor out = at::empty({own.numel()});
  frames::restore(summed, part, wire, 1.0, out);
  return out;
}


// In frames the owner's sum is framed again over its own contribution's frame and the allgather gathers
// around it: the call holds one buffer of frames and, from 8 MiB of frames on, one chunk each way of an
// all-to-all in eight: (1 + 2/8) x the frames' bytes, at most 2.5 bytes an element on every framed wire
// (the issue's goal). Here 4M elements: 2 x 1.25 for the 16-bit frames, in eight chunks; the 8-bit
// frames 2 x 1 and MX 2 x 1.03 or 2 x 0.53, unchunked (whole rows of ATen operations took 12-54 bytes
// an element on the GPU). In adversarial order a chunk copied out before the last one's all-to-all
// read `outgoing`, or received before the last was copied back, gives a wrong part.
TEST(Composition, AnAllreduceInFramesHoldsOneBufferOfFramesAndTwoChunks) {
  at::set_num_threads(1);  // 4M elements: ATen's own loops stay on this thread (TSan)
  const int64_t n = (int64_t(1) << 22) + 7, part = (n + kWorld - 1) / kWorld;
  const at::Tensor x = values(n).mul_(at::linspace(1e-3, 1e3, n));
  for (compress::Wire wire : kFramedWires) {
    for (auto order : kOrders) {
      for (int rank : {0, kWorld - 1}) {
        size_t all_to_alls = 0;
        const auto [peak, got] = allreduce_peak(framed_config(wire), x, rank, order, kWorld, &all_to_alls);
        const std::string what = std::string(compress::wire_name(wire)) + ", " + order_name(order) + ", rank " +
                                 std::to_string(rank);
        EXPECT_NEAR(peak, planned_frames_peak(wire), kPeakSlack) << what << ": bytes per element held by the call";
        EXPECT_EQ(all_to_alls, compress::wire_bytes(wire) == 2 && !compress::is_mx(wire) ? 8u : 1u) << what;
        const int64_t first = rank * part, len = std::min(part, n - first);
        EXPECT_TRUE(at::equal(got.narrow(0, first, len), expected_in_frames(x, wire, rank))) << what;
      }
    }
  }
}

// A strided tensor's contiguous copy is device work, after the caller's kernel wrote the tensor, and the
// result lands in the caller's memory through the view.
TEST(Composition, AStridedTensorInFramesIsFramedAfterTheCallerWroteIt) {
  for (compress::Wire wire : {compress::Wire::kE4m3, compress::Wire::kMxfp4}) {
    Rig rig(Streams::Order::kAdversarial, framed_config(wire));
    const at::Tensor x = values(64 * 64).view({64, 64});
    const at::Tensor view = rig.produced(x).t();
    std::vector<at::Tensor> ts{view};
    rig.composition.allreduce(ts, c10d::AllreduceOptions())->wait();
    const at::Tensor got = rig.observe(view).contiguous().view({-1});
    const int64_t part = 64 * 64 / kWorld;
    EXPECT_TRUE(at::equal(got.narrow(0, 0, part), expected_in_frames(x.t().contiguous().view({-1}), wire, 0)))
        << compress::wire_name(wire);
  }
}

// A reduce_scatter in frames sums every rank's frame of its part into the output: the frames and, from
// 8 MiB of them on, two chunks; 2.5 bytes per fp32 element of the input at most (FSDP's reduce-scatter).
TEST(Composition, AReduceScatterInFramesSumsIntoTheOutputFromOneBufferOfFrames) {
  at::set_num_threads(1);
  const int64_t each = (int64_t(1) << 20) + 3;
  for (compress::Wire wire : kFramedWires) {
    for (auto order : kOrders) {
      const int rank = 1;
      Rig rig(order, framed_config(wire), rank);
      const at::Tensor x = values(each * kWorld);
      at::Tensor in = rig.produced(x);
      at::Tensor out = at::full({each}, -1.0f);
      int64_t peak = 0;
      {
        cnccl::testing::CountingAllocator counting;
        rig.composition.reduce_scatter_tensor(out, in, c10d::ReduceScatterOptions());
        rig.streams.run();
        peak = counting.peak();
      }
      const std::string what = std::string(compress::wire_name(wire)) + ", " + order_name(order);
      EXPECT_NEAR(double(peak) / double(in.numel()), planned_frames_peak(wire), kPeakSlack)
          << what << ": bytes per input element held by the call";
      // Every rank sends this rank's part in the same frame: the output is kWorld of its values, in fp32.
      const int64_t bytes = frames::frame_bytes(each, wire);
      at::Tensor frame = at::empty({1, bytes}, at::kByte);
      frames::encode({x.narrow(0, rank * each, each)}, each, 1.0, wire, compress::MxScale::kRceil, frame);
      const at::Tensor want =
          frames::sum(frame.expand({kWorld, bytes}).contiguous().unbind(0), each, wire, at::empty({each}));
      EXPECT_TRUE(at::equal(rig.observe(out), want)) << what;
    }
  }
}

TEST(Composition, Fp32SumsFailureOfTheAllToAllFailsTheWorkAndLeavesTheTensor) {
  Rig rig(Streams::Order::kAdversarial, fp32_sums_config());
  const at::Tensor x = values(4096);
  std::vector<at::Tensor> ts{x.clone()};
  rig.engine->fail_next = true;  // the all-to-all
  auto work = rig.composition.allreduce(ts, c10d::AllreduceOptions());
  rig.streams.run();
  EXPECT_THROW(work->wait(), c10::DistBackendError);
  EXPECT_TRUE(at::equal(ts[0], x)) << "a failed collective wrote into the caller's tensor";
}

// --- Agreement ---------------------------------------------------------------------------------

// A peer's connections reset as its process closes its files, before its pidfd shows the exit
// (tests/python/test_elastic.py met it: a survivor named its live ring neighbour). Rank 1 of three
// leaves; its exit shows 100 ms after rank 0's agreement failed: rank 0 names rank 1, not rank 2.
TEST(Issuer, AnEarlyFailureNamesThePeerWhoseExitShowsAMomentLater) {
  auto fabric = std::make_shared<cnccl::testing::Fabric>(3);
  auto engine = c10::make_intrusive<cnccl::testing::GlooDouble>(fabric, 0);
  c10::make_intrusive<cnccl::testing::GlooDouble>(fabric, 1).reset();
  std::optional<std::chrono::steady_clock::time_point> first_asked;
  Issuer issuer(engine, "g", [&](int r) -> std::string {
    const auto now = std::chrono::steady_clock::now();
    if (!first_asked) first_asked = now;
    return r == 1 && now - *first_asked > std::chrono::milliseconds(100) ? "its process (pid 4242) exited" : "";
  });
  at::Tensor t = at::ones({4});
  auto work = issuer.submit(c10d::OpType::ALLREDUCE, "allreduce", 1, "4 x Float, SUM", {t}, std::chrono::seconds(30),
                            [&] { return c10::intrusive_ptr<c10d::Work>(); });
  try {
    work->wait();
    FAIL() << "the agreement succeeded without rank 1";
  } catch (const c10::DistBackendError& e) {
    EXPECT_NE(std::string(e.what()).find("[peer rank 1]: rank 1: its process (pid 4242) exited; failed after"),
              std::string::npos)
        << e.what();
  }
  issuer.close("done");
}

// --- Coalescing and lifetime --------------------------------------------------------------------

// batch_isend_irecv brackets its operations with start/endCoalescing when the backend supports
// coalescing; NCCL then issues them as one group (two-way exchanges with a peer cannot deadlock).
TEST(ComposedPath, ACoalescedWindowReachesTheEngineAsOneGroup) {
  Streams streams(Streams::Order::kAdversarial);
  auto engine = c10::make_intrusive<StreamEngine>(streams, 0, kWorld);
  ComposedPath path(0, kWorld, std::make_unique<Composition>(Engine{engine, "nccl-like"},
                                                             std::make_shared<StreamDevice>(streams), base_config(),
                                                             nullptr, 0, kWorld));
  EXPECT_TRUE(path.supportsCoalescing());
  path.startCoalescing();
  std::vector<at::Tensor> out{values(16)}, in{at::zeros({16})}, grad{values(4096)};
  EXPECT_FALSE(path.send(out, 1, 0));
  EXPECT_FALSE(path.recv(in, 1, 0));
  // A compressible allreduce inside the window joins the group as it is: the composition cannot
  // restore after a kernel that runs only at the window's end.
  path.allreduce(grad, c10d::AllreduceOptions());
  auto work = path.endCoalescing();
  ASSERT_TRUE(work) << "the window's work is the engine's";
  std::vector<std::string> names;
  for (const auto& c : engine->calls) names.push_back(c.name);
  EXPECT_EQ(names, (std::vector<std::string>{"startCoalescing", "send", "recv", "allreduce", "endCoalescing"}));
  EXPECT_EQ(engine->calls[3].dtypes, std::vector<at::ScalarType>{at::kFloat});
  work->wait();
  streams.run();
  EXPECT_TRUE(at::equal(grad[0], values(4096) * kWorld));
}

// A build without the host path carries CPU tensors through gloo, which the group is then given.
c10::intrusive_ptr<c10d::Backend> cpu_engine_of_this_build() {
  if (ProcessGroupCNCCL::host_path_built()) return nullptr;
  return c10::make_intrusive<cnccl::testing::GlooDouble>(std::make_shared<cnccl::testing::Fabric>(1), 0);
}

// torch's own ~ProcessGroupNCCL aborts when destroy_process_group() was never called, so that an exit
// never waits for a dead peer; a group destroyed without shutdown() must leave its engine to that.
TEST(ProcessGroup, DestroyingTheGroupNeverShutsTheCudaEngineDown) {
  Streams streams(Streams::Order::kIssue);
  auto engine = c10::make_intrusive<StreamEngine>(streams, 0, 1);
  const auto lifetime = engine->lifetime;
  auto group = c10::make_intrusive<ProcessGroupCNCCL>(c10::make_intrusive<c10d::HashStore>(), 0, 1,
                                                      c10::make_intrusive<Options>(), cpu_engine_of_this_build(), engine);
  engine.reset();
  group.reset();
  EXPECT_EQ(lifetime->shutdowns, 0) << "shutdown() flushes and waits for every peer";
  EXPECT_TRUE(lifetime->destroyed) << "the group released its engine to the engine's own destructor";
}

TEST(ProcessGroup, ShutdownAndAbortReachTheCudaEngine) {
  Streams streams(Streams::Order::kIssue);
  auto engine = c10::make_intrusive<StreamEngine>(streams, 0, 1);
  auto group = c10::make_intrusive<ProcessGroupCNCCL>(c10::make_intrusive<c10d::HashStore>(), 0, 1,
                                                      c10::make_intrusive<Options>(), cpu_engine_of_this_build(), engine);
  EXPECT_TRUE(group->supportsCoalescing());
  group->abort();
  EXPECT_EQ(engine->lifetime->aborts, 1);
  group->shutdown();
  EXPECT_EQ(engine->lifetime->shutdowns, 1);
}

}  // namespace
}  // namespace cnccl::composed

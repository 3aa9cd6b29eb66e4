// The policy alone (backend/policy.h): which tensors are compressed and which scales apply
// (docs/design.md, "Semantics"), what that costs on the wire, which host algorithm runs, which
// engine versions a wire needs; and the agreement on settings the CUDA path makes (options.h).
#include <gtest/gtest.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <cstdlib>
#include <functional>
#include <optional>
#include <thread>

#include "backend/call.h"
#include "backend/options.h"
#include "backend/policy.h"

namespace cnccl {
namespace {

constexpr int kWorld = 4;
constexpr int64_t kBig = 1 << 20;

Plan plan(at::ScalarType t, RedOp op, const Config& c = {}, int64_t bytes = kBig, double factor = 1.0) {
  return plan_reduction(c, t, bytes, op, factor, kWorld);
}

TEST(Policy, Fp32SumIsCompressedAndNotDividedAgain) {
  const Plan p = plan(at::kFloat, RedOp::SUM);
  EXPECT_TRUE(p.compress);
  EXPECT_EQ(p.wire, compress::Wire::kFp16);
  EXPECT_EQ(p.inner_op, RedOp::SUM);
  EXPECT_EQ(p.pre_scale, 1.0);
  EXPECT_EQ(p.post_scale, 1.0);
}

TEST(Policy, AvgAndPremulSumScaleBeforeTheCast) {
  EXPECT_EQ(plan(at::kFloat, RedOp::AVG).pre_scale, 0.25);
  EXPECT_EQ(plan(at::kFloat, RedOp::AVG).inner_op, RedOp::SUM);
  const Plan p = plan(at::kFloat, RedOp::PREMUL_SUM, {}, kBig, 0.125);
  EXPECT_TRUE(p.compress);
  EXPECT_EQ(p.pre_scale, 0.125);
  EXPECT_EQ(p.inner_op, RedOp::SUM);
}

TEST(Policy, MinMaxCompressWithoutScale) {
  for (RedOp op : {RedOp::MIN, RedOp::MAX}) {
    const Plan p = plan(at::kFloat, op);
    EXPECT_TRUE(p.compress);
    EXPECT_EQ(p.inner_op, op);
    EXPECT_EQ(p.pre_scale, 1.0);
  }
}

TEST(Policy, ProductAndBitwisePassThrough) {
  EXPECT_FALSE(plan(at::kFloat, RedOp::PRODUCT).compress);
  for (RedOp op : {RedOp::BAND, RedOp::BOR, RedOp::BXOR}) EXPECT_FALSE(plan(at::kInt, op).compress);
}

TEST(Policy, OnlyWideFloatsAboveTheThresholdAreCompressed) {
  for (auto t : {at::kHalf, at::kBFloat16, at::kInt, at::kLong, at::kBool, at::kComplexFloat, at::kDouble}) {
    EXPECT_FALSE(plan(t, RedOp::SUM).compress) << t;
  }
  EXPECT_FALSE(plan(at::kFloat, RedOp::SUM, {}, 65535).compress);
  EXPECT_TRUE(plan(at::kFloat, RedOp::SUM, {}, 65536).compress);
  Config all;
  all.min_bytes = 0;
  EXPECT_TRUE(plan(at::kFloat, RedOp::SUM, all, 0).compress);
  Config fp64;
  fp64.compress_fp64 = true;
  EXPECT_TRUE(plan(at::kDouble, RedOp::SUM, fp64).compress);
  Config off;
  off.wire.reset();
  EXPECT_FALSE(plan(at::kFloat, RedOp::SUM, off).compress);
}

TEST(Policy, OverflowSafeSumScalesBothWays) {
  Config c;
  c.sum_scaling = SumScaling::kWorld;
  const Plan p = plan(at::kFloat, RedOp::SUM, c);
  EXPECT_EQ(p.pre_scale, 0.25);
  EXPECT_EQ(p.post_scale, 4.0);
  EXPECT_EQ(plan(at::kFloat, RedOp::AVG, c).post_scale, 1.0);  // AVG keeps its own meaning
  EXPECT_EQ(plan(at::kFloat, RedOp::SUM, c, 16).pre_scale, 1.0);  // uncompressed: exact sum
}

TEST(Policy, UncompressedAvgFollowsNccl) {
  EXPECT_EQ(plan(at::kLong, RedOp::AVG).post_divisor, kWorld);
  EXPECT_EQ(plan(at::kLong, RedOp::AVG).pre_scale, 1.0);
  EXPECT_EQ(plan(at::kHalf, RedOp::AVG).pre_scale, 0.25);
}

TEST(Policy, InvalidCombinationsNameTheProblem) {
  EXPECT_THROW(check_reduction(at::kFloat, RedOp::BAND), c10::TypeError);
  EXPECT_THROW(check_reduction(at::kComplexFloat, RedOp::MAX), c10::TypeError);
  EXPECT_THROW(check_reduction(at::kInt, RedOp::PREMUL_SUM), c10::TypeError);
  EXPECT_THROW(check_reduction(at::kBool, RedOp::AVG), c10::TypeError);
  EXPECT_THROW(check_reduction(at::kFloat8_e4m3fn, RedOp::SUM), c10::TypeError);
  EXPECT_NO_THROW(check_reduction(at::kBool, RedOp::BXOR));
}

TEST(Policy, ReduceIsNeverCompressedButKeepsItsScale) {
  const Plan p = plan_exact_reduction({}, at::kFloat, kBig, RedOp::AVG, 1.0, kWorld);
  EXPECT_FALSE(p.compress);
  EXPECT_EQ(p.pre_scale, 0.25);
  EXPECT_EQ(p.inner_op, RedOp::SUM);
  EXPECT_FALSE(plan_exact_reduction({}, at::kFloat, kBig, RedOp::SUM, 1.0, kWorld).compress);
  EXPECT_TRUE(plan(at::kFloat, RedOp::SUM).compress) << "the same tensor in an allreduce is compressed";
}

TEST(Policy, TrafficIsTwoBytesAnElementWhenCompressed) {
  const Traffic compressed = traffic(plan(at::kFloat, RedOp::SUM), 1000, 4000);
  EXPECT_EQ(compressed.bytes, 4000);
  EXPECT_EQ(compressed.wire_bytes, 2000);
  EXPECT_TRUE(compressed.compressed);
  const Traffic exact = traffic(plan(at::kInt, RedOp::SUM), 1000, 4000);
  EXPECT_EQ(exact.wire_bytes, 4000);
  EXPECT_FALSE(exact.compressed);
  EXPECT_EQ(exact_traffic(12).wire_bytes, 12);
}

TEST(Policy, DirectAllreduceUpToItsThresholdThenTheChunkedAlltoall) {
  EXPECT_EQ(choose_allreduce(0, SharedMemory::kNone, false), AllreduceAlgorithm::kDirect);
  EXPECT_EQ(choose_allreduce(kDirectAllreduceMaxBytes, SharedMemory::kNone, false), AllreduceAlgorithm::kDirect);
  EXPECT_EQ(choose_allreduce(kDirectAllreduceMaxBytes + 1, SharedMemory::kNone, false), AllreduceAlgorithm::kChunked);
  EXPECT_EQ(choose_reduce_scatter(SharedMemory::kNone, false), AllreduceAlgorithm::kRing);
}

TEST(Policy, SharedMemoryTakesEverySize) {
  for (int64_t bytes : {int64_t{0}, kDirectAllreduceMaxBytes + 1}) {
    for (bool fp32_sum : {false, true}) {
      EXPECT_EQ(choose_allreduce(bytes, SharedMemory::kOneHost, fp32_sum), AllreduceAlgorithm::kShm);
    }
    EXPECT_EQ(choose_allreduce(bytes, SharedMemory::kPerHost, false), AllreduceAlgorithm::kHierarchical);
  }
  EXPECT_EQ(choose_reduce_scatter(SharedMemory::kOneHost, true), AllreduceAlgorithm::kShm);
}

// fp32 sums need every contribution at the part's owner: never a ring, never 16-bit adds across hosts.
TEST(Policy, Fp32SumsGoAllToAllOffOneHost) {
  for (int64_t bytes : {int64_t{0}, kDirectAllreduceMaxBytes + 1}) {
    EXPECT_EQ(choose_allreduce(bytes, SharedMemory::kNone, true), AllreduceAlgorithm::kAlltoall);
    EXPECT_EQ(choose_allreduce(bytes, SharedMemory::kPerHost, true), AllreduceAlgorithm::kAlltoall);
  }
  EXPECT_EQ(choose_reduce_scatter(SharedMemory::kNone, true), AllreduceAlgorithm::kAlltoall);
  EXPECT_EQ(choose_reduce_scatter(SharedMemory::kPerHost, true), AllreduceAlgorithm::kAlltoall);
}

// Frames (power-of-two and MX) are cut into pieces that decode alone once a part's exponent is known:
// through shared memory where every rank has it, else the chunked all-to-all.
TEST(Policy, FramesGoThroughSharedMemoryOnOneHostElseAllToAll) {
  for (SharedMemory shm : {SharedMemory::kNone, SharedMemory::kOneHost, SharedMemory::kPerHost}) {
    const auto expected = shm == SharedMemory::kOneHost ? AllreduceAlgorithm::kShm : AllreduceAlgorithm::kAlltoall;
    for (Framing framing : {Framing::kPerPart, Framing::kBlocks}) {
      EXPECT_EQ(choose_allreduce(0, shm, true, framing), expected);
      EXPECT_EQ(choose_allreduce(int64_t(1) << 30, shm, true, framing), expected);
      EXPECT_EQ(choose_reduce_scatter(shm, true, framing), expected);
    }
  }
}

TEST(Policy, AnFp8WireFramesSumsAndLeavesMinAndMaxExact) {
  Config c;
  c.wire = compress::Wire::kE4m3;
  c.accumulate = Accumulate::kFp32;
  c.scaling = Scaling::kPow2;
  for (RedOp op : {RedOp::SUM, RedOp::AVG, RedOp::PREMUL_SUM}) {
    const Plan p = plan_reduction(c, at::kFloat, 1 << 20, op, 0.5, 4);
    EXPECT_TRUE(p.compress && p.fp32_sum && p.framed) << op_name(op);
    EXPECT_EQ(traffic(p, 1000, 4000).wire_bytes, 1000) << "one byte an element";
  }
  for (RedOp op : {RedOp::MIN, RedOp::MAX}) EXPECT_FALSE(plan_reduction(c, at::kFloat, 1 << 20, op, 1.0, 4).compress);
  c.wire = compress::Wire::kFp16;
  EXPECT_TRUE(plan_reduction(c, at::kFloat, 1 << 20, RedOp::MAX, 1.0, 4).compress) << "a 16-bit MAX as before";
  EXPECT_FALSE(plan_reduction(c, at::kFloat, 1 << 20, RedOp::MAX, 1.0, 4).framed);
}

TEST(Policy, AnMxWireIsBlocksForSumsWithoutScalingPow2) {
  Config c;
  c.accumulate = Accumulate::kFp32;
  for (compress::Wire w : {compress::Wire::kMxfp8, compress::Wire::kMxfp8E5m2, compress::Wire::kMxfp4}) {
    c.wire = w;
    const Plan p = plan_reduction(c, at::kFloat, 1 << 20, RedOp::AVG, 1.0, 4);
    EXPECT_TRUE(p.compress && p.fp32_sum && p.framed) << compress::wire_name(w);
    // A scale byte a block of 32, then a byte an element, or half of one.
    EXPECT_EQ(traffic(p, 1000, 4000).wire_bytes, w == compress::Wire::kMxfp4 ? 32 + 500 : 32 + 1000);
    EXPECT_FALSE(plan_reduction(c, at::kFloat, 1 << 20, RedOp::MAX, 1.0, 4).compress);
  }
}

TEST(Policy, Fp32SumsOnlyForCompressedSums) {
  Config fp32;
  fp32.accumulate = Accumulate::kFp32;
  for (RedOp op : {RedOp::SUM, RedOp::AVG, RedOp::PREMUL_SUM}) {
    EXPECT_TRUE(plan_reduction(fp32, at::kFloat, 1 << 20, op, 0.5, 4).fp32_sum) << op_name(op);
  }
  EXPECT_FALSE(plan_reduction(fp32, at::kFloat, 1 << 20, RedOp::MAX, 1.0, 4).fp32_sum);
  EXPECT_FALSE(plan_reduction(fp32, at::kInt, 1 << 20, RedOp::SUM, 1.0, 4).fp32_sum);
  EXPECT_FALSE(plan_reduction(fp32, at::kFloat, 16, RedOp::SUM, 1.0, 4).fp32_sum);  // under min_bytes
  EXPECT_FALSE(plan_reduction(Config{}, at::kFloat, 1 << 20, RedOp::SUM, 1.0, 4).fp32_sum);
}

TEST(Policy, AWirePerLevelPlansCompressedSumsAtBothLevels) {
  Config c;
  c.accumulate = Accumulate::kFp32;
  c.inter_host_wire = compress::Wire::kMxfp8;
  const Plan sum = plan(at::kFloat, RedOp::SUM, c);
  EXPECT_TRUE(sum.per_level && sum.compress && sum.fp32_sum && sum.framed);
  EXPECT_EQ(sum.inside, compress::Wire::kFp16);
  EXPECT_EQ(sum.across, compress::Wire::kMxfp8);
  EXPECT_EQ(sum.wire, compress::Wire::kMxfp8);
  EXPECT_EQ(plan(at::kFloat, RedOp::AVG, c).pre_scale, 1.0 / kWorld);
  // What crosses hosts is what traffic() counts: an MX block's 33 bytes a 32 elements.
  EXPECT_EQ(traffic(sum, 1024, 4096).wire_bytes, 1056);
  // MIN and MAX, small tensors and 16-bit tensors keep wire_dtype's rules.
  EXPECT_FALSE(plan(at::kFloat, RedOp::MAX, c).per_level);
  EXPECT_FALSE(plan(at::kFloat, RedOp::SUM, c, 1024).per_level);
  EXPECT_FALSE(plan(at::kHalf, RedOp::SUM, c).per_level);
  // fp32 inside (wire_dtype=none), 8-bit across; and fp32 across, which still counts 4 bytes an element.
  c.wire = std::nullopt;
  const Plan exact_inside = plan(at::kFloat, RedOp::SUM, c);
  EXPECT_TRUE(exact_inside.per_level && exact_inside.compress);
  EXPECT_EQ(exact_inside.inside, std::nullopt);
  c.wire = compress::Wire::kFp16;
  c.inter_host_wire = std::optional<compress::Wire>();
  const Plan exact_across = plan(at::kFloat, RedOp::SUM, c);
  EXPECT_TRUE(exact_across.per_level);
  EXPECT_EQ(exact_across.across, std::nullopt);
  EXPECT_EQ(traffic(exact_across, 1024, 4096).wire_bytes, 4096);
  // reduce() is exact at every level.
  c.inter_host_wire = compress::Wire::kMxfp8;
  const Plan reduce = plan_exact_reduction(c, at::kFloat, kBig, RedOp::SUM, 1.0, kWorld);
  EXPECT_FALSE(reduce.compress || reduce.per_level || reduce.framed);
  // rounding=sr reaches the levels' encodings (options.cpp admits it with block levels only); nvfp4 across
  // counts its frame's bytes.
  c.wire = std::nullopt;
  c.inter_host_wire = compress::Wire::kNvfp4;
  c.rounding = Rounding::kStochastic;
  const Plan stochastic = plan(at::kFloat, RedOp::SUM, c);
  EXPECT_TRUE(stochastic.per_level && stochastic.stochastic);
  EXPECT_EQ(traffic(stochastic, 1024, 4096).wire_bytes, int64_t(compress::nv_bytes(1024)));
  c.rounding = Rounding::kNearest;
  EXPECT_FALSE(plan(at::kFloat, RedOp::SUM, c).stochastic);
  c.wire = compress::Wire::kFp16;
  // The same wire at both levels is one level.
  c.inter_host_wire = compress::Wire::kFp16;
  EXPECT_FALSE(c.per_level());
  EXPECT_FALSE(plan(at::kFloat, RedOp::SUM, c).per_level);
}

TEST(Policy, Bf16WireNeedsNccl210) {
  Config bf16;
  bf16.wire = compress::Wire::kBf16;
  EXPECT_NO_THROW(check_nccl_supports(bf16, kNcclBf16Version));
  try {
    check_nccl_supports(bf16, 20903);
    ADD_FAILURE() << "bf16 accepted with NCCL 2.9.3";
  } catch (const c10::ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("NCCL >= 2.10"), std::string::npos) << e.what();
  }
  EXPECT_NO_THROW(check_nccl_supports(Config{}, 20903)) << "fp16 needs no particular NCCL";
}

TEST(Options, EnvironmentThenOptionsWithClearErrors) {
  ::setenv("CNCCL_WIRE_DTYPE", "bf16", 1);
  ::setenv("CNCCL_MIN_BYTES", "123", 1);
  Options o;
  Config c = o.resolve();
  EXPECT_EQ(c.wire_name(), "bf16");
  EXPECT_EQ(c.min_bytes, 123);
  o.wire_dtype = "none";
  EXPECT_FALSE(o.resolve().wire.has_value());
  ::setenv("CNCCL_SUM_SCALING", "maybe", 1);
  try {
    o.resolve();
    FAIL() << "no error for CNCCL_SUM_SCALING=maybe";
  } catch (const c10::ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("CNCCL_SUM_SCALING='maybe'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("none, world"), std::string::npos);
  }
  ::unsetenv("CNCCL_SUM_SCALING");
  ::setenv("CNCCL_MIN_BYTES", "-5", 1);
  EXPECT_THROW(o.resolve(), c10::ValueError);
  ::unsetenv("CNCCL_MIN_BYTES");
  ::unsetenv("CNCCL_WIRE_DTYPE");
  EXPECT_EQ(Options().resolve().wire_name(), "fp16");
  EXPECT_EQ(Options().resolve().min_bytes, 65536);
}

TEST(Options, StochasticRoundingNeedsFp32AccumulationAndTakesASeed) {
  Options o;
  o.rounding = "sr";
  try {
    o.resolve();
    FAIL() << "rounding=sr with accumulate=wire was accepted";
  } catch (const c10::ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("needs accumulate=fp32"), std::string::npos) << e.what();
  }
  o.accumulate = "fp32";
  ::setenv("CNCCL_SR_SEED", "0x10", 1);
  Config c = o.resolve();
  EXPECT_EQ(c.rounding, Rounding::kStochastic);
  EXPECT_EQ(c.sr_seed, 16u);
  o.sr_seed = -1;
  EXPECT_EQ(o.resolve().sr_seed, ~uint64_t{0});
  ::setenv("CNCCL_SR_SEED", "twelve", 1);
  EXPECT_THROW(o.resolve(), c10::ValueError);
  ::unsetenv("CNCCL_SR_SEED");
  const Plan p = plan_reduction(c, at::kFloat, 1 << 20, RedOp::AVG, 1.0, 4);
  EXPECT_TRUE(p.fp32_sum && p.stochastic);
  EXPECT_FALSE(plan_reduction(c, at::kFloat, 1 << 20, RedOp::MAX, 1.0, 4).stochastic);
}

TEST(Options, TelemetryFromTheEnvironmentAndTheField) {
  Options o;
  EXPECT_EQ(o.resolve().telemetry, Telemetry::kCounts);
  ::setenv("CNCCL_TELEMETRY", "error", 1);
  EXPECT_EQ(o.resolve().telemetry, Telemetry::kError);
  o.telemetry = "off";
  EXPECT_EQ(o.resolve().telemetry, Telemetry::kOff);
  ::setenv("CNCCL_TELEMETRY", "some", 1);
  try {
    o.resolve();
    ADD_FAILURE() << "CNCCL_TELEMETRY=some was accepted";
  } catch (const c10::ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("CNCCL_TELEMETRY='some' is not valid; allowed: off, counts, error"),
              std::string::npos) << e.what();
  }
  ::unsetenv("CNCCL_TELEMETRY");
}

namespace {
std::string resolve_error(const Options& o) {
  try {
    o.resolve();
  } catch (const c10::ValueError& e) {
    return e.what();
  }
  return "";
}
}  // namespace

TEST(Options, Pow2AndTheFp8WiresNeedFp32AccumulationAndNotStochasticRounding) {
  Options o;
  o.scaling = "pow2";
  EXPECT_NE(resolve_error(o).find("scaling=pow2 (CNCCL_SCALING / Options.scaling) needs accumulate=fp32"),
            std::string::npos) << resolve_error(o);
  o.accumulate = "fp32";
  EXPECT_EQ(o.resolve().scaling, Scaling::kPow2);
  o.rounding = "sr";
  EXPECT_NE(resolve_error(o).find("does not yet combine with rounding=sr"), std::string::npos) << resolve_error(o);
  o.rounding.reset();
  o.scaling = "pow3";
  EXPECT_NE(resolve_error(o).find("Options.scaling='pow3' is not valid; allowed: none, pow2"), std::string::npos);
  o.scaling.reset();
  for (const char* fp8 : {"e4m3", "E5M2"}) {
    o.wire_dtype = fp8;
    EXPECT_NE(resolve_error(o).find("needs accumulate=fp32 and scaling=pow2"), std::string::npos) << fp8;
    ::setenv("CNCCL_SCALING", "pow2", 1);
    EXPECT_EQ(o.resolve().wire_name(), fp8[0] == 'e' ? "e4m3" : "e5m2");
    ::unsetenv("CNCCL_SCALING");
  }
}

TEST(Options, AccumulateFromEnvironmentOrField) {
  EXPECT_EQ(Options().resolve().accumulate, Accumulate::kWire);
  ::setenv("CNCCL_ACCUMULATE", "FP32", 1);
  Options o;
  EXPECT_EQ(o.resolve().accumulate, Accumulate::kFp32);
  o.accumulate = "wire";
  EXPECT_EQ(o.resolve().accumulate, Accumulate::kWire);
  o.accumulate = "fp64";
  try {
    o.resolve();
    FAIL() << "no error for accumulate=fp64";
  } catch (const c10::ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("Options.accumulate='fp64'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("wire, fp32"), std::string::npos);
  }
  ::unsetenv("CNCCL_ACCUMULATE");
}

// Each rank's error from agree_on_settings ("" when none), ranks as threads over one store; a rank
// without a Config never shows its settings.
std::vector<std::string> agree(const std::vector<std::optional<Config>>& configs,
                               std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::vector<std::string> errors(configs.size());
  std::vector<std::thread> ranks;
  for (size_t r = 0; r < configs.size(); ++r) {
    if (!configs[r]) continue;
    ranks.emplace_back([&, r] {
      try {
        agree_on_settings(*store, "settings", int(r), int(configs.size()), *configs[r], timeout);
      } catch (const c10::DistBackendError& e) {
        errors[r] = e.what_without_backtrace();
      } catch (const std::exception& e) {
        errors[r] = std::string("not a DistBackendError: ") + e.what();
      }
    });
  }
  for (auto& t : ranks) t.join();
  return errors;
}

TEST(Agreement, RanksAgreeOnWhatChangesNoByte) {
  Config a, b;
  b.cpu_engine = CpuEngine::kGloo;  // CPU-side choices change no byte of a CUDA collective
  b.shm = ShmMode::kOff;
  b.sr_seed = 7;  // keys only stochastic rounding
  for (const auto& error : agree({a, b, a})) EXPECT_EQ(error, "");
  Config off, other_off;  // compression off: nothing else changes a byte
  off.wire = other_off.wire = std::nullopt;
  other_off.min_bytes = 0;
  other_off.accumulate = Accumulate::kFp32;
  other_off.sum_scaling = SumScaling::kWorld;
  for (const auto& error : agree({off, other_off})) EXPECT_EQ(error, "");
}

TEST(Agreement, EverySettingThatChangesTheBytesIsCompared) {
  Config base;
  base.accumulate = Accumulate::kFp32;
  base.rounding = Rounding::kStochastic;
  const std::vector<std::function<void(Config&)>> changes{
      [](Config& c) { c.wire = compress::Wire::kBf16; },      [](Config& c) { c.wire = std::nullopt; },
      [](Config& c) { c.min_bytes = 0; },                     [](Config& c) { c.sum_scaling = SumScaling::kWorld; },
      [](Config& c) { c.compress_fp64 = true; },              [](Config& c) { c.accumulate = Accumulate::kWire; },
      [](Config& c) { c.rounding = Rounding::kNearest; },     [](Config& c) { c.sr_seed = 7; },
      [](Config& c) { c.rounding = Rounding::kNearest, c.scaling = Scaling::kPow2; },
      [](Config& c) { c.rounding = Rounding::kNearest, c.inter_host_wire = compress::Wire::kMxfp8; }};
  for (size_t i = 0; i < changes.size(); ++i) {
    Config same = base, other = base;
    if (i >= 8) same.rounding = Rounding::kNearest;  // pow2 and levels need rne: the two differ in one setting
    changes[i](other);
    const auto errors = agree({same, same, other});
    for (int r = 0; r < 3; ++r) {
      const std::string& e = errors[size_t(r)];
      EXPECT_NE(e.find("ranks disagree on the group's settings"), std::string::npos) << "change " << i << ": " << e;
      EXPECT_NE(e.find(r == 2 ? other.bytes_settings() : same.bytes_settings()), std::string::npos) << e;
      EXPECT_NE(e.find(r == 2 ? same.bytes_settings() : other.bytes_settings()), std::string::npos) << e;
    }
  }
}

TEST(Agreement, AWirePerLevelComparesItsRoundingAndSeed) {
  // wire_dtype=none with a wire across: rounding=sr's bits at both levels, so its seed too.
  Config base;
  base.wire = std::nullopt;
  base.inter_host_wire = compress::Wire::kNvfp4;
  base.accumulate = Accumulate::kFp32;
  base.rounding = Rounding::kStochastic;
  const std::vector<std::function<void(Config&)>> changes{[](Config& c) { c.rounding = Rounding::kNearest; },
                                                          [](Config& c) { c.sr_seed = 7; }};
  for (size_t i = 0; i < changes.size(); ++i) {
    Config other = base;
    changes[i](other);
    for (const auto& e : agree({base, base, other})) {
      EXPECT_NE(e.find("ranks disagree on the group's settings"), std::string::npos) << "change " << i << ": " << e;
    }
  }
  // Each call's signature carries the seed as well, as a flat stochastic reduction's does.
  const at::Tensor t = at::ones({1 << 16});
  auto signature = [&](const Config& c) {
    return calls::allreduce({t}, c10d::AllreduceOptions{}, Group{c, 0, 4, std::chrono::milliseconds(1000)}).signature();
  };
  Config seeded = base;
  seeded.sr_seed = 7;
  EXPECT_NE(signature(base).find("stochastic rounding seed 0"), std::string::npos) << signature(base);
  EXPECT_NE(signature(base), signature(seeded));
}

TEST(Agreement, ARankThatNeverShowsItsSettingsIsNamedAtTheTimeout) {
  const auto errors = agree({Config{}, std::nullopt, Config{}, std::nullopt}, std::chrono::milliseconds(300));
  for (int r : {0, 2}) {
    EXPECT_NE(errors[size_t(r)].find("waited 300 ms for the settings of rank(s) 1, 3, which have not made their "
                                     "first CUDA allreduce or reduce_scatter"),
              std::string::npos)
        << errors[size_t(r)];
  }
}

}  // namespace
}  // namespace cnccl

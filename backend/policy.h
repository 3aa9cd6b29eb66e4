// The one place that decides (docs/design.md, "Semantics"): per collective, whether a tensor
// travels compressed and which scales apply; which host algorithm runs it; what an engine's
// version allows. Pure: no communication, unit-tested on its own (tests/cpp/test_policy.cpp).
#pragma once

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/Types.hpp>

#include "backend/options.h"

namespace cnccl {

using RedOp = c10d::ReduceOp::RedOpType;

struct Plan {
  bool compress = false;
  compress::Wire wire = compress::Wire::kFp16;
  // The reduction the algorithm itself performs (SUM for AVG and PREMUL_SUM).
  RedOp inner_op = RedOp::SUM;
  // Multiplies every element before the reduction (in fp32 inside the cast when compressed).
  double pre_scale = 1.0;
  // Set where the kernels read PREMUL_SUM's factor on the device (a CUDA tensor factor; the composed
  // path's Device::premul_factor_tensor): that one-element fp32 tensor is the pre-scale, and pre_scale
  // is 1. Compressed plans only.
  at::Tensor pre_scale_tensor;
  // Compressed: multiplies on restore. Uncompressed: 1.
  double post_scale = 1.0;
  // Uncompressed integer AVG: truncating division after the sum, as NCCL does.
  int64_t post_divisor = 1;
  // Compressed SUM with accumulate=fp32: the owner of each part sums every rank's 16-bit
  // contribution in fp32 in rank order and rounds once (allreduce) or not at all (reduce_scatter).
  bool fp32_sum = false;
  // fp32_sum with rounding=sr: the casts and the owner's rounding are stochastic, keyed by sr_seed.
  bool stochastic = false;
  uint64_t sr_seed = 0;
  // fp32_sum with scaling=pow2 or an MX wire: every part travels in a frame (backend/frames.h), with
  // its own power-of-two exponent or as MX blocks. The only form an 8-bit or MX wire takes.
  bool framed = false;
  // An MX wire's block scale rule (Config::mx_scale).
  compress::MxScale mx_scale = compress::MxScale::kRceil;
  // A compressed sum's values rotated in blocks of 16 before they are sent and back once the sum is in
  // (Config::rotation; compress/codec.h, rotate), with these signs.
  bool rotated = false;
  uint16_t rotation_signs = 0;
  // A wire per level (Config::per_level; docs/design.md, "A wire per level"): a sum the host path runs
  // through each host's shared memory in `inside` and between hosts in `across` (nullopt: fp32 as it
  // is), with fp32 sums at each level. `wire` is then `across` where it is set; fp32_sum and framed hold.
  bool per_level = false;
  std::optional<compress::Wire> inside, across;
};

// What a collective puts on the wire for one tensor, as cnccl.stats() counts it.
struct Traffic {
  int64_t bytes = 0;       // the tensor's own bytes
  int64_t wire_bytes = 0;  // what travels instead: the wire's bytes an element when compressed
  bool compressed = false;
};
// `numel` elements of `nbytes` in all, as `plan` sends them.
Traffic traffic(const Plan& plan, int64_t numel, int64_t nbytes);
// A collective that moves data as it is (allgather, broadcast, ...).
inline Traffic exact_traffic(int64_t nbytes) { return {nbytes, nbytes, false}; }

// Throws c10::ValueError / TypeError when `op` cannot apply to `dtype` (e.g. BAND on floats).
void check_reduction(at::ScalarType dtype, RedOp op);

// `factor` is PREMUL_SUM's multiplier (ignored otherwise).
Plan plan_reduction(const Config& config, at::ScalarType dtype, int64_t nbytes, RedOp op, double factor,
                    int world_size);

// reduce() is never lossy (docs/design.md, "Semantics"): a root-only result has no all-ranks
// bandwidth to save. The plan carries only the op's scaling.
Plan plan_exact_reduction(const Config& config, at::ScalarType dtype, int64_t nbytes, RedOp op, double factor,
                          int world_size);

// Where the host path's ranks share memory: nowhere, all on one host, or within each of several
// hosts that each hold the same number of them.
enum class SharedMemory : uint8_t { kNone, kOneHost, kPerHost };
// The host path's allreduce algorithms: through shared memory when every rank shares it (every
// size: it has its own small-message form); hierarchical across hosts (shared memory inside each
// host, UCX between them); else over the transport, one exchange with every peer (latency-bound
// sizes) or the chunked all-to-all (bandwidth-bound sizes: reduce_chunked, the pieces cast, sent,
// summed by their owners in rank order and restored a chunk at a time, so the copies overlap the
// link; the ring is kept for reduce_scatter and between hosts). A plan with fp32_sum needs
// every rank's contribution at its part's owner: through shared memory on one host, else an
// all-to-all reduce-scatter + allgather. Frames (MX blocks, which carry their own scales, and
// power-of-two frames, cut into pieces after each part's exponent is known) go through shared memory
// on one host too; elsewhere the all-to-all is chunked and pipelined (reduce_chunked).
enum class AllreduceAlgorithm : uint8_t { kShm, kHierarchical, kDirect, kRing, kAlltoall, kChunked };
// How a plan's parts travel: as they are, in frames with one exponent a part, or as MX blocks.
enum class Framing : uint8_t { kNone, kPerPart, kBlocks };
inline Framing framing_of(const Plan& plan) {
  return !plan.framed ? Framing::kNone : compress::is_mx(plan.wire) ? Framing::kBlocks : Framing::kPerPart;
}
AllreduceAlgorithm choose_allreduce(int64_t wire_bytes, SharedMemory shared_memory, bool fp32_sum,
                                    Framing framing = Framing::kNone);
// The reduce_scatter algorithm: as choose_allreduce for frames, else through shared memory on one
// host, else kAlltoall for fp32_sum and kRing otherwise.
AllreduceAlgorithm choose_reduce_scatter(SharedMemory shared_memory, bool fp32_sum, Framing framing = Framing::kNone);
// Up to this many bytes on the wire the direct exchange wins (bench/allreduce.py, 2 and 4 ranks).
constexpr int64_t kDirectAllreduceMaxBytes = 256 * 1024;
// Whether a host-path collective runs on the thread that issued it when no thread leads and nothing
// is queued (docs/design.md, "The caller's thread"): a synchronous one, of any size, since its caller
// waits for it at once, and a hand-off would only add two thread wake-ups. Never an asynchronous one,
// however small: it would block its caller until its peers come, and a program whose ranks issue
// asynchronous calls on several groups in different orders (which gloo and NCCL complete) would then
// wait on itself until the timeout.
inline bool runs_on_caller_thread(bool async_op) { return !async_op; }

// Throws c10::ValueError when the engine's NCCL (as ncclGetVersion reports it) cannot reduce the
// wire dtype: NCCL's bf16 reductions arrived in 2.10.
void check_nccl_supports(const Config& config, int nccl_version);
constexpr int kNcclBf16Version = 21000;

// PREMUL_SUM's factor (a double or a one-element tensor); 1 for other ops.
double premul_factor(const c10d::ReduceOp& op);
// PREMUL_SUM's factor when it is a tensor (undefined otherwise): reading it may need a device sync.
at::Tensor premul_tensor_factor(const c10d::ReduceOp& op);

const char* op_name(RedOp op);

}  // namespace cnccl

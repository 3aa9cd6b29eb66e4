// Per-group counters, shared by the host and CUDA paths (Python: cnccl.stats(group)).
#pragma once

#include <atomic>
#include <cmath>
#include <cstdint>
#include <optional>

#include "backend/options.h"
#include "backend/policy.h"
#include "compress/codec.h"

namespace cnccl {

struct Stats {
  std::atomic<uint64_t> collectives{0};
  std::atomic<uint64_t> compressed_collectives{0};
  std::atomic<uint64_t> bytes_uncompressed{0};  // what the collectives' tensors would put on the wire
  std::atomic<uint64_t> bytes_sent{0};          // what they did put on it (16-bit when compressed)

  // Host path time by phase, summed over collectives: the scale-and-cast (or packing copy), the
  // reductions, the rest of the algorithm (moving bytes and waiting on peers), the restore (or
  // unpacking copy). What bench/allreduce.py prints as its breakdown.
  std::atomic<uint64_t> cast_ns{0};
  std::atomic<uint64_t> reduce_ns{0};
  std::atomic<uint64_t> transfer_ns{0};
  std::atomic<uint64_t> restore_ns{0};
  // Host-path collectives that ran on the thread that issued or waited for them, not on the
  // group's executor thread (host/executor.h).
  std::atomic<uint64_t> caller_thread_collectives{0};
  // What the casts met (compress::Census; docs/design.md, "Telemetry"): values that were not finite,
  // and finite values that overflowed the wire or saturated an MX element. Counted on the CPU.
  std::atomic<uint64_t> cast_nonfinite{0};
  std::atomic<uint64_t> cast_saturated{0};
  // The relative L2 error of the last compressed collective's own contribution, from its samples
  // (telemetry=error); NaN before one.
  std::atomic<double> quantization_error{NAN};

  void record(const compress::Census& c) {
    if (c.nonfinite) cast_nonfinite += c.nonfinite;
    if (c.saturated) cast_saturated += c.saturated;
    if (c.samples) quantization_error = c.error_squared > 0 ? std::sqrt(c.error_squared / c.value_squared) : 0.0;
  }

  void record(const Traffic& t) {
    collectives += 1;
    compressed_collectives += t.compressed ? 1 : 0;
    bytes_uncompressed += t.bytes;
    bytes_sent += t.wire_bytes;
  }
};

// Counts the casts this thread makes while it lives, as `telemetry` asks, into `stats` when it ends;
// without stats it does nothing, and leaves an enclosing census counting. A collective's casts are
// one census: the host path's call, the composed path's issue on gloo's issuer thread.
class CastCensus {
 public:
  // Every this-many-th value of each cast is sampled for the error (cost: docs/benchmarks.md).
  static constexpr size_t kSampleStride = 256;

  CastCensus(Stats* stats, Telemetry telemetry) : stats_(telemetry == Telemetry::kOff ? nullptr : stats) {
    if (stats_) scope_.emplace(&census_, telemetry == Telemetry::kError ? kSampleStride : 0);
  }
  ~CastCensus() {
    scope_.reset();
    if (stats_) stats_->record(census_);
  }
  CastCensus(const CastCensus&) = delete;
  CastCensus& operator=(const CastCensus&) = delete;

 private:
  Stats* const stats_;
  compress::Census census_;
  std::optional<compress::CensusScope> scope_;
};

}  // namespace cnccl

// Per-group counters, shared by the host and CUDA paths (Python: cnccl.stats(group)).
#pragma once

#include <atomic>
#include <cstdint>

#include "backend/policy.h"

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

  void record(const Traffic& t) {
    collectives += 1;
    compressed_collectives += t.compressed ? 1 : 0;
    bytes_uncompressed += t.bytes;
    bytes_sent += t.wire_bytes;
  }
};

}  // namespace cnccl

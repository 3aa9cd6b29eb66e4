// Reductions through shared memory (docs/design.md, "Shared memory"). The elements are cut into
// one part per rank; chunk k takes the k-th piece of every part. Per chunk: every rank writes its
// contribution to all pieces into its own slot (ChunkProducer: the cast happens here, from the
// caller's tensor, while the slot stays in cache), the owner of part p sums every rank's piece p
// in rank order (RankSum) into its result area, and every rank copies the owners' results out (or
// hands them to ChunkedReduction::consume, which restores them into the caller's tensor). A rank
// publishes chunk k+1 before it waits for chunk k's results.
// Small reductions take one chunk in which every rank sums every piece itself: one wait.
#include <algorithm>
#include <vector>

#include "backend/host/shm/shm_algorithms.h"
#include "backend/host/shm/shm_comm.h"

namespace cnccl::host {
namespace {

// Up to this many bytes of contributions, one exchange in which every rank reduces everything:
// the second wait of the chunked form costs more than the redundant adds.
constexpr size_t kOneShotBytes = size_t(64) << 10;

}  // namespace

void reduce_shm(ShmComm& shm, const ChunkedReduction& r) {
  const int size = shm.size(), rank = shm.rank();
  const size_t max_length = r.parts.max_length();
  const bool one_shot = max_length * size * r.elem <= std::min(kOneShotBytes, ShmComm::kSlotBytes);
  const size_t chunk = one_shot ? max_length : ShmComm::piece_elements(size, r.elem, shm.chunk_bytes());
  const size_t chunks = one_shot ? 1 : (max_length + chunk - 1) / chunk;
  auto wanted = [&](int part) {
    return r.deliver == ChunkedReduction::kAll || (r.deliver == ChunkedReduction::kOwn ? part == rank : rank == r.root);
  };
  auto count = [&](size_t k, int part) {
    return std::min(chunk, r.parts.length[part] - std::min(k * chunk, r.parts.length[part]));
  };
  auto at = [&](char* base, int part) { return base + part * chunk * r.elem; };
  auto out = [&](size_t k, int part) {
    const size_t index = r.deliver == ChunkedReduction::kOwn ? k * chunk : r.parts.offset[part] + k * chunk;
    return r.out + index * (r.out_elem ? r.out_elem : r.elem);
  };
  std::vector<const char*> inputs(size);
  auto sum_piece = [&](size_t k, int part, uint64_t step, char* dst) {
    for (int q = 0; q < size; ++q) inputs[q] = at(shm.contribution(q, step), part);
    r.sum(inputs.data(), dst, r.parts.offset[part] + k * chunk, count(k, part));
  };
  auto deliver = [&](size_t k, int part, const char* result) {
    if (r.consume) return r.consume(r.parts.offset[part] + k * chunk, count(k, part), result);
    copy_bytes(out(k, part), result, count(k, part) * r.elem);
  };
  // Publishes this rank's contributions to chunk k; returns the chunk's step.
  auto start = [&](size_t k) {
    const uint64_t step = shm.acquire();
    for (int part = 0; part < size; ++part) {
      if (!count(k, part)) continue;
      r.produce(r.parts.offset[part] + k * chunk, count(k, part), at(shm.contribution(rank, step), part));
      if (part != rank) shm.count_published(count(k, part) * r.elem);
    }
    shm.post(ShmComm::kPosted, step);
    return step;
  };

  uint64_t step = start(0);
  for (size_t k = 0; k < chunks; ++k) {
    shm.wait_all(ShmComm::kPosted, step);
    uint64_t next = 0;
    if (one_shot) {
      for (int part = 0; part < size; ++part) {
        if (!wanted(part) || !count(k, part)) continue;
        if (!r.consume) {
          sum_piece(k, part, step, out(k, part));
          continue;
        }
        char* result = at(shm.result(rank, step), part);
        sum_piece(k, part, step, result);
        deliver(k, part, result);
      }
    } else if (r.deliver == ChunkedReduction::kOwn) {
      if (count(k, rank)) sum_piece(k, rank, step, out(k, rank));
    } else {
      if (count(k, rank)) sum_piece(k, rank, step, shm.result(rank, step));
      shm.count_published(count(k, rank) * r.elem);
      shm.post(ShmComm::kReduced, step);
      // The next chunk's contributions go out before this one's results are awaited: the wait then
      // overlaps the peers' lag with useful work instead of idling (the slots alternate).
      if (k + 1 < chunks) next = start(k + 1);
      if (r.deliver == ChunkedReduction::kAll || rank == r.root) {
        shm.wait_all(ShmComm::kReduced, step);
        for (int part = 0; part < size; ++part) {
          if (count(k, part)) deliver(k, part, shm.result(part, step));
        }
      }
    }
    shm.post(ShmComm::kReleased, step);
    if (k + 1 < chunks && !next) next = start(k + 1);
    step = next;
  }
}

}  // namespace cnccl::host

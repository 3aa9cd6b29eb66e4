// Reductions through shared memory (docs/design.md, "Shared memory"). The elements are cut into
// one part per rank; chunk k takes the k-th piece of every part. Per chunk: every rank writes its
// contribution to all pieces into its own slot (ShmProducer: the cast happens here, from the
// caller's tensor, while the slot stays in cache), the owner of part p sums every rank's piece p
// in rank order (RankSum) into its result area, and every rank copies the owners' results out.
// Small reductions take one chunk in which every rank sums every piece itself: one wait.
#include <algorithm>
#include <vector>

#include "backend/host/algorithms.h"
#include "backend/host/shm_comm.h"

namespace cnccl::host {
namespace {

// Up to this many bytes of contributions, one exchange in which every rank reduces everything:
// the second wait of the chunked form costs more than the redundant adds.
constexpr size_t kOneShotBytes = size_t(64) << 10;

}  // namespace

void reduce_shm(ShmComm& shm, const ShmReduction& r) {
  const int size = shm.size(), rank = shm.rank();
  const size_t max_length = r.parts.max_length();
  const bool one_shot = max_length * size * r.elem <= std::min(kOneShotBytes, ShmComm::kSlotBytes);
  const size_t chunk = one_shot ? max_length : ShmComm::piece_elements(size, r.elem);
  const size_t chunks = one_shot ? 1 : (max_length + chunk - 1) / chunk;
  auto wanted = [&](int part) {
    return r.deliver == ShmReduction::kAll || (r.deliver == ShmReduction::kOwn ? part == rank : rank == r.root);
  };
  std::vector<const char*> inputs(size);
  for (size_t k = 0; k < chunks; ++k) {
    const size_t first = k * chunk;
    auto count = [&](int part) {
      return std::min(chunk, r.parts.length[part] - std::min(first, r.parts.length[part]));
    };
    auto at = [&](char* base, int part) { return base + part * chunk * r.elem; };
    auto out = [&](int part) {
      const size_t index = r.deliver == ShmReduction::kOwn ? first : r.parts.offset[part] + first;
      return r.out + index * (r.out_elem ? r.out_elem : r.elem);
    };
    auto sum_piece = [&](int part, uint64_t step, char* dst) {
      for (int q = 0; q < size; ++q) inputs[q] = at(shm.contribution(q, step), part);
      r.sum(inputs.data(), dst, r.parts.offset[part] + first, count(part));
    };

    const uint64_t step = shm.acquire();
    for (int part = 0; part < size; ++part) {
      if (!count(part)) continue;
      r.produce(r.parts.offset[part] + first, count(part), at(shm.contribution(rank, step), part));
      if (part != rank) shm.count_published(count(part) * r.elem);
    }
    shm.post(ShmComm::kPosted, step);
    shm.wait_all(ShmComm::kPosted, step);
    if (one_shot) {
      for (int part = 0; part < size; ++part) {
        if (wanted(part) && count(part)) sum_piece(part, step, out(part));
      }
    } else if (r.deliver == ShmReduction::kOwn) {
      if (count(rank)) sum_piece(rank, step, out(rank));
    } else {
      if (count(rank)) sum_piece(rank, step, shm.result(rank, step));
      shm.count_published(count(rank) * r.elem);
      shm.post(ShmComm::kReduced, step);
      if (r.deliver == ShmReduction::kAll || rank == r.root) {
        shm.wait_all(ShmComm::kReduced, step);
        for (int part = 0; part < size; ++part) copy_bytes(out(part), shm.result(part, step), count(part) * r.elem);
      }
    }
    shm.post(ShmComm::kReleased, step);
  }
}

}  // namespace cnccl::host

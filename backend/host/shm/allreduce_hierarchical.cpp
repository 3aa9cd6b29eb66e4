// Hierarchical allreduce (docs/design.md, "Shared memory"): only each rank's part crosses hosts, and the
// levels run together, as a wire per level's do (docs/design.md, "A wire per level").
#include <algorithm>
#include <cstring>

#include "backend/host/shm/shm_algorithms.h"
#include "backend/host/shm/shm_comm.h"
#include "backend/host/transport/comm.h"

namespace cnccl::host {

void allreduce_hierarchical(ShmComm& shm, Comm& across, const ChunkedReduction& local, const Reducer& reduce) {
  const int ranks = shm.size(), l = shm.rank(), hosts = across.size();
  const size_t elem = local.elem;
  size_t n = 0;
  for (int q = 0; q < ranks; ++q) n = std::max(n, local.parts.offset[q] + local.parts.length[q]);
  // Local parts of `count` units, a multiple of the hosts, so that every local rank's exchange across hosts
  // has the same chunks, and so every local rank makes the same calls through shared memory in the same
  // order; the last parts are short or empty where the tensor ends.
  const size_t per_rank = (n + size_t(ranks) - 1) / size_t(ranks);
  const size_t count = (per_rank + size_t(hosts) - 1) / size_t(hosts) * size_t(hosts);
  auto clipped = [&](int q, size_t first, size_t len) {
    const size_t at = std::min(size_t(q) * count + first, n);
    return std::make_pair(at, std::min(size_t(q) * count + first + len, n) - at);
  };
  // Units [first, first + len) of every local part: summed to their owner (level 1), or copied from it to
  // every rank of the host (level 3).
  auto range = [&](size_t first, size_t len) {
    Parts parts;
    size_t any = 0;
    for (int q = 0; q < ranks; ++q) {
      const auto [at, have] = clipped(q, first, len);
      parts.offset.push_back(at);
      parts.length.push_back(have);
      any += have;
    }
    return std::make_pair(parts, any);
  };
  char* mine = local.out + std::min(size_t(l) * count, n) * elem;
  const size_t have = clipped(l, 0, count).second;
  // Level 2's producer sums its chunk inside the host first; its units past the tensor's end are zeros.
  const ChunkProduce produce = [&](size_t first, size_t len, char* dst) {
    auto [parts, any] = range(first, len);
    if (any) {
      ChunkedReduction inside = local;
      inside.parts = parts;
      inside.deliver = ChunkedReduction::kOwn;
      inside.out = mine + std::min(first, have) * elem;
      inside.consume = nullptr;
      reduce_shm(shm, inside);
    }
    const size_t given = first < have ? std::min(len, have - first) : 0;
    std::memcpy(dst, mine + first * elem, given * elem);
    std::memset(dst + given * elem, 0, (len - given) * elem);
  };
  // The owners add the hosts' chunks in host order, in the wire type.
  const RankSum sum = [&](const char* const* in, char* dst, size_t, size_t len) {
    std::memcpy(dst, in[0], len * elem);
    for (int j = 1; j < hosts; ++j) reduce(dst, in[j], len);
  };
  // Each chunk's result into this rank's part, then to every rank of the host (level 3).
  const ChunkConsume consume = [&](size_t first, size_t len, const char* result) {
    const size_t given = first < have ? std::min(len, have - first) : 0;
    std::memcpy(mine + first * elem, result, given * elem);
    auto [parts, any] = range(first, len);
    if (any) allgather_shm(shm, local.out, parts, elem);
  };
  // Waits through shared memory keep the chunks across hosts moving (ShmComm::Idle).
  const ShmComm::Idle idle{[&] { across.poll(); },
                           [&](std::chrono::microseconds limit) { across.wait_for_activity(limit); }};
  const ShmComm::IdleScope progress_across(shm, idle);
  ChunkedReduction chunks{Parts::equal(count / size_t(hosts), hosts), elem, produce, sum, nullptr,
                          ChunkedReduction::kAll};
  chunks.consume = consume;
  chunks.chunk_bytes = kLevelChunkBytes;
  reduce_chunked(across, chunks);
  across.end();
}

}  // namespace cnccl::host

// Collectives that move bytes through shared memory without reducing them (docs/design.md, "Shared
// memory"): per chunk, the ranks with data copy it into their contribution area, post, and every
// rank copies out what it lacks. One wait per chunk.
#include <algorithm>

#include "backend/host/shm/shm_algorithms.h"
#include "backend/host/shm/shm_comm.h"

namespace cnccl::host {

void allgather_shm(ShmComm& shm, char* data, const Parts& parts, size_t elem, const ChunkProduce& produce,
                   const ChunkConsume& consume) {
  const int rank = shm.rank();
  const size_t chunk = std::max<size_t>(1, ShmComm::kSlotBytes / elem);
  const size_t chunks = std::max<size_t>(1, (parts.max_length() + chunk - 1) / chunk);
  for (size_t k = 0; k < chunks; ++k) {
    const size_t first = k * chunk;
    auto count = [&](int part) { return std::min(chunk, parts.length[part] - std::min(first, parts.length[part])); };
    auto at = [&](int part) { return data + (parts.offset[part] + first) * elem; };
    const uint64_t step = shm.acquire();
    if (count(rank)) {
      if (produce) {
        produce(parts.offset[rank] + first, count(rank), shm.contribution(rank, step));
      } else {
        copy_bytes(shm.contribution(rank, step), at(rank), count(rank) * elem);
      }
    }
    shm.count_published(count(rank) * elem);
    shm.post(ShmComm::kPosted, step);
    shm.wait_all(ShmComm::kPosted, step);
    for (int q = 0; q < shm.size(); ++q) {
      if (!count(q)) continue;
      if (consume) {
        consume(parts.offset[q] + first, count(q), shm.contribution(q, step));
      } else if (q != rank) {
        copy_bytes(at(q), shm.contribution(q, step), count(q) * elem);
      }
    }
    shm.post(ShmComm::kReleased, step);
  }
}

void broadcast_shm(ShmComm& shm, char* data, size_t bytes, int root) {
  const bool is_root = shm.rank() == root;
  const size_t chunk = ShmComm::kSlotBytes;
  const size_t chunks = std::max<size_t>(1, (bytes + chunk - 1) / chunk);
  for (size_t k = 0; k < chunks; ++k) {
    const size_t offset = k * chunk, count = std::min(chunk, bytes - std::min(bytes, offset));
    const uint64_t step = shm.acquire();
    if (is_root) {
      copy_bytes(shm.contribution(root, step), data + offset, count);
      shm.count_published(count);
    }
    shm.post(ShmComm::kPosted, step);
    shm.wait_all(ShmComm::kPosted, step);
    if (!is_root) copy_bytes(data + offset, shm.contribution(root, step), count);
    shm.post(ShmComm::kReleased, step);
  }
}

}  // namespace cnccl::host

// Collectives over one host's shared memory (ShmComm), and the hierarchical allreduce that joins
// hosts' shared memory through a Comm. They use the algorithms' vocabulary (Parts, RankSum,
// Reducer) and, across hosts, the Comm algorithms themselves; the algorithms never include this.
#pragma once

#include <cstddef>
#include <functional>

#include "backend/host/algorithms/algorithms.h"

namespace cnccl::host {

class ShmComm;

// A reduction through shared memory (reduce_shm.cpp): every rank's contribution to the elements
// of `parts`, reduced in rank order, lands in `out` (element e at out + e * out_elem) on the ranks
// `deliver` names: all of them (allreduce), each its own part (reduce_scatter: `out` then holds that
// part alone, from its first element), or the root.
// Writes this rank's contribution to elements [offset, offset + count) to `dst`, as sent.
using ShmProduce = std::function<void(size_t offset, size_t count, char* dst)>;
// Takes `count` reduced elements, element `offset` first, from `result` (as `sum` wrote them).
using ShmConsume = std::function<void(size_t offset, size_t count, const char* result)>;
struct ShmReduction {
  Parts parts;
  size_t elem;
  ShmProduce produce;
  RankSum sum;
  char* out;
  enum Deliver { kAll, kOwn, kRoot } deliver = kAll;
  int root = 0;
  // Bytes per result element when `sum` writes a wider type than it reads (an fp32 sum of 16-bit
  // contributions, kOwn only); 0: `elem`.
  size_t out_elem = 0;
  // kAll: where set, results go here chunk by chunk, straight from the shared slots (an allreduce
  // restoring into the caller's tensor), instead of to `out`.
  ShmConsume consume = nullptr;
};
void reduce_shm(ShmComm& shm, const ShmReduction& reduction);
// Across hosts (allreduce_hierarchical.cpp): `local` reduce-scattered through this host's shared
// memory (each local rank owns part l), each part allreduced with `reduce` among its owners on every
// host over `across` (ring or direct by size), then allgathered through shared memory.
void allreduce_hierarchical(ShmComm& shm, Comm& across, const ShmReduction& local, const Reducer& reduce);
// Through shared memory (copy_shm.cpp): as allgather_ring, and as broadcast_direct.
void allgather_shm(ShmComm& shm, char* data, const Parts& parts, size_t elem);
void broadcast_shm(ShmComm& shm, char* data, size_t bytes, int root);

}  // namespace cnccl::host

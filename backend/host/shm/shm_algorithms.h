// Collectives over one host's shared memory (ShmComm), and the hierarchical allreduce that joins
// hosts' shared memory through a Comm. They use the algorithms' vocabulary (Parts, RankSum,
// Reducer) and, across hosts, the Comm algorithms themselves; the algorithms never include this.
#pragma once

#include <cstddef>
#include <functional>

#include "backend/host/algorithms/algorithms.h"

namespace cnccl::host {

class ShmComm;

// A ChunkedReduction through shared memory (reduce_shm.cpp): each chunk's contributions go into this
// rank's slot, and its owners' results are read straight from theirs.
void reduce_shm(ShmComm& shm, const ChunkedReduction& reduction);
// Across hosts (allreduce_hierarchical.cpp): `local` (kAll, results to local.out) reduce-scattered
// through this host's shared memory (each local rank owns a part), each part allreduced among its owners
// on every host over `across` (reduce_chunked, their chunks added with `reduce` in host order), then
// allgathered through shared memory, the three a chunk at a time.
void allreduce_hierarchical(ShmComm& shm, Comm& across, const ChunkedReduction& local, const Reducer& reduce);
// Chunks across hosts where levels pipeline (the hierarchical allreduce, a wire per level), as
// reduce_chunked's default: at 64 MiB an owner's part goes in about 16, and the first chunk's level 1
// and the last one's restore, which nothing overlaps, are short.
constexpr size_t kLevelChunkBytes = size_t(256) << 10;
// Through shared memory (copy_shm.cpp): as allgather_ring, and as broadcast_direct. allgather_shm's
// `produce` writes this rank's piece of each chunk into its slot (data is not read then), and its
// `consume` takes every part's piece from the slots, this rank's too (data is not written then).
void allgather_shm(ShmComm& shm, char* data, const Parts& parts, size_t elem, const ChunkProduce& produce = nullptr,
                   const ChunkConsume& consume = nullptr);
void broadcast_shm(ShmComm& shm, char* data, size_t bytes, int root);

}  // namespace cnccl::host

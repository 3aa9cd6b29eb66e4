// Host collective algorithms over Comm, one file each. They move and reduce raw element
// buffers; deciding dtypes, compression and where results land is the host path's job
// (host_path.h). They see ranks only through Comm, never a transport's or shared memory's own
// headers (docs/design.md, "Layout"). Each is tested on its own over an in-memory transport
// (tests/cpp/host/algorithms/).
#pragma once

#include <cstddef>
#include <cstring>
#include <functional>
#include <vector>

#include "backend/host/transport/comm.h"

namespace cnccl::host {

// Copies `bytes` (possibly none: the buffers of an empty tensor may be null, which memcpy does not
// allow even for zero bytes).
inline void copy_bytes(void* dst, const void* src, size_t bytes) {
  if (bytes) std::memmove(dst, src, bytes);
}

// acc[i] = acc[i] (op) in[i] for `count` elements.
using Reducer = std::function<void(void* acc, const void* in, size_t count)>;
// Writes this rank's contribution to elements [offset, offset + count) of the algorithm's buffer,
// when the algorithm is about to send them as they are. Lets a caller produce its data lazily
// (cast it to 16 bits) where the algorithm needs it rather than all up front.
using Producer = std::function<void(size_t offset, size_t count)>;

// A buffer cut into one contiguous part per rank (element offsets and lengths).
struct Parts {
  std::vector<size_t> offset, length;
  // `count` elements split as evenly as possible over `parts`.
  static Parts even(size_t count, int parts);
  // `parts` equal parts of `each` elements.
  static Parts equal(size_t each, int parts);
  size_t max_length() const;
};

// Ring reduce-scatter: afterwards part r of `data` on rank r holds the reduction of every
// rank's part r. Uses message slots [slot_base, tags::kSecondPhase). One part is sent as it is,
// after `produce` (when given) was called for it; each other part is passed to `reduce` exactly
// once (possibly in segments) before it is sent on, so with a `produce` a reducer may also
// produce the rank's own contribution as it reduces.
void reduce_scatter_ring(Comm& comm, char* data, const Parts& parts, size_t elem, const Reducer& reduce,
                         const Producer& produce = {}, uint32_t slot_base = 0);
// Ring allgather: on entry part r of `data` on rank r is valid; afterwards all parts are.
void allgather_ring(Comm& comm, char* data, const Parts& parts, size_t elem, uint32_t slot_base = 0);
// Bandwidth-optimal allreduce for large buffers: reduce_scatter_ring over Parts::even(count, size),
// then allgather_ring. `produce` as for reduce_scatter_ring.
void allreduce_ring(Comm& comm, char* data, size_t count, size_t elem, const Reducer& reduce,
                    const Producer& produce = {});
// Latency-optimal allreduce for small buffers: one exchange with every peer, then each rank
// reduces all contributions in rank order (so every rank computes the identical result).
void allreduce_direct(Comm& comm, char* data, size_t count, size_t elem, const Reducer& reduce);

// Root sends `bytes` to every other rank.
void broadcast_direct(Comm& comm, char* data, size_t bytes, int root);
// Every rank sends to root, which reduces in rank order into `data`.
void reduce_direct(Comm& comm, char* data, size_t count, size_t elem, int root, const Reducer& reduce);
// Root receives rank i's `bytes` into out + i * bytes (root's own part is copied).
void gather_direct(Comm& comm, const char* in, size_t bytes, char* out, int root);
// Root sends in + i * bytes to rank i; every rank receives into `out`.
void scatter_direct(Comm& comm, const char* in, char* out, size_t bytes, int root);
// Rank r sends bytes [send_off[i], +send_len[i]) of `in` to rank i and receives rank i's
// message into out + recv_off[i] (exactly recv_len[i] bytes).
void alltoall_direct(Comm& comm, const char* in, const std::vector<size_t>& send_off,
                     const std::vector<size_t>& send_len, char* out, const std::vector<size_t>& recv_off,
                     const std::vector<size_t>& recv_len);
// Returns once every rank has entered.
void barrier_direct(Comm& comm);

// dst = the reduction of inputs[0], ..., inputs[size - 1] (one per rank, in rank order) over
// `count` elements; element 0 is element `first` of the whole buffer (stochastic rounding keys its
// random bits by that index).
using RankSum = std::function<void(const char* const* inputs, char* dst, size_t first, size_t count)>;
// Reduce-scatter in one exchange with every peer: rank r sends part p of `data` to rank p, and
// `sum` reduces every rank's part r in rank order into `out` (which may be part r of `data`).
// Each element is reduced in one place with every contribution at hand: the form fp32
// accumulation needs (docs/design.md, "Numerics"). Uses message slots [slot_base, +1).
void reduce_scatter_alltoall(Comm& comm, char* data, const Parts& parts, size_t elem, const RankSum& sum, char* out,
                             uint32_t slot_base = 0);

// A reduction cut into chunks (reduce_chunked here, reduce_shm in shared memory): every rank's
// contribution to the units of `parts` (a unit: an element, or an MX block), reduced in rank order, lands in
// `out` (unit e at out + e * out_elem) on the ranks `deliver` names: all of them (allreduce), each its own
// part (reduce_scatter: `out` then holds that part alone, from its first unit), or the root. Each chunk
// is produced, summed and delivered on its own, so neighbouring chunks overlap. `produce` and `sum` work
// unit by unit (an MX block is encoded alone), so where the forms cut chunks changes no bit: the same
// functions give the same results through either.
// Writes this rank's contribution to units [offset, offset + count) to `dst`, as sent.
using ChunkProduce = std::function<void(size_t offset, size_t count, char* dst)>;
// Takes `count` reduced units, unit `offset` first, from `result` (as `sum` wrote them).
using ChunkConsume = std::function<void(size_t offset, size_t count, const char* result)>;
struct ChunkedReduction {
  Parts parts;
  size_t elem;
  ChunkProduce produce;
  RankSum sum;
  char* out;
  enum Deliver { kAll, kOwn, kRoot } deliver = kAll;
  int root = 0;
  // Bytes per result unit when `sum` writes a wider type than it reads (an fp32 sum of 16-bit
  // contributions, kOwn only); 0: `elem`.
  size_t out_elem = 0;
  // kAll: where set, results go here chunk by chunk (an allreduce restoring into the caller's
  // tensor), instead of to `out`.
  ChunkConsume consume = nullptr;
  // reduce_chunked: the bytes of a chunk's piece (0: 256 KiB). Smaller chunks leave less of the first
  // chunk's produce and the last one's consume unoverlapped, for more messages.
  size_t chunk_bytes = 0;
};
// Over the transport: each chunk's pieces go to their owners, which sum them as they arrive and
// (kAll) send the results back; while an owner waits for chunk k it has already sent chunk k+1, so
// casting, sending, summing and restoring overlap, and every rank sends and receives at once. kAll
// and kOwn only. Uses message slots [slot_base, tags::kSecondPhase) and as many from kSecondPhase.
void reduce_chunked(Comm& comm, const ChunkedReduction& reduction, uint32_t slot_base = 0);
// An allgather in the same pipeline (reduce_chunked.cpp): this rank's part is produced a chunk at a
// time and sent to every peer; every part's chunks, this rank's too, are handed to `consume` as they
// arrive, chunk k's while chunk k+1 is already on its way. Uses slots [slot_base, slot_base + 64).
void allgather_chunked(Comm& comm, const Parts& parts, size_t elem, const ChunkProduce& produce,
                       const ChunkConsume& consume, uint32_t slot_base, size_t chunk_bytes = 0);

}  // namespace cnccl::host

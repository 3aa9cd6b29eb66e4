#include <c10/util/Exception.h>

#include <algorithm>
#include <vector>

#include "backend/host/algorithms/algorithms.h"
#include "backend/host/transport/tags.h"

namespace cnccl::host {
namespace {

// A chunk's pieces are about this large: big enough that a message's own cost is small beside its
// bytes, small enough that the first chunk's cast and the last one's restore, which nothing
// overlaps, are short. At most kMaxChunks a part, so a part's messages fit below kSecondPhase.
// 256 KiB, as the levels' chunks (kLevelChunkBytes): over a shaped link 1 MiB left up to a tenth of
// a 16 MiB call unoverlapped, and no size ran slower for the smaller pieces (docs/benchmarks.md).
constexpr size_t kChunkBytes = size_t(256) << 10;
constexpr size_t kMaxChunks = 64;

// Units a chunk takes of each part, for parts of at most `longest` units of `elem` bytes, in pieces of
// about `bytes` (0: kChunkBytes).
size_t chunk_units(size_t longest, size_t elem, size_t bytes) {
  const size_t chunk = std::max<size_t>(1, (bytes ? bytes : kChunkBytes) / std::max<size_t>(elem, 1));
  return std::max(chunk, (longest + kMaxChunks - 1) / kMaxChunks);
}

}  // namespace

void reduce_chunked(Comm& comm, const ChunkedReduction& red, uint32_t slot_base) {
  TORCH_INTERNAL_ASSERT(red.deliver != ChunkedReduction::kRoot, "reduce_chunked delivers to all or to owners");
  const int n = comm.size(), r = comm.rank();
  const Parts& parts = red.parts;
  const size_t elem = red.elem, out_elem = red.out_elem ? red.out_elem : elem;
  const size_t longest = parts.max_length();
  const size_t chunk = chunk_units(longest, elem, red.chunk_bytes);
  const size_t chunks = std::max<size_t>(1, (longest + chunk - 1) / chunk);
  size_t units = 0;
  for (int p = 0; p < n; ++p) units = std::max(units, parts.offset[p] + parts.length[p]);
  const bool all = red.deliver == ChunkedReduction::kAll;
  const size_t mine = parts.length[r];

  auto count = [&](size_t k, int p) { return std::min(chunk, parts.length[p] - std::min(k * chunk, parts.length[p])); };
  auto first = [&](size_t k, int p) { return parts.offset[p] + k * chunk; };
  // This rank's contributions and (kAll) every part's results, each at its units' place; then
  // every peer's contributions to this rank's part.
  char* contributions = comm.scratch().algorithm((2 * units + size_t(n) * mine) * elem);
  char* results = contributions + units * elem;
  char* incoming = results + units * elem;
  auto from = [&](int q, size_t k) { return incoming + (size_t(q) * mine + k * chunk) * elem; };

  // Every receive is posted before anything is sent, so no message waits for its buffer.
  std::vector<Pending> pieces(chunks * size_t(n)), sums(chunks * size_t(n)), sent;
  for (size_t k = 0; k < chunks; ++k) {
    for (int q = 0; q < n; ++q) {
      if (q == r) continue;
      if (count(k, r)) pieces[k * n + q] = comm.recv(q, slot_base + uint32_t(k), from(q, k), count(k, r) * elem);
      if (all && count(k, q)) {
        sums[k * n + q] = comm.recv(q, tags::kSecondPhase + slot_base + uint32_t(k), results + first(k, q) * elem,
                                    count(k, q) * elem);
      }
    }
  }
  // Produces and sends chunk k of every other part, the next rank's first, so the owners' pieces arrive
  // staggered rather than all at the same rank at once. This rank's own chunk k is produced only when its
  // sum is due: what the link waits for goes first (a framed part's first piece waits for that part's amax
  // pass, and the own part's pass would otherwise hold back the next chunk's sends).
  auto start = [&](size_t k) {
    for (int i = 1; i < n; ++i) {
      const int p = (r + i) % n;
      if (!count(k, p)) continue;
      char* piece = contributions + first(k, p) * elem;
      red.produce(first(k, p), count(k, p), piece);
      sent.push_back(comm.send(p, slot_base + uint32_t(k), piece, count(k, p) * elem));
    }
  };
  auto deliver = [&](size_t k, int p, const char* result) {
    if (red.consume) return red.consume(first(k, p), count(k, p), result);
    copy_bytes(red.out + first(k, p) * elem, result, count(k, p) * elem);
  };
  auto deliver_peers = [&](size_t k) {
    for (int q = 0; q < n; ++q) {
      if (q == r || !count(k, q)) continue;
      comm.wait(sums[k * n + q]);
      deliver(k, q, results + first(k, q) * elem);
    }
  };

  std::vector<const char*> inputs(n);
  start(0);
  for (size_t k = 0; k < chunks; ++k) {
    if (k + 1 < chunks) start(k + 1);
    if (count(k, r)) {
      red.produce(first(k, r), count(k, r), contributions + first(k, r) * elem);
      for (int q = 0; q < n; ++q) {
        if (q != r) comm.wait(pieces[k * n + q]);
        inputs[q] = q == r ? contributions + first(k, r) * elem : from(q, k);
      }
      char* dst = all ? results + first(k, r) * elem : red.out + k * chunk * out_elem;
      red.sum(inputs.data(), dst, first(k, r), count(k, r));
      if (all) {
        for (int q = 0; q < n; ++q) {
          if (q == r) continue;
          sent.push_back(comm.send(q, tags::kSecondPhase + slot_base + uint32_t(k), dst, count(k, r) * elem));
        }
        deliver(k, r, dst);
      }
    }
    // A chunk's results are awaited one chunk late: the owners are summing it meanwhile.
    if (all && k > 0) deliver_peers(k - 1);
  }
  if (all) deliver_peers(chunks - 1);
  comm.wait(sent);
}

void allgather_chunked(Comm& comm, const Parts& parts, size_t elem, const ChunkProduce& produce,
                       const ChunkConsume& consume, uint32_t slot_base, size_t chunk_bytes) {
  const int n = comm.size(), r = comm.rank();
  const size_t longest = parts.max_length(), chunk = chunk_units(longest, elem, chunk_bytes);
  const size_t chunks = std::max<size_t>(1, (longest + chunk - 1) / chunk);
  size_t units = 0;
  for (int p = 0; p < n; ++p) units = std::max(units, parts.offset[p] + parts.length[p]);
  auto count = [&](size_t k, int p) { return std::min(chunk, parts.length[p] - std::min(k * chunk, parts.length[p])); };
  auto first = [&](size_t k, int p) { return parts.offset[p] + k * chunk; };
  char* data = comm.scratch().algorithm(units * elem);

  std::vector<Pending> pieces(chunks * size_t(n)), sent;
  for (size_t k = 0; k < chunks; ++k) {
    for (int q = 0; q < n; ++q) {
      if (q != r && count(k, q)) pieces[k * n + q] = comm.recv(q, slot_base + uint32_t(k), data + first(k, q) * elem,
                                                               count(k, q) * elem);
    }
  }
  auto start = [&](size_t k) {
    if (!count(k, r)) return;
    char* piece = data + first(k, r) * elem;
    produce(first(k, r), count(k, r), piece);
    for (int i = 1; i < n; ++i) sent.push_back(comm.send((r + i) % n, slot_base + uint32_t(k), piece, count(k, r) * elem));
  };
  start(0);
  for (size_t k = 0; k < chunks; ++k) {
    if (k + 1 < chunks) start(k + 1);
    for (int q = 0; q < n; ++q) {
      if (!count(k, q)) continue;
      if (q != r) comm.wait(pieces[k * n + q]);
      consume(first(k, q), count(k, q), data + first(k, q) * elem);
    }
  }
  comm.wait(sent);
}

}  // namespace cnccl::host

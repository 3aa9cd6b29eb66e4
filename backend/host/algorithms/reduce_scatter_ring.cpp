#include <algorithm>
#include <vector>

#include "backend/host/algorithms/algorithms.h"

namespace cnccl::host {
namespace {

// Each ring step is cut into segments so that reducing one segment overlaps receiving the next.
constexpr size_t kSegmentBytes = size_t(1) << 20;
constexpr size_t kMaxSegments = 16;

}  // namespace

void reduce_scatter_ring(Comm& comm, char* data, const Parts& parts, size_t elem, const Reducer& reduce,
                         const Producer& produce, uint32_t slot_base) {
  const int n = comm.size(), r = comm.rank();
  const int first = (r + n - 1) % n;
  if (produce) produce(parts.offset[first], parts.length[first]);
  if (n == 1) return;
  char* incoming = comm.scratch().algorithm(parts.max_length() * elem);
  const size_t segments =
      n <= 2048 ? std::clamp<size_t>(parts.max_length() * elem / kSegmentBytes, 1, kMaxSegments) : 1;
  // Step s sends the part reduced in step s-1 (own data, `first`, at s = 0) and folds the
  // neighbour's partial sum into the next part; after n-1 steps part r has been through every rank.
  for (int s = 0; s < n - 1; ++s) {
    const int out = ((r - 1 - s) % n + n) % n;
    const int in = ((r - 2 - s) % n + n) % n;
    const Parts in_segs = Parts::even(parts.length[in], int(segments));
    const Parts out_segs = Parts::even(parts.length[out], int(segments));
    std::vector<Pending> recvs, sends;
    for (size_t k = 0; k < segments; ++k) {
      const uint32_t slot = slot_base + uint32_t(s * segments + k);
      recvs.push_back(comm.recv(comm.left(), slot, incoming + in_segs.offset[k] * elem, in_segs.length[k] * elem));
      sends.push_back(comm.send(comm.right(), slot, data + (parts.offset[out] + out_segs.offset[k]) * elem,
                                out_segs.length[k] * elem));
    }
    for (size_t k = 0; k < segments; ++k) {
      comm.wait(recvs[k]);
      reduce(data + (parts.offset[in] + in_segs.offset[k]) * elem, incoming + in_segs.offset[k] * elem,
             in_segs.length[k]);
    }
    comm.wait(sends);
  }
}

}  // namespace cnccl::host

#include <vector>

#include "backend/host/algorithms.h"

namespace cnccl::host {

void reduce_scatter_ring(Comm& comm, char* data, const Parts& parts, size_t elem, const Reducer& reduce,
                         uint32_t slot_base) {
  const int n = comm.size(), r = comm.rank();
  if (n == 1) return;
  std::vector<char> incoming(parts.max_length() * elem);
  // Step s sends the part reduced in step s-1 (own data at s = 0) and folds the neighbour's
  // partial sum into the next part; after n-1 steps part r has been through every rank.
  for (int s = 0; s < n - 1; ++s) {
    const int out = ((r - 1 - s) % n + n) % n;
    const int in = ((r - 2 - s) % n + n) % n;
    std::vector<Pending> step;
    step.push_back(comm.recv(comm.left(), slot_base + s, incoming.data(), parts.length[in] * elem));
    step.push_back(comm.send(comm.right(), slot_base + s, data + parts.offset[out] * elem, parts.length[out] * elem));
    comm.wait(step);
    reduce(data + parts.offset[in] * elem, incoming.data(), parts.length[in]);
  }
}

}  // namespace cnccl::host

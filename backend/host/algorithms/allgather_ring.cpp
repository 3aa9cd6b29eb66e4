#include <vector>

#include "backend/host/algorithms/algorithms.h"

namespace cnccl::host {

void allgather_ring(Comm& comm, char* data, const Parts& parts, size_t elem, uint32_t slot_base) {
  const int n = comm.size(), r = comm.rank();
  // Step s forwards the part received in step s-1 (own part at s = 0) to the right.
  for (int s = 0; s < n - 1; ++s) {
    const int out = ((r - s) % n + n) % n;
    const int in = ((r - 1 - s) % n + n) % n;
    std::vector<Pending> step;
    step.push_back(comm.recv(comm.left(), slot_base + s, data + parts.offset[in] * elem, parts.length[in] * elem));
    step.push_back(comm.send(comm.right(), slot_base + s, data + parts.offset[out] * elem, parts.length[out] * elem));
    comm.wait(step);
  }
}

}  // namespace cnccl::host

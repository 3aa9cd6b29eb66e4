#include <vector>

#include "backend/host/algorithms/algorithms.h"

namespace cnccl::host {

void reduce_scatter_alltoall(Comm& comm, char* data, const Parts& parts, size_t elem, const RankSum& sum, char* out,
                             uint32_t slot_base) {
  const int n = comm.size(), r = comm.rank();
  const size_t mine = parts.length[r] * elem;
  char* incoming = comm.scratch().algorithm(mine * n);
  std::vector<const char*> inputs(n);
  std::vector<Pending> msgs;
  for (int peer = 0; peer < n; ++peer) {
    if (peer == r) {
      inputs[peer] = data + parts.offset[r] * elem;
      continue;
    }
    inputs[peer] = incoming + mine * peer;
    msgs.push_back(comm.recv(peer, slot_base, incoming + mine * peer, mine));
    msgs.push_back(comm.send(peer, slot_base, data + parts.offset[peer] * elem, parts.length[peer] * elem));
  }
  comm.wait(msgs);
  sum(inputs.data(), out, parts.offset[r], parts.length[r]);
}

}  // namespace cnccl::host

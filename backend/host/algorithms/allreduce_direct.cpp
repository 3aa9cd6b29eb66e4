#include <vector>

#include "backend/host/algorithms/algorithms.h"

namespace cnccl::host {

void allreduce_direct(Comm& comm, char* data, size_t count, size_t elem, const Reducer& reduce) {
  const int n = comm.size(), r = comm.rank();
  if (n == 1) return;
  const size_t bytes = count * elem;
  char* all = comm.scratch().algorithm(bytes * n);
  copy_bytes(all + bytes * r, data, bytes);
  std::vector<Pending> msgs;
  for (int peer = 0; peer < n; ++peer) {
    if (peer == r) continue;
    msgs.push_back(comm.recv(peer, 0, all + bytes * peer, bytes));
    msgs.push_back(comm.send(peer, 0, data, bytes));
  }
  comm.wait(msgs);
  // Rank order, identical on every rank: results agree bit for bit across the group.
  copy_bytes(data, all, bytes);
  for (int peer = 1; peer < n; ++peer) reduce(data, all + bytes * peer, count);
}

}  // namespace cnccl::host

#include <vector>

#include "backend/host/algorithms/algorithms.h"

namespace cnccl::host {

void barrier_direct(Comm& comm) {
  std::vector<Pending> msgs;
  for (int peer = 0; peer < comm.size(); ++peer) {
    if (peer == comm.rank()) continue;
    msgs.push_back(comm.recv(peer, 0, nullptr, 0));
    msgs.push_back(comm.send(peer, 0, nullptr, 0));
  }
  comm.wait(msgs);
}

}  // namespace cnccl::host

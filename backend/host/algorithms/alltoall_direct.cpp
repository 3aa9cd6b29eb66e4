#include <vector>

#include "backend/host/algorithms/algorithms.h"

namespace cnccl::host {

void alltoall_direct(Comm& comm, const char* in, const std::vector<size_t>& send_off,
                     const std::vector<size_t>& send_len, char* out, const std::vector<size_t>& recv_off,
                     const std::vector<size_t>& recv_len) {
  const int r = comm.rank();
  std::vector<Pending> msgs;
  for (int peer = 0; peer < comm.size(); ++peer) {
    if (peer == r) continue;
    msgs.push_back(comm.recv(peer, 0, out + recv_off[peer], recv_len[peer]));
    msgs.push_back(comm.send(peer, 0, in + send_off[peer], send_len[peer]));
  }
  copy_bytes(out + recv_off[r], in + send_off[r], send_len[r]);
  comm.wait(msgs);
}

}  // namespace cnccl::host

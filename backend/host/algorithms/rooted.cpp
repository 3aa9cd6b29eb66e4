// The rooted collectives: one root talks to every other rank directly. At the group sizes the
// host path serves, a tree saves little over this and costs clarity.
#include <vector>

#include "backend/host/algorithms/algorithms.h"

namespace cnccl::host {

void broadcast_direct(Comm& comm, char* data, size_t bytes, int root) {
  std::vector<Pending> msgs;
  if (comm.rank() == root) {
    for (int peer = 0; peer < comm.size(); ++peer) {
      if (peer != root) msgs.push_back(comm.send(peer, 0, data, bytes));
    }
  } else {
    msgs.push_back(comm.recv(root, 0, data, bytes));
  }
  comm.wait(msgs);
}

void reduce_direct(Comm& comm, char* data, size_t count, size_t elem, int root, const Reducer& reduce) {
  const int n = comm.size();
  const size_t bytes = count * elem;
  std::vector<Pending> msgs;
  if (comm.rank() != root) {
    msgs.push_back(comm.send(root, 0, data, bytes));
    comm.wait(msgs);
    return;
  }
  char* all = comm.scratch().algorithm(bytes * n);
  copy_bytes(all + bytes * root, data, bytes);
  for (int peer = 0; peer < n; ++peer) {
    if (peer != root) msgs.push_back(comm.recv(peer, 0, all + bytes * peer, bytes));
  }
  comm.wait(msgs);
  copy_bytes(data, all, bytes);
  for (int peer = 1; peer < n; ++peer) reduce(data, all + bytes * peer, count);
}

void gather_direct(Comm& comm, const char* in, size_t bytes, char* out, int root) {
  std::vector<Pending> msgs;
  if (comm.rank() == root) {
    copy_bytes(out + bytes * root, in, bytes);
    for (int peer = 0; peer < comm.size(); ++peer) {
      if (peer != root) msgs.push_back(comm.recv(peer, 0, out + bytes * peer, bytes));
    }
  } else {
    msgs.push_back(comm.send(root, 0, in, bytes));
  }
  comm.wait(msgs);
}

void scatter_direct(Comm& comm, const char* in, char* out, size_t bytes, int root) {
  std::vector<Pending> msgs;
  if (comm.rank() == root) {
    copy_bytes(out, in + bytes * root, bytes);
    for (int peer = 0; peer < comm.size(); ++peer) {
      if (peer != root) msgs.push_back(comm.send(peer, 0, in + bytes * peer, bytes));
    }
  } else {
    msgs.push_back(comm.recv(root, 0, out, bytes));
  }
  comm.wait(msgs);
}

}  // namespace cnccl::host

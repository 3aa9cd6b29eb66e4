// The processes of a group's ranks on this host, and whether each is still alive: how every engine
// tells a peer that died from one that is slow (docs/design.md, "Shared memory" and "Agreement").
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <map>
#include <string>

namespace cnccl {

// What ranks must share to see each other's processes (and map their segments): the kernel instance
// (boot id), the IPC, PID and mount namespaces (a pid of one names the same process in the other), and
// the user.
std::string host_identity();

// Whether a peer process is still alive, cheaply enough to ask in a wait loop.
class Liveness {
 public:
  Liveness() = default;
  explicit Liveness(int pid);
  Liveness(Liveness&& other) noexcept;
  Liveness& operator=(Liveness&& other) noexcept;
  ~Liveness();
  bool alive() const;
  int pid() const { return pid_; }

 private:
  int pid_ = -1;
  int pidfd_ = -1;  // -1 where the kernel has no pidfd_open: kill(pid, 0) instead
};

// The group's ranks on this host (the same host_identity()), each with a pidfd taken now. Collective:
// every rank publishes its identity and pid under cnccl/process/.
std::map<int, Liveness> same_host_peers(c10d::Store& store, int rank, int size);

// "its process (pid N) exited" where `peer` is on this host and its process is gone; empty otherwise.
std::string exited(const std::map<int, Liveness>& peers, int peer);

}  // namespace cnccl

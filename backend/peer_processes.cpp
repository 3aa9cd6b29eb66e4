#include "backend/peer_processes.h"

#include <poll.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <fstream>
#include <utility>
#include <vector>

namespace cnccl {
namespace {

std::string link_of(const char* path) {
  char buf[256];
  const ssize_t n = ::readlink(path, buf, sizeof buf - 1);
  return n < 0 ? std::string("?") : std::string(buf, size_t(n));
}

}  // namespace

std::string host_identity() {
  std::ifstream boot("/proc/sys/kernel/random/boot_id");
  std::string boot_id;
  std::getline(boot, boot_id);
  return boot_id + " " + link_of("/proc/self/ns/ipc") + " " + link_of("/proc/self/ns/pid") + " " +
         link_of("/proc/self/ns/mnt") + " uid " + std::to_string(::getuid());
}

Liveness::Liveness(int pid) : pid_(pid) {
#ifdef SYS_pidfd_open
  pidfd_ = int(::syscall(SYS_pidfd_open, pid, 0));
#endif
}

Liveness::Liveness(Liveness&& other) noexcept { *this = std::move(other); }

Liveness& Liveness::operator=(Liveness&& other) noexcept {
  std::swap(pid_, other.pid_);
  std::swap(pidfd_, other.pidfd_);
  return *this;
}

Liveness::~Liveness() {
  if (pidfd_ >= 0) ::close(pidfd_);
}

bool Liveness::alive() const {
  if (pidfd_ < 0) return pid_ < 0 || ::kill(pid_, 0) == 0 || errno == EPERM;
  // A pidfd becomes readable when its process exits.
  pollfd p{pidfd_, POLLIN, 0};
  return ::poll(&p, 1, 0) == 0;
}

std::map<int, Liveness> same_host_peers(c10d::Store& store, int rank, int size) {
  const std::string mine = host_identity() + "\n" + std::to_string(::getpid());
  store.set("cnccl/process/" + std::to_string(rank), std::vector<uint8_t>(mine.begin(), mine.end()));
  std::map<int, Liveness> peers;
  for (int peer = 0; peer < size; ++peer) {
    if (peer == rank) continue;
    const std::vector<uint8_t> bytes = store.get("cnccl/process/" + std::to_string(peer));
    const std::string theirs(bytes.begin(), bytes.end());
    const size_t newline = theirs.rfind('\n');
    if (theirs.substr(0, newline) != mine.substr(0, mine.rfind('\n'))) continue;
    peers.emplace(peer, Liveness(std::stoi(theirs.substr(newline + 1))));
  }
  return peers;
}

std::string exited(const std::map<int, Liveness>& peers, int peer) {
  const auto it = peers.find(peer);
  if (it == peers.end() || it->second.alive()) return {};
  return "its process (pid " + std::to_string(it->second.pid()) + ") exited";
}

}  // namespace cnccl

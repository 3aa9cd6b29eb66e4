// One rank's shared-memory segment and its view of the peers' (docs/design.md, "Shared memory").
// Segments are memfd files: anonymous, so nothing is ever left in /dev/shm or SysV after any exit,
// SIGKILL included (the memory goes with the last mapping). Sealed before they are announced: no
// process can resize one (a SIGBUS for every rank) or write it except through its owner's mapping.
// A peer maps one read-only by opening /proc/<pid>/fd/<fd>, which the kernel allows only to the
// same user. Peer death is seen through a pidfd. Linux only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "backend/peer_processes.h"

namespace cnccl::host {


class Segment {
 public:
  // Creates a sealed segment of `bytes`, mapped writable for its owner alone. Throws
  // std::runtime_error.
  static Segment create(size_t bytes);
  // Maps another process's segment read-only, by its owner (whose pidfd was taken before this call)
  // and descriptor, once it has checked that the file is a sealed cnccl memfd of `bytes`. Throws
  // std::runtime_error.
  static Segment open(const Liveness& owner, int fd, size_t bytes);

  Segment() = default;
  Segment(Segment&& other) noexcept;
  Segment& operator=(Segment&& other) noexcept;
  Segment(const Segment&) = delete;
  Segment& operator=(const Segment&) = delete;
  ~Segment();

  char* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  int fd() const { return fd_; }
  // Closes the descriptor once every peer has mapped the segment: from then on the memory lives
  // exactly as long as its mappings.
  void close_fd();

 private:
  char* data_ = nullptr;
  size_t bytes_ = 0;
  int fd_ = -1;
};


}  // namespace cnccl::host

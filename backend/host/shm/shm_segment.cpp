#include "backend/host/shm/shm_segment.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <utility>

namespace cnccl::host {
namespace {

std::string system_error(const std::string& what) { return what + ": " + std::strerror(errno); }

std::string link_of(const char* path) {
  char buf[256];
  const ssize_t n = ::readlink(path, buf, sizeof buf - 1);
  return n < 0 ? std::string("?") : std::string(buf, size_t(n));
}

}  // namespace


// What a segment must carry before it is announced: its size fixed, and no write through any
// mapping or descriptor made after the owner's own (docs/design.md, "Shared memory": the trust model).
constexpr int kSeals = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_FUTURE_WRITE | F_SEAL_SEAL;

Segment Segment::create(size_t bytes) {
  Segment s;
  s.fd_ = ::memfd_create("cnccl", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (s.fd_ < 0) throw std::runtime_error(system_error("memfd_create"));
  if (::fchmod(s.fd_, S_IRUSR | S_IWUSR) != 0) throw std::runtime_error(system_error("fchmod"));
  if (::ftruncate(s.fd_, off_t(bytes)) != 0) throw std::runtime_error(system_error("ftruncate"));
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, s.fd_, 0);
  if (p == MAP_FAILED) throw std::runtime_error(system_error("mmap"));
  s.data_ = static_cast<char*>(p);
  s.bytes_ = bytes;
  // After the owner's writable mapping exists: F_SEAL_FUTURE_WRITE refuses only later ones.
  if (::fcntl(s.fd_, F_ADD_SEALS, kSeals) != 0) throw std::runtime_error(system_error("sealing the memfd"));
  return s;
}

Segment Segment::open(const Liveness& owner, int fd, size_t bytes) {
  const std::string path = "/proc/" + std::to_string(owner.pid()) + "/fd/" + std::to_string(fd);
  Segment s;
  s.fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (s.fd_ < 0) throw std::runtime_error(system_error("open " + path));
  // The pidfd was taken before the open: alive now, it names the process whose descriptor was
  // opened, not one that reused the pid after the owner exited.
  if (!owner.alive()) throw std::runtime_error("the process " + std::to_string(owner.pid()) + " exited");
  const std::string target = link_of(path.c_str());
  if (target.rfind("/memfd:cnccl", 0) != 0) throw std::runtime_error(path + " is " + target + ", not a cnccl memfd");
  const int seals = ::fcntl(s.fd_, F_GET_SEALS);
  if (seals < 0 || (seals & kSeals) != kSeals) {
    throw std::runtime_error(path + " is not sealed against resizing and writes (seals " + std::to_string(seals) + ")");
  }
  struct stat st {};
  if (::fstat(s.fd_, &st) != 0 || size_t(st.st_size) != bytes) {
    throw std::runtime_error(path + " is not the segment announced (size " + std::to_string(st.st_size) + ", not " +
                             std::to_string(bytes) + ")");
  }
  void* p = ::mmap(nullptr, bytes, PROT_READ, MAP_SHARED, s.fd_, 0);
  if (p == MAP_FAILED) throw std::runtime_error(system_error("mmap " + path));
  s.data_ = static_cast<char*>(p);
  s.bytes_ = bytes;
  s.close_fd();
  return s;
}

Segment::Segment(Segment&& other) noexcept { *this = std::move(other); }

Segment& Segment::operator=(Segment&& other) noexcept {
  std::swap(data_, other.data_);
  std::swap(bytes_, other.bytes_);
  std::swap(fd_, other.fd_);
  return *this;
}

Segment::~Segment() {
  if (data_) ::munmap(data_, bytes_);
  close_fd();
}

void Segment::close_fd() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

}  // namespace cnccl::host

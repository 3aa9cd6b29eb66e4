#include "backend/host/comm.h"

#include <c10/util/Exception.h>
#include <sched.h>

#include <thread>

namespace cnccl::host {
namespace {

// Tag layout: [63] point-to-point | [62:32] collective seq or user tag | [31:16] source rank | [15:0] slot.
constexpr uint64_t kP2pBit = uint64_t{1} << 63;
constexpr uint64_t kSourceMask = uint64_t{0xFFFF} << 16;

uint64_t p2p_tag(int source, int user_tag) {
  return kP2pBit | (uint64_t(uint32_t(user_tag) & 0x7FFFFFFFu) << 32) | (uint64_t(source & 0xFFFF) << 16);
}

// Waiting without burning a core: spin briefly (latency), then yield, then sleep in short naps,
// since tests and small jobs run more ranks than there are cores.
class Backoff {
 public:
  void reset() { idle_ = 0; }
  void pause() {
    ++idle_;
    if (idle_ < 64) return;
    if (idle_ < 256) {
      sched_yield();
      return;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(idle_ < 4096 ? 10 : 100));
  }

 private:
  unsigned idle_ = 0;
};

}  // namespace

Comm::Comm(std::unique_ptr<Transport> transport, std::string group_name)
    : transport_(std::move(transport)), group_name_(std::move(group_name)) {
  TORCH_CHECK(transport_->size() <= 0x10000, "cnccl: the host path supports at most 65536 ranks");
}

void Comm::begin(const char* op, uint64_t seq, std::chrono::milliseconds timeout) {
  op_ = op;
  seq_ = seq;
  deadline_ = Clock::now() + timeout;
}

uint64_t Comm::collective_tag(int source, uint32_t slot) const {
  return ((seq_ & 0x7FFFFFFFu) << 32) | (uint64_t(source & 0xFFFF) << 16) | (slot & 0xFFFFu);
}

Pending Comm::send(int peer, uint32_t slot, const void* data, size_t bytes) {
  return {transport_->isend(peer, collective_tag(rank(), slot), data, bytes), peer, bytes, false};
}

Pending Comm::recv(int peer, uint32_t slot, void* data, size_t bytes) {
  return {transport_->irecv(peer, collective_tag(peer, slot), Transport::kFullMask, data, bytes), peer, bytes, true};
}

void Comm::fail(const std::string& what, int peer) const {
  std::string msg = "cnccl: " + std::string(op_) + " (seq " + std::to_string(seq_) + ", group '" + group_name_ +
                    "', rank " + std::to_string(rank()) + "/" + std::to_string(size()) + "): " + what;
  if (peer >= 0) msg += " [peer rank " + std::to_string(peer) + "]";
  C10_THROW_ERROR(DistBackendError, msg);
}

std::string Comm::check(const Pending& p, const std::string& what) const {
  if (!p.request->error().empty()) {
    if (p.request->error().find("truncated") != std::string::npos) {
      return what + ": rank " + std::to_string(p.peer) + " sent more than the " + std::to_string(p.expected_bytes) +
             " bytes expected; ranks disagree on the tensor size, dtype or op";
    }
    return what + " failed in the transport: " + p.request->error();
  }
  if (p.is_recv && p.request->received_bytes() != p.expected_bytes) {
    return what + ": rank " + std::to_string(p.peer) + " sent " + std::to_string(p.request->received_bytes()) +
           " bytes, this rank expected " + std::to_string(p.expected_bytes) +
           "; ranks disagree on the tensor size, dtype or op";
  }
  return {};
}

void Comm::wait(std::vector<Pending>& pending) {
  Backoff backoff;
  size_t next = 0;
  while (next < pending.size()) {
    if (aborted_) fail("aborted: " + abort_reason_, -1);
    Pending& p = pending[next];
    if (p.request->done()) {
      const std::string problem = check(p, p.is_recv ? "receive" : "send");
      if (!problem.empty()) fail(problem, p.peer);
      ++next;
      backoff.reset();
      continue;
    }
    if (poll()) {
      backoff.reset();
      continue;
    }
    if (Clock::now() > deadline_) {
      fail(std::string("timed out waiting to ") + (p.is_recv ? "receive from" : "send to") +
               " a peer; it may have died or not called this collective",
           p.peer);
    }
    backoff.pause();
  }
}

void Comm::wait(Pending& one) {
  std::vector<Pending> v;
  v.push_back(std::move(one));
  wait(v);
}

void Comm::post_send(int peer, int user_tag, const void* data, size_t bytes, std::chrono::milliseconds timeout,
                     P2pDone done) {
  Pending p{transport_->isend(peer, p2p_tag(rank(), user_tag), data, bytes), peer, bytes, false};
  background_.push_back({std::move(p), Clock::now() + timeout,
                         "send to rank " + std::to_string(peer) + " (tag " + std::to_string(user_tag) + ")",
                         std::move(done)});
}

void Comm::post_recv(int peer, int user_tag, void* data, size_t bytes, std::chrono::milliseconds timeout,
                     P2pDone done) {
  const uint64_t mask = peer < 0 ? ~kSourceMask : Transport::kFullMask;
  Pending p{transport_->irecv(peer, p2p_tag(peer < 0 ? 0 : peer, user_tag), mask, data, bytes), peer, bytes, true};
  background_.push_back({std::move(p), Clock::now() + timeout,
                         "receive from " + (peer < 0 ? std::string("any rank") : "rank " + std::to_string(peer)) +
                             " (tag " + std::to_string(user_tag) + ")",
                         std::move(done)});
}

bool Comm::poll() {
  bool progressed = transport_->progress();
  if (background_.empty()) return progressed;
  const auto now = Clock::now();
  for (auto it = background_.begin(); it != background_.end();) {
    std::string problem;
    int source = it->pending.peer;
    if (it->pending.request->done()) {
      problem = check(it->pending, it->what);
      if (it->pending.is_recv) source = int((it->pending.request->sender_tag() & kSourceMask) >> 16);
    } else if (aborted_) {
      problem = it->what + " aborted: " + abort_reason_;
    } else if (now > it->deadline) {
      problem = it->what + " timed out; the peer may have died or not posted the matching operation";
    } else {
      ++it;
      continue;
    }
    std::exception_ptr error;
    if (!problem.empty()) {
      error = std::make_exception_ptr(c10::DistBackendError(
          {__func__, __FILE__, uint32_t(__LINE__)},
          "cnccl: " + problem + " (group '" + group_name_ + "', rank " + std::to_string(rank()) + ")"));
    }
    auto done = std::move(it->done);
    it = background_.erase(it);
    done(error, source);
    progressed = true;
  }
  return progressed;
}

char* Comm::temp(size_t bytes) {
  if (bytes > temp_bytes_) {
    temp_.reset(new char[bytes]);
    temp_bytes_ = bytes;
  }
  return temp_.get();
}

void Comm::abort(const std::string& why) {
  std::lock_guard<std::mutex> lock(abort_mutex_);
  if (aborted_.load()) return;
  abort_reason_ = why;  // written before the flag is raised, so readers that see the flag see it
  aborted_.store(true);
}

}  // namespace cnccl::host

#include "backend/host/transport/comm.h"

#include <c10/util/Exception.h>

#include <thread>

#include "backend/host/transport/tags.h"
#include "backend/signature.h"

namespace cnccl::host {
namespace {

// The longest a waiting rank sleeps without looking at its deadline and abort flag.
constexpr std::chrono::milliseconds kMaxSleep{1};

// How long a rank whose message failed waits for a notice that explains why: the sender pushes
// its notices out before it fails, so they are in flight by then.
constexpr std::chrono::milliseconds kNoticeGrace{200};

}  // namespace

Comm::Comm(std::unique_ptr<Transport> transport, const std::string& group, const std::string& level)
    : transport_(std::move(transport)), group_("group '" + group + "'" + level) {
  TORCH_CHECK(transport_->size() <= tags::kMaxRanks, "cnccl: the host path supports at most ", tags::kMaxRanks,
              " ranks");
  if (size() > 1) {
    // One exact-match receive per peer: a wildcard receive makes UCX check every incoming message
    // against it, which cost small collectives 10x (bench/allreduce, ranks pinned to cores).
    notices_in_.resize(size());
    for (int peer = 0; peer < size(); ++peer) {
      if (peer == rank()) continue;
      notice_recvs_.push_back(transport_->irecv(peer, tags::notice(peer), Transport::kFullMask,
                                                notices_in_[peer].data(), kNoticeBytes));
    }
  }
}

Comm::~Comm() { transport_->quiesce(); }

void Comm::begin(const char* op, uint64_t seq, std::chrono::milliseconds timeout, const std::string& signature,
                 bool exchange_headers) {
  settle_headers();
  op_ = op;
  seq_ = seq;
  timeout_ = timeout;
  deadline_ = Clock::now() + timeout;
  if (size() == 1) return;
  const std::string text = fit_signature(std::string(op) + "(" + signature + ")", kHeaderBytes);
  if (!exchange_headers) {
    signature_hash_ = uint16_t(fnv1a(text) | 1);
    return;
  }
  header_out_.fill(0);
  text.copy(header_out_.data(), header_out_.size() - 1);
  signature_hash_ = 0;
  headers_.push_back(recv(left(), tags::kHeaderToRight, header_from_left_.data(), kHeaderBytes));
  headers_.push_back(recv(right(), tags::kHeaderToLeft, header_from_right_.data(), kHeaderBytes));
  headers_.push_back(send(right(), tags::kHeaderToRight, header_out_.data(), kHeaderBytes));
  headers_.push_back(send(left(), tags::kHeaderToLeft, header_out_.data(), kHeaderBytes));
  signature_hash_ = uint16_t(fnv1a(text) | 1);  // never 0, the headers' value
}

void Comm::end() { settle_headers(); }

void Comm::settle_headers() {
  if (headers_.empty()) return;
  std::vector<Pending> headers = std::move(headers_);
  headers_.clear();
  // The receives first: a peer that sees the disagreement fails and may tear down its transport
  // before this rank's header to it completes, and that send error would hide the cause.
  std::vector<Pending> sends;
  sends.push_back(std::move(headers[2]));
  sends.push_back(std::move(headers[3]));
  headers.resize(2);
  wait_all(headers);
  for (const auto& [theirs, peer] : {std::pair{&header_from_left_, left()}, std::pair{&header_from_right_, right()}}) {
    if (*theirs == header_out_) continue;
    const std::string what = "ranks disagree on this collective: rank " + std::to_string(rank()) + " called " +
                             header_out_.data() + ", rank " + std::to_string(peer) + " called " +
                             peer_text(theirs->data(), kHeaderBytes);
    notify_peers(what);
    fail(what, peer);
  }
  wait_all(sends);
}

void Comm::notify_peers(const std::string& what) {
  // Once: a disagreement this comm found is notified where found, and again by the failed call.
  if (!notice_sends_.empty()) return;
  notice_out_.fill(0);
  what.copy(notice_out_.data(), notice_out_.size() - 1);
  const uint64_t tag = tags::notice(rank());
  for (int peer = 0; peer < size(); ++peer) {
    // Not to a peer known dead: its send would never complete.
    if (peer == rank() || !peer_failure(peer).empty()) continue;
    // A peer whose connection fails must not hide the notice from the others.
    try {
      notice_sends_.push_back({transport_->isend(peer, tag, notice_out_.data(), notice_out_.size()), peer,
                               notice_out_.size(), false});
    } catch (const std::exception&) {
    }
  }
  // Not waited for here: the group's idle loop (Executor) polls this Comm while a notice is in flight
  // (has_background), as long as a peer may still wait for it: the failed collective's timeout.
  notices_until_ = Clock::now() + timeout_;
}

bool Comm::notices_in_flight() const {
  if (aborted_ || Clock::now() > notices_until_) return false;
  for (const auto& notice : notice_sends_) {
    if (!notice.request->done() && peer_failure(notice.peer).empty()) return true;
  }
  return false;
}

uint64_t Comm::collective_tag(int source, uint32_t slot) const {
  return tags::collective(seq_, signature_hash_, source, slot);
}

Pending Comm::send(int peer, uint32_t slot, const void* data, size_t bytes) {
  return {transport_->isend(peer, collective_tag(rank(), slot), data, bytes), peer, bytes, false};
}

Pending Comm::recv(int peer, uint32_t slot, void* data, size_t bytes) {
  return {transport_->irecv(peer, collective_tag(peer, slot), Transport::kFullMask, data, bytes), peer, bytes, true};
}

void Comm::fail(const std::string& what, int peer) const {
  std::string msg = "cnccl: " + std::string(op_) + " (seq " + std::to_string(seq_) + ", " + group_ + ", rank " +
                    std::to_string(rank()) + "/" + std::to_string(size()) + "): " + what;
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
  settle_headers();
  wait_all(pending);
}

void Comm::wait_all(std::vector<Pending>& pending) {
  size_t next = 0;
  while (next < pending.size()) {
    if (aborted_) fail("aborted: " + abort_reason_, -1);
    Pending& p = pending[next];
    if (p.request->done()) {
      const std::string problem = check(p, p.is_recv ? "receive" : "send");
      if (!problem.empty()) fail_after_notices(problem, p.peer);
      ++next;
      continue;
    }
    if (poll()) continue;
    check_notices();  // only when idle: it looks at one request per peer
    if (const std::string failure = peer_failure(p.peer); !failure.empty()) {
      fail_after_notices(std::string("cannot ") + (p.is_recv ? "receive from" : "send to") + " a peer: " + failure,
                         p.peer);
    }
    if (Clock::now() > deadline_) {
      fail(std::string("timed out waiting to ") + (p.is_recv ? "receive from" : "send to") +
               " a peer; it may have died or not called this collective",
           p.peer);
    }
    // Sleep in the kernel, not in a polling loop: a rank that polls or yields loses its core to
    // any busy process sharing it for a whole time slice, milliseconds after its message came
    // (bench/allreduce, 2 ranks beside two busy loops: 4K 3.1 ms -> 0.1 ms). Quiet runs measured
    // no slower than with a spin phase first, and 4 ranks on 2 cores slower with one.
    transport_->wait_for_activity(kMaxSleep);
  }
}

void Comm::fail_after_notices(const std::string& what, int peer) {
  // A rank that found a disagreement notifies every peer, fails, and may tear its transport down
  // at once; this rank's messages to it then fail with a transport error that hides the cause.
  // The notice was sent first, so a short wait for it reports the disagreement instead.
  const auto until = Clock::now() + kNoticeGrace;
  while (true) {
    check_notices();
    if (Clock::now() >= until) break;
    if (!transport_->progress()) transport_->wait_for_activity(kMaxSleep);
  }
  fail(what, peer);
}

std::string Comm::peer_failure(int peer) const {
  if (peer < 0) return {};
  if (exited_) {
    if (std::string why = exited_(peer); !why.empty()) return why;
  }
  const std::string failure = transport_->peer_failure(peer);
  return failure.empty() ? failure : "its connection failed (" + failure + "); it may have died";
}

void Comm::check_notices() const {
  for (const auto& r : notice_recvs_) {
    if (!r->done()) continue;
    const int from = tags::source_of(r->sender_tag());
    fail("rank " + std::to_string(from) + " reported: " + peer_text(notices_in_[from].data(), kNoticeBytes), from);
  }
}

void Comm::wait(Pending& one) {
  std::vector<Pending> v;
  v.push_back(std::move(one));
  wait(v);
}

void Comm::post_send(int peer, int user_tag, const void* data, size_t bytes, std::chrono::milliseconds timeout,
                     P2pDone done) {
  Pending p{transport_->isend(peer, tags::p2p(rank(), user_tag), data, bytes), peer, bytes, false};
  background_.push_back({std::move(p), Clock::now() + timeout,
                         "send to rank " + std::to_string(peer) + " (tag " + std::to_string(user_tag) + ")",
                         std::move(done)});
}

void Comm::post_recv(int peer, int user_tag, void* data, size_t bytes, std::chrono::milliseconds timeout,
                     P2pDone done) {
  const uint64_t mask = peer < 0 ? tags::kAnySourceMask : Transport::kFullMask;
  Pending p{transport_->irecv(peer, tags::p2p(peer < 0 ? 0 : peer, user_tag), mask, data, bytes), peer, bytes, true};
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
      if (it->pending.is_recv) source = tags::source_of(it->pending.request->sender_tag());
    } else if (aborted_) {
      problem = it->what + " aborted: " + abort_reason_;
    } else if (const std::string failure = progressed ? std::string() : peer_failure(it->pending.peer);
               !failure.empty()) {
      // Only once progress found nothing more: the rest of a message a peer sent before it
      // exited may still be arriving.
      problem = it->what + " failed: " + failure;
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
          "cnccl: " + problem + " (" + group_ + ", rank " + std::to_string(rank()) + ")" +
              (it->pending.peer >= 0 ? " [peer rank " + std::to_string(it->pending.peer) + "]" : "")));
    }
    auto done = std::move(it->done);
    it = background_.erase(it);
    done(error, source);
    progressed = true;
  }
  return progressed;
}

void Comm::abort(const std::string& why) {
  std::lock_guard<std::mutex> lock(abort_mutex_);
  if (aborted_.load()) return;
  abort_reason_ = why;  // written before the flag is raised, so readers that see the flag see it
  aborted_.store(true);
  transport_->wake();
}

}  // namespace cnccl::host

// What the host algorithms talk through: a Transport plus tags, deadlines and error reporting
// for the collective in flight. Owned and used by one executor thread.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "backend/host/transport/scratch.h"
#include "backend/host/transport/transport.h"

namespace cnccl::host {

using Clock = std::chrono::steady_clock;

// One message of a collective: the request and what the algorithm expected of it.
struct Pending {
  std::unique_ptr<Request> request;
  int peer;
  size_t expected_bytes;  // receives: the size the sender must have sent
  bool is_recv;
};

class Comm {
 public:
  // `group` names the process group in messages; `level` says which of its ranks this Comm joins
  // when not all of them (e.g. one per host), and what its rank numbers count.
  Comm(std::unique_ptr<Transport> transport, const std::string& group, const std::string& level = {});
  // Quiesces the transport before anything a message may still use is released.
  ~Comm();
  Comm(const Comm&) = delete;
  Comm& operator=(const Comm&) = delete;

  int rank() const { return transport_->rank(); }
  int size() const { return transport_->size(); }
  int left() const { return (rank() + size() - 1) % size(); }
  int right() const { return (rank() + 1) % size(); }
  uint64_t bytes_sent() const { return transport_->bytes_sent(); }

  // Starts a collective: its name and sequence number go into tags and error messages.
  // `signature` is what every rank must agree on (sizes, dtype, op...): it travels as a small
  // header to both ring neighbours, and the first wait() (or end()) compares what arrived, so a
  // disagreement is an error naming both sides rather than a wrong tensor or a hang.
  // With `exchange_headers` false the ranks have agreed on the signature elsewhere (ShmComm).
  void begin(const char* op, uint64_t seq, std::chrono::milliseconds timeout, const std::string& signature,
             bool exchange_headers = true);
  // Settles the collective's headers (for a body that waited on nothing, or on nothing more).
  void end();
  // Tells every other rank why this one failed its collective (a disagreement it found, or any failure):
  // their waits fail with it at once instead of at the deadline. Returns at once: the notices are in
  // flight (has_background) until sent, their peer is known dead, abort(), or the collective's timeout.
  void notify_peers(const std::string& what);

  // Collective messages of the current operation; `slot` tells apart the messages one pair of
  // ranks exchanges within it (ring steps, phases).
  Pending send(int peer, uint32_t slot, const void* data, size_t bytes);
  Pending recv(int peer, uint32_t slot, void* data, size_t bytes);
  // Progresses until all are done; throws DistBackendError (naming the op, seq and group) on a
  // transport error, a size disagreement, the deadline, or abort().
  void wait(std::vector<Pending>& pending);
  void wait(Pending& one);

  // Point-to-point messages run in the background: posted now, completed by the progress loop
  // (so a rank may post a receive before its matching send without deadlock). `done` gets the
  // error (or nullptr) and the source rank.
  using P2pDone = std::function<void(std::exception_ptr, int source)>;
  void post_send(int peer, int user_tag, const void* data, size_t bytes, std::chrono::milliseconds timeout,
                 P2pDone done);
  void post_recv(int peer, int user_tag, void* data, size_t bytes, std::chrono::milliseconds timeout, P2pDone done);
  // Point-to-point messages or notices in flight: someone must poll().
  bool has_background() const { return !background_.empty() || notices_in_flight(); }
  // Advances the transport and completes finished point-to-point messages.
  bool poll();
  // Sleeps until a message may have arrived, wake() is called, or `limit` has passed (a background
  // message's deadline is checked by the next poll()).
  void wait_for_activity(std::chrono::microseconds limit) { transport_->wait_for_activity(limit); }
  // Ends a wait_for_activity() on another thread. Any thread may call it.
  void wake() { transport_->wake(); }

  // The group's reusable buffers (the path's workspace, staging, and the algorithms' own).
  Scratch& scratch() { return scratch_; }

  // After abort() every wait throws, now and later.
  void abort(const std::string& why);
  bool aborted() const { return aborted_.load(); }

  // Asks `exited(peer)` ("" while the peer lives) whenever a wait is idle, besides the transport's
  // own view: on one host a pidfd sees a death at once, where UCX may not see it at all.
  void watch_peers(std::function<std::string(int peer)> exited) { exited_ = std::move(exited); }

  // Keeps `owner` (a failed collective's tensors) alive until the transport has been quiesced: a
  // message of a failed collective may still be moving into or out of its buffers, and the caller
  // may free them as soon as the work has failed.
  void keep_until_quiesced(std::shared_ptr<void> owner) { kept_.push_back(std::move(owner)); }

 private:
  struct Background {
    Pending pending;
    Clock::time_point deadline;
    std::string what;
    P2pDone done;
  };

  static constexpr size_t kHeaderBytes = 256;
  static constexpr size_t kNoticeBytes = 1024;
  using Header = std::array<char, kHeaderBytes>;

  uint64_t collective_tag(int source, uint32_t slot) const;
  [[noreturn]] void fail(const std::string& what, int peer) const;
  std::string check(const Pending& p, const std::string& what) const;
  void wait_all(std::vector<Pending>& pending);
  void settle_headers();
  // Fails with a notice another rank sent, if one has arrived.
  void check_notices() const;
  bool notices_in_flight() const;
  // Fails with `what`, or with a notice that arrives within a short grace and explains it.
  [[noreturn]] void fail_after_notices(const std::string& what, int peer);
  // Why messages with `peer` cannot complete ("" while they can): its process exited, or the
  // transport saw its connection fail.
  std::string peer_failure(int peer) const;

  // Declared in the order that destroys, after ~Comm has quiesced the transport, first the
  // requests, then the transport (its worker), then the buffers messages used: never a buffer
  // while a message may still touch it.
  std::vector<std::shared_ptr<void>> kept_;
  Scratch scratch_;
  Header header_out_{}, header_from_left_{}, header_from_right_{};
  std::array<char, kNoticeBytes> notice_out_{};
  std::vector<std::array<char, kNoticeBytes>> notices_in_;  // by source rank
  std::unique_ptr<Transport> transport_;
  std::list<Background> background_;
  std::vector<Pending> headers_;  // of the collective in flight, until settled
  std::vector<std::unique_ptr<Request>> notice_recvs_;
  std::vector<Pending> notice_sends_;
  Clock::time_point notices_until_;
  std::string group_;  // "group 'name'" and the level, for messages
  const char* op_ = "";
  uint64_t seq_ = 0;
  std::chrono::milliseconds timeout_{0};
  Clock::time_point deadline_;
  uint16_t signature_hash_ = 0;  // of the collective in flight, in its data messages' tags
  std::function<std::string(int)> exited_;
  std::mutex abort_mutex_;
  std::atomic<bool> aborted_{false};
  std::string abort_reason_;
};

}  // namespace cnccl::host

// The host path's view of the network: tagged, non-blocking point-to-point messages between the
// ranks of one group. One implementation today (UCX); algorithms only see this interface.
// Not thread-safe: one thread (the group's executor) owns a transport after construction.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace cnccl::host {

class Request {
 public:
  virtual ~Request() = default;
  // True once the operation finished, successfully or not.
  virtual bool done() const = 0;
  // Empty when it succeeded, else what went wrong.
  virtual const std::string& error() const = 0;
  // For receives: the bytes that arrived and the tag they carried.
  virtual size_t received_bytes() const = 0;
  virtual uint64_t sender_tag() const = 0;
  // Asks the transport to drop a receive that has not matched yet; harmless once done.
  virtual void cancel() = 0;
};

class Transport {
 public:
  static constexpr uint64_t kFullMask = ~uint64_t{0};

  virtual ~Transport() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // `data` must stay valid until the request is done (or the transport is quiesced).
  virtual std::unique_ptr<Request> isend(int peer, uint64_t tag, const void* data, size_t bytes) = 0;
  // Matches a message whose tag equals `tag` on the bits set in `mask`; peer < 0 means any peer.
  virtual std::unique_ptr<Request> irecv(int peer, uint64_t tag, uint64_t mask, void* data, size_t bytes) = 0;
  // Advances communication; returns true if anything happened.
  virtual bool progress() = 0;
  // Sleeps until the network may have something for progress(), wake() is called, or `limit` has
  // passed; may return early. Call it only after progress() returned false.
  virtual void wait_for_activity(std::chrono::microseconds limit) = 0;
  // Ends a wait_for_activity() in progress, or the next one. Any thread may call it.
  virtual void wake() {}
  // Payload bytes handed to isend since creation (the wire traffic this rank originated).
  virtual uint64_t bytes_sent() const = 0;
  // Why messages to and from `peer` can no longer complete (its process died, its connection
  // broke), or "" while it can. A receive from a failed peer never completes by itself.
  virtual std::string peer_failure(int /*peer*/) const { return {}; }
  // Pushes out what is queued, then ends what a failed collective left in flight, as far as the
  // transport can; receives still posted end when their requests are destroyed. Call it before
  // destroying the requests, then destroy the transport, and only then the buffers they used.
  virtual void quiesce() {}
  virtual std::string describe() const = 0;
};

}  // namespace cnccl::host

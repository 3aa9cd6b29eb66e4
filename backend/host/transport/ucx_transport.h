// Transport over UCX's ucp tag API. Worker addresses are exchanged through the c10d Store of the
// group; one endpoint per peer. Every endpoint has an error callback that records the failure, so
// that a peer that dies fails this rank's messages instead of aborting the process: with none,
// UCX 1.13 calls ucs_fatal when a CMA read finds its peer gone (docs/design.md, "Two paths").
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>
#include <ucp/api/ucp.h>

#include <memory>
#include <string>
#include <vector>

#include "backend/host/transport/transport.h"

namespace cnccl::host {

// Whether a UCX_TLS setting (nullptr: unset) leaves UCX nothing but TCP between ranks, where the
// transport turns rendezvous off (UCX_RNDV_THRESH=inf: ucx_transport.cpp, shared_context).
bool tcp_on_every_lane(const char* ucx_tls);

class UcxTransport final : public Transport {
 public:
  UcxTransport(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size);
  ~UcxTransport() override;
  UcxTransport(const UcxTransport&) = delete;
  UcxTransport& operator=(const UcxTransport&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::unique_ptr<Request> isend(int peer, uint64_t tag, const void* data, size_t bytes) override;
  std::unique_ptr<Request> irecv(int peer, uint64_t tag, uint64_t mask, void* data, size_t bytes) override;
  bool progress() override;
  void wait_for_activity(std::chrono::microseconds limit) override;
  void wake() override;
  uint64_t bytes_sent() const override { return bytes_sent_; }
  std::string describe() const override;
  std::string peer_failure(int peer) const override;
  void quiesce() override;

  // What UCX's error callback for one endpoint writes into (on the thread that progresses).
  struct Peer {
    ucp_ep_h ep = nullptr;
    std::string failure;
  };

 private:
  int rank_;
  int size_;
  std::shared_ptr<ucp_context> context_;
  ucp_worker_h worker_ = nullptr;
  int event_fd_ = -1;  // readable when the worker has events; -1 if UCX offers none
  std::vector<std::unique_ptr<Peer>> peers_;  // by rank; the callback holds their addresses
  bool quiesced_ = false;
  uint64_t bytes_sent_ = 0;
  uint64_t large_sends_ = 0, kill_at_large_send_ = 0;  // fault_injection.h
};

}  // namespace cnccl::host

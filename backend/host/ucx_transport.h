// Transport over UCX's ucp tag API. Worker addresses are exchanged through the c10d Store of the
// group; one endpoint per peer. Error handling mode is NONE (shared memory in UCX 1.13 cannot do
// PEER mode), so dead peers are detected by the caller's timeouts, not by UCX.
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>
#include <ucp/api/ucp.h>

#include <vector>

#include "backend/host/transport.h"

namespace cnccl::host {

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
  uint64_t bytes_sent() const override { return bytes_sent_; }
  std::string describe() const override;

 private:
  int rank_;
  int size_;
  std::shared_ptr<ucp_context> context_;
  ucp_worker_h worker_ = nullptr;
  int event_fd_ = -1;  // readable when the worker has events; -1 if UCX offers none
  std::vector<ucp_ep_h> endpoints_;
  uint64_t bytes_sent_ = 0;
};

}  // namespace cnccl::host

#include "backend/host/transport/ucx_transport.h"

#include <c10/util/Exception.h>

#include <poll.h>

#include <chrono>
#include <cstdlib>
#include <algorithm>
#include <mutex>
#include <string>
#include <thread>

#include "backend/host/fault_injection.h"

namespace cnccl::host {

bool tcp_on_every_lane(const char* ucx_tls) {
  if (!ucx_tls || !*ucx_tls) return false;  // UCX's default: shared memory and cma on the host, RDMA if any
  std::string list(ucx_tls);
  for (size_t from = 0; from <= list.size();) {
    const size_t comma = std::min(list.find(',', from), list.size());
    const std::string name = list.substr(from, comma - from);
    // "self" carries a rank's messages to itself only; anything else (an exclusion list too) may be
    // shared memory or RDMA.
    if (name != "tcp" && name != "self") return false;
    from = comma + 1;
  }
  return true;
}

namespace {

void check_ucs(ucs_status_t status, const char* what) {
  if (status != UCS_OK) {
    C10_THROW_ERROR(DistBackendError, std::string("cnccl: UCX ") + what + " failed: " + ucs_status_string(status));
  }
}

// One UCX context per process, shared by every group's worker: contexts are heavy (they map
// shared memory and probe devices) and a job may create many groups.
std::shared_ptr<ucp_context> shared_context() {
  static std::mutex mutex;
  static std::weak_ptr<ucp_context> weak;
  std::lock_guard<std::mutex> lock(mutex);
  if (auto ctx = weak.lock()) return ctx;
  ucp_config_t* config = nullptr;
  check_ucs(ucp_config_read(nullptr, nullptr, &config), "config read");
  // Every group has its own worker, and UCX's shared-memory transports (posix and sysv) each give
  // a worker 512 receive buffers of 8 KiB up front: 6 MiB of shared and 3 MiB of private memory a
  // rank per group. Pools of 64 grow on demand just the same (UCX_*_RX_MAX_BUFS is unlimited);
  // bench/group_memory.py measures what a group costs. A user's own setting wins. Where every lane is
  // TCP no shared-memory transport loads, and UCX warns on every worker that the setting is invalid.
  const bool tcp_only = tcp_on_every_lane(std::getenv("UCX_TLS"));
  if (!tcp_only && !std::getenv("UCX_MM_RX_BUFS_GROW") && !std::getenv("UCX_POSIX_RX_BUFS_GROW") &&
      !std::getenv("UCX_SYSV_RX_BUFS_GROW")) {
    ucp_config_modify(config, "MM_RX_BUFS_GROW", "64");
  }
  // Over TCP a rendezvous costs a control message each way, and in a ring each one queues behind
  // the megabytes of the step's data flowing the other way in the same socket: the link idled a
  // third of the time (docs/benchmarks.md, "Across a link"). Eager messages stream with no
  // handshake. UCX 1.13 has one threshold for every lane, so only where every lane is TCP: over
  // shared memory and RDMA a rendezvous is zero-copy and stays. A user's own setting wins.
  if (!std::getenv("UCX_RNDV_THRESH") && tcp_only) {
    ucp_config_modify(config, "RNDV_THRESH", "inf");
  }
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED | UCP_PARAM_FIELD_NAME;
  // WAKEUP lets a waiting rank sleep in the kernel until a message arrives instead of polling.
  params.features = UCP_FEATURE_TAG | UCP_FEATURE_WAKEUP;
  params.mt_workers_shared = 1;
  params.name = "cnccl";
  ucp_context_h raw = nullptr;
  const ucs_status_t status = ucp_init(&params, config, &raw);
  ucp_config_release(config);
  check_ucs(status, "init");
  std::shared_ptr<ucp_context> ctx(raw, ucp_cleanup);
  weak = ctx;
  return ctx;
}

// State a UCX callback writes into. ucp_request_free stops further callbacks, so it can live
// exactly as long as the request object.
struct Completion {
  bool done = false;
  std::string error;
  size_t length = 0;
  uint64_t tag = 0;
};

void on_send(void* /*request*/, ucs_status_t status, void* user) {
  auto* c = static_cast<Completion*>(user);
  if (status != UCS_OK) c->error = ucs_status_string(status);
  c->done = true;
}

void on_recv(void* /*request*/, ucs_status_t status, const ucp_tag_recv_info_t* info, void* user) {
  auto* c = static_cast<Completion*>(user);
  if (status == UCS_OK) {
    c->length = info->length;
    c->tag = info->sender_tag;
  } else {
    c->error = ucs_status_string(status);
  }
  c->done = true;
}

class UcxRequest final : public Request {
 public:
  UcxRequest(ucp_worker_h worker, void* handle, std::unique_ptr<Completion> completion)
      : worker_(worker), handle_(handle), completion_(std::move(completion)) {}
  ~UcxRequest() override {
    // An unfinished request belongs to a failed collective: a receive is cancelled so it never
    // writes into a buffer its owner is about to release.
    cancel();
    ucp_request_free(handle_);
  }
  bool done() const override { return completion_->done; }
  const std::string& error() const override { return completion_->error; }
  size_t received_bytes() const override { return completion_->length; }
  uint64_t sender_tag() const override { return completion_->tag; }
  void cancel() override {
    if (!completion_->done) ucp_request_cancel(worker_, handle_);
  }

 private:
  ucp_worker_h worker_;
  void* handle_;
  std::unique_ptr<Completion> completion_;
};

void on_peer_error(void* arg, ucp_ep_h /*ep*/, ucs_status_t status) {
  auto* peer = static_cast<UcxTransport::Peer*>(arg);
  if (peer->failure.empty()) peer->failure = ucs_status_string(status);
}

// Progresses `worker` until none of `requests` is in progress, or `limit` has passed; frees them.
void progress_until_done(ucp_worker_h worker, std::vector<void*>& requests, std::chrono::seconds limit) {
  const auto until = std::chrono::steady_clock::now() + limit;
  auto pending = [&] {
    for (void* r : requests) {
      if (ucp_request_check_status(r) == UCS_INPROGRESS) return true;
    }
    return false;
  };
  while (pending() && std::chrono::steady_clock::now() < until) {
    // A peer that is gone answers nothing: sleep between rounds rather than spin out the limit.
    if (!ucp_worker_progress(worker)) std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  for (void* r : requests) ucp_request_free(r);
  requests.clear();
}

std::unique_ptr<Request> wrap(ucp_worker_h worker, ucs_status_ptr_t handle, std::unique_ptr<Completion> c,
                              const char* what) {
  if (UCS_PTR_IS_ERR(handle)) {
    C10_THROW_ERROR(DistBackendError,
                    std::string("cnccl: UCX ") + what + " failed: " + ucs_status_string(UCS_PTR_STATUS(handle)));
  }
  return std::make_unique<UcxRequest>(worker, handle, std::move(c));
}

}  // namespace

UcxTransport::UcxTransport(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size)
    : rank_(rank),
      size_(size),
      context_(shared_context()),
      kill_at_large_send_(fault_injection::kill_at(fault_injection::kLargeSend, rank)) {
  ucp_worker_params_t wparams{};
  wparams.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wparams.thread_mode = UCS_THREAD_MODE_SINGLE;
  check_ucs(ucp_worker_create(context_.get(), &wparams, &worker_), "worker create");
  if (ucp_worker_get_efd(worker_, &event_fd_) != UCS_OK) event_fd_ = -1;

  ucp_address_t* address = nullptr;
  size_t address_length = 0;
  check_ucs(ucp_worker_get_address(worker_, &address, &address_length), "worker address");
  const auto* bytes = reinterpret_cast<const uint8_t*>(address);
  store->set("cnccl/ucx/" + std::to_string(rank), std::vector<uint8_t>(bytes, bytes + address_length));
  ucp_worker_release_address(worker_, address);

  for (int peer = 0; peer < size; ++peer) peers_.push_back(std::make_unique<Peer>());
  for (int peer = 0; peer < size; ++peer) {
    if (peer == rank) continue;
    const std::vector<uint8_t> remote = store->get("cnccl/ucx/" + std::to_string(peer));
    ucp_ep_params_t eparams{};
    eparams.field_mask =
        UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER;
    eparams.address = reinterpret_cast<const ucp_address_t*>(remote.data());
    // Mode NONE keeps UCX's fastest transports on one host (CMA, which PEER mode excludes); the
    // callback alone keeps a failure from being fatal (ucp_ep.c, ucp_ep_set_failed, UCX 1.13.1).
    // PEER mode tripped UCX's own assertion on remote endpoint ids (ucp_ep.inl) when a peer tore
    // its group down after a disagreement.
    eparams.err_mode = UCP_ERR_HANDLING_MODE_NONE;
    eparams.err_handler.cb = on_peer_error;
    eparams.err_handler.arg = peers_[peer].get();
    check_ucs(ucp_ep_create(worker_, &eparams, &peers_[peer]->ep), "endpoint create");
  }
  // No rank leaves before every rank has connected: a group created and destroyed at once would
  // otherwise tear down a worker a slower peer is still connecting to.
  store->set("cnccl/ucx/connected/" + std::to_string(rank), std::vector<uint8_t>{1});
  std::vector<std::string> connected;
  for (int peer = 0; peer < size; ++peer) connected.push_back("cnccl/ucx/connected/" + std::to_string(peer));
  store->wait(connected);
}

UcxTransport::~UcxTransport() {
  quiesce();
  if (worker_) ucp_worker_destroy(worker_);
}

void UcxTransport::quiesce() {
  if (quiesced_ || !worker_) return;
  quiesced_ = true;
  // A send reported complete may still sit in a transport's queue (the last message of a collective
  // that succeeded, a rendezvous acknowledgement): a flush pushes it out first, bounded since a
  // peer may be gone. Then forced closes, where UCX takes them, discard what is left without
  // waiting on anyone, and a second flush completes once the discards have. Buffers go only after
  // the worker is destroyed (Comm's member order): a transfer left running writes on until then.
  std::vector<void*> requests;
  auto flush = [&](std::chrono::seconds limit) {
    ucp_request_param_t param{};
    const ucs_status_ptr_t flushing = ucp_worker_flush_nbx(worker_, &param);
    if (UCS_PTR_IS_PTR(flushing)) requests.push_back(flushing);
    progress_until_done(worker_, requests, limit);
  };
  flush(std::chrono::seconds(1));
  for (auto& peer : peers_) {
    if (!peer->ep) continue;
    ucp_request_param_t param{};
    param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    param.flags = UCP_EP_CLOSE_FLAG_FORCE;
    const ucs_status_ptr_t closing = ucp_ep_close_nbx(peer->ep, &param);
    if (UCS_PTR_IS_PTR(closing)) requests.push_back(closing);
    peer->ep = nullptr;
  }
  progress_until_done(worker_, requests, std::chrono::seconds(5));
  flush(std::chrono::seconds(5));
}

std::string UcxTransport::peer_failure(int peer) const {
  if (peer < 0 || peer >= size_ || peer == rank_) return {};
  return peers_[peer]->failure;
}

std::unique_ptr<Request> UcxTransport::isend(int peer, uint64_t tag, const void* data, size_t bytes) {
  TORCH_CHECK(!quiesced_, "cnccl: a send on a UCX transport that was quiesced");
  auto completion = std::make_unique<Completion>();
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
  param.cb.send = on_send;
  param.user_data = completion.get();
  bytes_sent_ += bytes;
  auto request = wrap(worker_, ucp_tag_send_nbx(peers_.at(peer)->ep, data, bytes, tag, &param),
                      std::move(completion), "tag send");
  if (bytes >= fault_injection::kLargeSendBytes) fault_injection::count(large_sends_, kill_at_large_send_);
  return request;
}

std::unique_ptr<Request> UcxTransport::irecv(int /*peer*/, uint64_t tag, uint64_t mask, void* data, size_t bytes) {
  // The source rank is encoded in the tag (see comm.h), so matching needs no endpoint.
  auto completion = std::make_unique<Completion>();
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
  param.cb.recv = on_recv;
  param.user_data = completion.get();
  return wrap(worker_, ucp_tag_recv_nbx(worker_, data, bytes, tag, mask, &param), std::move(completion), "tag recv");
}

bool UcxTransport::progress() { return ucp_worker_progress(worker_) != 0; }

void UcxTransport::wait_for_activity(std::chrono::microseconds limit) {
  if (event_fd_ < 0) {
    std::this_thread::sleep_for(limit);
    return;
  }
  // BUSY means events arrived since the last progress(): the caller should progress, not sleep.
  if (ucp_worker_arm(worker_) != UCS_OK) return;
  pollfd fd{event_fd_, POLLIN, 0};
  const long long ns = std::chrono::nanoseconds(limit).count();
  const timespec timeout{time_t(ns / 1000000000), long(ns % 1000000000)};
  ppoll(&fd, 1, &timeout, nullptr);
}

// UCX documents ucp_worker_signal as safe from any thread, whatever the worker's thread mode.
void UcxTransport::wake() { ucp_worker_signal(worker_); }

std::string UcxTransport::describe() const {
  return "UCX " + std::string(ucp_get_version_string()) + " rank " + std::to_string(rank_) + "/" +
         std::to_string(size_);
}

}  // namespace cnccl::host

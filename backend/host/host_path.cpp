// The host path's lifecycle, its funnel and point-to-point messages. The collectives are in
// reductions.cpp and data_movement.cpp.
#include "backend/host/host_path.h"

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include <unistd.h>

#include <chrono>

#include "backend/checks.h"
#include "backend/errors.h"
#include "backend/host/executor.h"
#include "backend/host/shm/shm_algorithms.h"
#include "backend/host/shm/shm_comm.h"
#include "backend/host/transport/comm.h"
#include "backend/peer_processes.h"
#if CNCCL_WITH_UCX
#include "backend/host/transport/ucx_transport.h"
#endif

namespace cnccl::host {
namespace {

// Adds the time since construction (or the last lap) to a counter on lap().
class PhaseTimer {
 public:
  void lap(std::atomic<uint64_t>& into) {
    const auto now = std::chrono::steady_clock::now();
    into += uint64_t(std::chrono::duration_cast<std::chrono::nanoseconds>(now - start_).count());
    start_ = now;
  }

 private:
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
};

// `fn` that also adds its own time to `into`.
template <typename... Args>
std::function<void(Args...)> timed(std::function<void(Args...)> fn, std::atomic<uint64_t>& into) {
  return [fn = std::move(fn), &into](Args... args) {
    PhaseTimer t;
    fn(args...);
    t.lap(into);
  };
}

// Options never select the host path in a build without UCX (options.cpp); this is the backstop.
std::unique_ptr<Transport> make_ucx_transport(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size) {
#if CNCCL_WITH_UCX
  return std::make_unique<UcxTransport>(store, rank, size);
#else
  TORCH_CHECK_VALUE(false, "cnccl: cpu_engine=ucx needs UCX, and this build has none (CNCCL_WITH_UCX=OFF)");
#endif
}

}  // namespace

HostPath::HostPath(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size, std::string group_name,
                   const Config& config, std::chrono::milliseconds timeout, Stats& stats)
    : c10d::Backend(rank, size), config_(config), timeout_(timeout), stats_(stats) {
  comm_ = std::make_unique<Comm>(make_ucx_transport(store, rank, size), group_name);
  if (size > 1) {
    host_peers_ = same_host_peers(*store, rank, size);
    comm_->watch_peers([this](int peer) { return exited(host_peers_, peer); });
  }
  if (size > 1) {
    shm_ = ShmComm::connect(*store, rank, size, group_name, config.shm != ShmMode::kOff, &no_shm_because_);
    TORCH_CHECK(shm_ || config.shm != ShmMode::kOn, "cnccl: CNCCL_SHM=on, but the ranks cannot share memory: ",
                no_shm_because_);
    if (shm_ && shm_->hosts().size() > 1) {
      // Its own UCX worker, so its tags never meet the group's.
      const std::string prefix = "cnccl/across_hosts/" + std::to_string(shm_->rank()) + "/";
      auto across = c10::make_intrusive<c10d::PrefixStore>(prefix, store);
      auto transport = make_ucx_transport(across, shm_->host(), int(shm_->hosts().size()));
      cross_ = std::make_unique<Comm>(std::move(transport), group_name,
                                      " across hosts (local rank " + std::to_string(shm_->rank()) +
                                          " of each; its ranks number hosts)");
    }
  } else {
    no_shm_because_ = "a single rank";
  }
  if (config_.per_level() && shared_memory() != SharedMemory::kPerHost) {
    // One host has no link for the inter-host wire: wire_dtype is its only level. Hosts whose ranks
    // do not share memory (one rank each, uneven, CNCCL_SHM=off) have no level inside a host to keep apart.
    TORCH_CHECK_VALUE(host_peers_.size() + 1 == size_t(size), "cnccl: inter_host_wire=", config_.wire_across_name(),
                      " differs from wire_dtype=", config_.wire_name(), ", but the ranks of group '", group_name,
                      "' do not share memory within each host (", no_shm_because_, "): it has no level inside a ",
                      "host; set wire_dtype=", config_.wire_across_name(), " for every link, or unset ",
                      "CNCCL_INTER_HOST_WIRE (Options.inter_host_wire)");
    config_.inter_host_wire.reset();
  }
  executor_ = std::make_shared<Executor>(*comm_, cross_.get());
  executor_id_ = executor_.get();
}

HostPath::~HostPath() { shutdown(); }

uint64_t HostPath::transport_bytes_sent() const {
  return comm_->bytes_sent() + (cross_ ? cross_->bytes_sent() : 0) + (shm_ ? shm_->bytes_published() : 0);
}

std::string HostPath::wire_levels() const {
  if (!config_.per_level()) return config_.wire_name() + " on every link";
  return config_.wire_name() + " inside each host, " + config_.wire_across_name() + " across " +
         std::to_string(cross_->size()) + " hosts";
}

SharedMemory HostPath::shared_memory() const {
  if (!shm_) return SharedMemory::kNone;
  return cross_ ? SharedMemory::kPerHost : SharedMemory::kOneHost;
}

std::string HostPath::transport() const {
  switch (shared_memory()) {
    case SharedMemory::kOneHost: return "shm";
    case SharedMemory::kPerHost:
      return "shm within each host, ucx across " + std::to_string(shm_->hosts().size()) + " hosts";
    default: return "ucx (" + no_shm_because_ + ")";
  }
}

void HostPath::abort() {
  comm_->abort("abort() was called on the process group");
  if (shm_) shm_->abort("abort() was called on the process group");
  if (cross_) cross_->abort("abort() was called on the process group");
}

void HostPath::shutdown() {
  {
    std::unique_lock<std::mutex> lock(shutdown_mutex_);
    if (shutdown_started_) {
      // Another thread shuts down (or did): it joins the executor's threads, so one of them (a
      // callback that shuts the group down) returns at once, and any other waits until it is done,
      // as the group may be destroyed when it returns.
      if (!Executor::on_own_thread(executor_id_)) shutdown_cv_.wait(lock, [&] { return shutdown_done_; });
      return;
    }
    shutdown_started_ = true;
  }
  // As with NCCL: operations still outstanding end with an error instead of waiting on peers.
  comm_->abort("shutdown() was called on the process group");
  if (shm_) shm_->abort("shutdown() was called on the process group");
  if (cross_) cross_->abort("shutdown() was called on the process group");
  executor_->stop();
  executor_.reset();
  rotation_copies_.clear();
  // Notified under the lock: a waiter may destroy the group as soon as it returns.
  std::lock_guard<std::mutex> lock(shutdown_mutex_);
  shutdown_done_ = true;
  shutdown_cv_.notify_all();
}

c10::intrusive_ptr<c10d::Work> HostPath::submit(Call call, std::vector<Step> steps) {
  TORCH_CHECK(executor_, "cnccl ", call.name, ": the process group has been shut down");
  TORCH_INTERNAL_ASSERT(steps.size() == call.signatures.size(), "cnccl ", call.name, ": one step per signature");
  for (const auto& t : call.traffic) stats_.record(t);
  const uint64_t seq = seq_.fetch_add(steps.size());
  auto work = c10::make_intrusive<HostWork>(rank_, call.type, seq, call.outputs);
  profile_collective(call.type, call.outputs, call.wire(), work->getFuture());
  const bool here = runs_on_caller_thread(call.async_op);
  std::function<void()> job = [this, work, seq, call = std::move(call), steps = std::move(steps)] {
    const bool posts = broken_.empty();  // a broken group fails the call before any message
    const auto began = std::chrono::steady_clock::now();
    if (!Executor::on_own_thread(executor_id_)) stats_.caller_thread_collectives += 1;
    const CastCensus census(&stats_, config_.telemetry);  // one for the call: a coalesced one is many steps
    try {
      if (!broken_.empty()) {
        throw errors::backend_error(std::string("cnccl ") + call.name + " (seq " + std::to_string(seq) +
                                    "): the group is unusable after an earlier failure: " + broken_);
      }
      for (size_t i = 0; i < steps.size(); ++i) {
        // Where every rank shares memory, ranks agree on the signature there; else over UCX.
        const std::string signature = i == 0 ? call.signature() : call.signatures[i];
        if (shm_) shm_->begin(call.name, seq + i, call.timeout, signature);
        if (all_on_shm() && !steps[i].on_shm) shm_->agree();
        comm_->begin(call.name, seq + i, call.timeout, signature, /*exchange_headers=*/!all_on_shm());
        if (cross_) cross_->begin(call.name, seq + i, call.timeout, signature, /*exchange_headers=*/false);
        run(steps[i]);
      }
      comm_->end();
      executor_->defer([work] { work->complete(); });
    } catch (const std::exception& e) {
      const std::string what = errors::message_of(e);
      if (broken_.empty()) broken_ = what;
      // Only a call that began (a broken group's fails before it, on the last collective's number). Every
      // rank learns it at its next wait on this one, in this call or a later one (a call may fail on some
      // ranks only): in shared memory, on the group's Comm, and across hosts, where only a notice
      // reaches a rank that waits on the per-host Comm. Not after abort() or shutdown(): this rank stops,
      // the others are not told to (docs/design.md, "A rank that fails alone").
      if (posts && !comm_->aborted()) {
        if (shm_) shm_->publish_failure(what);
        comm_->notify_peers(what);
        if (cross_) cross_->notify_peers(what);
      }
      // The steps hold every tensor the call's messages read or write.
      if (posts) comm_->keep_until_quiesced(std::make_shared<std::vector<Step>>(steps));
      const char* left = call.on_failure;
      for (const Step& s : steps) {
        if (s.wrote_results && *s.wrote_results) left = kPartialResults;
      }
      // How long it waited, truthfully: a dead peer is seen at once, long before the timeout.
      const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - began);
      auto error = std::make_exception_ptr(
          errors::backend_error(what + " (after " + std::to_string(ms.count()) + " ms in the call; " + left + ")"));
      executor_->defer([work, error] { work->fail(error); });
    }
  };
  if (here && executor_->run_here(job)) return work;
  const uint64_t ticket = executor_->submit(std::move(job));
  work->set_helper([executor = std::weak_ptr<Executor>(executor_), ticket] {
    if (auto e = executor.lock()) e->help(ticket);
  });
  return work;
}

void HostPath::run(const Step& step) {
  Scratch& scratch = comm_->scratch();
  const Buffers buffers{scratch.workspace(step.workspace_bytes), scratch.staging(step.staging_bytes)};
  PhaseTimer timer;
  if (step.pre) step.pre(buffers);
  timer.lap(stats_.cast_ns);
  // The algorithm's reducers, producers and consumers count their own time (reduce_ns, cast_ns,
  // restore_ns).
  const uint64_t reduce_before = stats_.reduce_ns.load(), cast_before = stats_.cast_ns.load(),
                 restore_before = stats_.restore_ns.load();
  step.algorithm(buffers);
  timer.lap(stats_.transfer_ns);
  stats_.transfer_ns -= (stats_.reduce_ns.load() - reduce_before) + (stats_.cast_ns.load() - cast_before) +
                        (stats_.restore_ns.load() - restore_before);
  if (step.post) step.post(buffers);
  timer.lap(stats_.restore_ns);
}

Reducer HostPath::timed_reducer(Reducer reduce) { return timed(std::move(reduce), stats_.reduce_ns); }

Producer HostPath::timed_producer(Producer produce) { return timed(std::move(produce), stats_.cast_ns); }

RankSum HostPath::timed_reducer(RankSum sum) { return timed(std::move(sum), stats_.reduce_ns); }

void HostPath::timed_reduce(std::function<void()> work) { timed(std::move(work), stats_.reduce_ns)(); }

void HostPath::timed_restore(std::function<void()> work) { timed(std::move(work), stats_.restore_ns)(); }

ChunkProduce HostPath::timed_producer(ChunkProduce produce) { return timed(std::move(produce), stats_.cast_ns); }

ChunkConsume HostPath::timed_consumer(ChunkConsume consume) { return timed(std::move(consume), stats_.restore_ns); }

void HostPath::reduce(const ChunkedReduction& reduction, bool on_shm) {
  if (on_shm) return reduce_shm(*shm_, reduction);
  reduce_chunked(*comm_, reduction);
}

c10::intrusive_ptr<c10d::Work> HostPath::submit_p2p(c10d::OpType type, at::Tensor tensor, int peer, int tag,
                                                    bool is_send) {
  const char* name = is_send ? "send" : "recv";
  checks::host_tensor(tensor, name);
  TORCH_CHECK_VALUE(peer < size_ && (peer >= 0 || type == c10d::OpType::RECVANYSOURCE), "cnccl ", name, ": peer rank ",
                    peer, " is outside the group of ", size_);
  TORCH_CHECK_VALUE(peer != rank_, "cnccl ", name, ": a rank cannot ", name, " to itself");
  TORCH_CHECK(executor_, "cnccl ", name, ": the process group has been shut down");
  // The message travels from/into a contiguous buffer; a strided receive is copied back at the end.
  at::Tensor buffer = tensor.is_contiguous()
                          ? tensor
                          : (is_send ? tensor.contiguous() : at::empty_like(tensor, at::MemoryFormat::Contiguous));
  auto work = c10::make_intrusive<HostWork>(rank_, type, 0, std::vector<at::Tensor>{tensor});
  profile_collective(type, {tensor}, "none", work->getFuture());
  executor_->submit([this, work, buffer, tensor, peer, tag, is_send, timeout = timeout_]() mutable {
    auto done = [this, work, buffer, tensor](std::exception_ptr error, int source) mutable {
      if (error) {
        comm_->keep_until_quiesced(std::make_shared<at::Tensor>(buffer));
        return executor_->defer([work, error] { work->fail(error); });
      }
      if (!buffer.is_same(tensor)) tensor.copy_(buffer);
      work->set_source_rank(source);
      executor_->defer([work] { work->complete(); });
    };
    try {
      if (is_send) {
        comm_->post_send(peer, tag, buffer.data_ptr(), buffer.nbytes(), timeout, done);
      } else {
        comm_->post_recv(peer, tag, buffer.data_ptr(), buffer.nbytes(), timeout, done);
      }
    } catch (const std::exception&) {
      executor_->defer([work, error = std::current_exception()] { work->fail(error); });
    }
  });
  return work;
}

c10::intrusive_ptr<c10d::Work> HostPath::send(std::vector<at::Tensor>& tensors, int dst_rank, int tag) {
  return submit_p2p(c10d::OpType::SEND, checks::single(tensors, "send"), dst_rank, tag, true);
}

c10::intrusive_ptr<c10d::Work> HostPath::recv(std::vector<at::Tensor>& tensors, int src_rank, int tag) {
  return submit_p2p(c10d::OpType::RECV, checks::single(tensors, "recv"), src_rank, tag, false);
}

c10::intrusive_ptr<c10d::Work> HostPath::recvAnysource(std::vector<at::Tensor>& tensors, int tag) {
  return submit_p2p(c10d::OpType::RECVANYSOURCE, checks::single(tensors, "recv"), -1, tag, false);
}

}  // namespace cnccl::host

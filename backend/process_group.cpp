// ProcessGroupCNCCL: creates the paths, forwards each call to the one for its tensors' device,
// and reports the group's statistics.
#include "backend/process_group.h"

#include <c10/util/Logging.h>

#include "backend/composed/composed_path.h"
#include "backend/composed/issued_path.h"
#include "backend/cuda/nccl_engine.h"
#include "backend/group_store.h"
#include "backend/peer_processes.h"
#include "backend/host/host_path.h"
#include "backend/work.h"

namespace cnccl {

using WorkPtr = c10::intrusive_ptr<c10d::Work>;

namespace {
// Under the group's store, beside cnccl/nccl, where the NCCL engine's ProcessGroupNCCL keeps its keys.
constexpr const char* kCudaSettingsKey = "cnccl/cuda_settings";

// What torch's ProcessGroupGloo cannot do with CUDA tensors (ProcessGroupGloo.cpp: its CUDA works stage
// through pinned host memory for allreduce, broadcast, reduce, allgather, gather, scatter and
// all-to-all; the rest take host pointers or CPU tensors only): refused with cuda_engine=gloo, naming why.
struct GlooCudaRefusal {
  const char* op;
  const char* why;
};
constexpr GlooCudaRefusal kGlooCudaRefusals[] = {
    {"allreduce_coalesced", "gloo's allreduce_coalesced takes CPU tensors only"},
    {"allgather_coalesced", "gloo's allgather_coalesced has no CUDA staging"},
    {"allgather_into_tensor_coalesced", "gloo's allgather_into_tensor_coalesced has no CUDA staging"},
    {"send", "gloo's point-to-point has no CUDA staging"},
    {"recv", "gloo's point-to-point has no CUDA staging"},
};
}  // namespace

ProcessGroupCNCCL::ProcessGroupCNCCL(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                     c10::intrusive_ptr<cnccl::Options> options,
                                     c10::intrusive_ptr<c10d::Backend> cpu_engine,
                                     c10::intrusive_ptr<c10d::Backend> cuda_path,
                                     c10::intrusive_ptr<c10d::Backend> cuda_engine)
    : c10d::Backend(rank, size), options_(std::move(options)), cuda_(std::move(cuda_path)) {
  TORCH_CHECK_VALUE(options_, "cnccl: options must not be None");
  config_ = options_->resolve();
  const std::string name = options_->group_name.empty() ? "unnamed" : options_->group_name;
  store_ = group_store(store, rank, size, options_->timeout, name, config_.engine_settings());
  if (config_.cuda_engine == CudaEngine::kGloo && cuda_nccl_version() && !cuda_) {
    TORCH_CHECK_VALUE(cuda_engine && cuda_engine->getBackendName() == "gloo", "cnccl: cuda_engine=gloo needs a "
                      "torch ProcessGroupGloo for CUDA tensors passed to the constructor (the Python registration "
                      "builds one)");
    cuda_gloo_ = std::move(cuda_engine);
  } else {
    TORCH_CHECK_VALUE(!cuda_engine, "cnccl: a CUDA engine was passed, but cuda_engine is ", config_.cuda_engine_name(),
                      cuda_nccl_version() ? "" : " and this build has no CUDA path");
  }
  if (config_.cpu_engine == CpuEngine::kGloo) {
    TORCH_CHECK_VALUE(!config_.per_level(), "cnccl: inter_host_wire=", config_.wire_across_name(), " differs from ",
                      "wire_dtype=", config_.wire_name(), ", but cpu_engine=gloo: gloo decides how its sums cross hosts, ",
                      "so only cnccl's host path (cpu_engine=ucx) has a wire per level");
    TORCH_CHECK_VALUE(cpu_engine && cpu_engine->getBackendName() == "gloo", "cnccl: cpu_engine=gloo needs torch's "
                      "ProcessGroupGloo passed to the constructor (the Python registration does this)",
                      CNCCL_WITH_UCX ? "" : "; this build has no UCX (CNCCL_WITH_UCX=OFF), so gloo is its only CPU engine");
    auto composition = std::make_unique<composed::Composition>(composed::Engine::gloo(cpu_engine),
                                                               composed::make_cpu_device(), config_,
                                                               /*stats=*/nullptr, rank, size);
    auto composed = c10::make_intrusive<composed::ComposedPath>(rank, size, std::move(composition));
    // gloo names a failed connection, not a rank: a rank of this host whose process exited is named instead.
    auto peers = std::make_shared<std::map<int, Liveness>>(same_host_peers(*store_, rank, size));
    cpu_ = c10::make_intrusive<composed::IssuedPath>(composed, cpu_engine, name, config_, options_->timeout, stats_,
                                                     [peers](int peer) { return exited(*peers, peer); });
  } else {
    TORCH_CHECK_VALUE(!cpu_engine, "cnccl: a CPU engine was passed, but cpu_engine is ucx");
    auto host = c10::make_intrusive<host::HostPath>(store_, rank, size, name, config_, options_->timeout, stats_);
    host_ = host.get();
    cpu_ = host;
  }
  LOG(INFO) << "cnccl: group '" << name << "' rank " << rank << "/" << size << ": CPU tensors on "
            << (host_ ? "the host path over " + host_->transport() : std::string("the composed path over gloo")) << ", CUDA tensors on "
            << (!cuda_nccl_version() ? std::string("no path (built without CUDA)")
                : cuda_gloo_         ? std::string("the composed path over gloo (staged through host memory)")
                                     : "the composed path over NCCL " + std::to_string(cuda_nccl_version()))
            << "; wire " << config_.wire_name() << ", min_bytes " << config_.min_bytes;
}

void ProcessGroupCNCCL::abort() {
  cpu_->abort();
  if (auto cuda = cuda_created()) cuda->abort();
}

void ProcessGroupCNCCL::shutdown() {
  cpu_->shutdown();
  if (auto cuda = cuda_created()) cuda->shutdown();
}

c10::intrusive_ptr<c10d::Backend> ProcessGroupCNCCL::cuda_created() {
  std::lock_guard<std::mutex> lock(cuda_mutex_);
  return cuda_;
}

c10d::Backend& ProcessGroupCNCCL::path_for(const at::Tensor& t, const char* op) {
  if (!(t.defined() && t.is_cuda())) return *cpu_;
  c10d::Backend& cuda = cuda_path(op);
  if (cuda_gloo_) refuse_what_gloo_cannot(t, op);
  if (window_ && !window_->cuda_started) {
    // Agree before the window opens on the engine: a disagreement thrown after startCoalescing() would
    // leave NCCL's group (ncclGroupStart) open on this thread. Every rank's window starts at the same call.
    agree_on_cuda_settings();
    cuda.startCoalescing();
    window_->cuda_started = true;
  }
  return cuda;
}

void ProcessGroupCNCCL::refuse_what_gloo_cannot(const at::Tensor& t, const char* op) {
  std::string why;
  for (const auto& refusal : kGlooCudaRefusals) {
    if (std::string(op) == refusal.op) why = refusal.why;
  }
  std::shared_ptr<composed::Device> device;
  {
    std::lock_guard<std::mutex> lock(cuda_mutex_);
    device = cuda_device_;
  }
  if (why.empty() && window_) why = "gloo has no coalescing windows (startCoalescing); make the calls one by one";
  if (why.empty() && device && device->capturing(t)) {
    why = "gloo's CUDA works synchronize their streams with the host, which a CUDA graph cannot capture";
  }
  if (why.empty()) return;
  // torch's _coalescing_manager never ends a window whose body raised: this one ends here.
  window_.reset();
  TORCH_CHECK_VALUE(false, "cnccl ", op, " on CUDA tensors with cuda_engine=gloo: ", why, " (cuda_engine=nccl runs it)");
}

void ProcessGroupCNCCL::startCoalescing() {
  TORCH_CHECK(!window_, "cnccl: startCoalescing() called while a coalescing window is open");
  window_.emplace();
}

WorkPtr ProcessGroupCNCCL::endCoalescing() {
  TORCH_CHECK(window_, "cnccl: endCoalescing() called without startCoalescing()");
  Window window = std::move(*window_);
  window_.reset();
  std::vector<WorkPtr> works = std::move(window.cpu_works);
  if (window.cuda_started) {
    if (auto cuda = cuda_created()->endCoalescing()) works.push_back(cuda);
  }
  if (works.empty()) return {};  // as ProcessGroupNCCL's for an empty window
  if (works.size() == 1) return works[0];
  return c10::make_intrusive<WorkList>(rank_, c10d::OpType::COALESCED, std::move(works));
}

WorkPtr ProcessGroupCNCCL::in_window(WorkPtr work, const std::vector<at::Tensor>& tensors) {
  const bool cuda = !tensors.empty() && tensors[0].defined() && tensors[0].is_cuda();
  if (window_ && work && !cuda) window_->cpu_works.push_back(work);
  return work;
}

c10d::Backend& ProcessGroupCNCCL::path_for(const std::vector<at::Tensor>& ts, const char* op) {
  return ts.empty() ? *cpu_ : path_for(ts[0], op);
}

void ProcessGroupCNCCL::refuse_unsupported_reduction(const at::Tensor& t, const char* op) const {
  // NCCL chooses its own rings and trees across hosts: there is no level of cnccl's to give a wire.
  TORCH_CHECK_VALUE(!(t.defined() && t.is_cuda() && config_.per_level()), "cnccl ", op, ": inter_host_wire=",
                    config_.wire_across_name(), " (CNCCL_INTER_HOST_WIRE / Options.inter_host_wire) differs from ",
                    "wire_dtype=", config_.wire_name(), ", which applies to CPU tensors' host path only: on CUDA tensors ",
                    "NCCL decides the topology. Make CUDA tensors' reductions on a group without inter_host_wire");
  // Only tensors the wire could carry: 16-bit and integer CUDA tensors never use it.
  const bool wide = t.defined() && (t.scalar_type() == at::kFloat || t.scalar_type() == at::kDouble);
  TORCH_CHECK_VALUE(!(wide && t.is_cuda() && config_.rotation == Rotation::kHadamard), "cnccl ", op,
                    ": rotation=hadamard (CNCCL_ROTATION / Options.rotation) runs on the host path only, so far: ",
                    "CUDA tensors' reductions cannot use it");
}

c10d::Backend& ProcessGroupCNCCL::reducing_path_for(const at::Tensor& t, const char* op) {
  refuse_unsupported_reduction(t, op);
  c10d::Backend& path = path_for(t, op);
  if (&path != cpu_.get()) agree_on_cuda_settings();
  return path;
}

c10d::Backend& ProcessGroupCNCCL::reducing_path_for(const std::vector<at::Tensor>& ts, const char* op) {
  // Every tensor's refusals before anything else: a coalesced call's path queues its first tensors'
  // collectives before it reaches a later one, and choosing a path may open NCCL's group (startCoalescing).
  for (const at::Tensor& t : ts) refuse_unsupported_reduction(t, op);
  return ts.empty() ? *cpu_ : reducing_path_for(ts[0], op);
}

void ProcessGroupCNCCL::agree_on_cuda_settings() {
  // Not under cuda_mutex_: abort() and shutdown() must not wait for this round.
  std::lock_guard<std::mutex> lock(agreement_mutex_);
  if (cuda_agreed_) return;
  // A failed round is not run again: a rank alone could then pass it into NCCL.
  if (cuda_disagreement_) std::rethrow_exception(cuda_disagreement_);
  try {
    agree_on_settings(*store_, kCudaSettingsKey, rank_, size_, config_, options_->timeout);
    cuda_agreed_ = true;
  } catch (...) {
    cuda_disagreement_ = std::current_exception();
    throw;
  }
}

c10d::Backend& ProcessGroupCNCCL::cuda_path(const char* op) {
  std::lock_guard<std::mutex> lock(cuda_mutex_);
  if (cuda_) return *cuda_;
#if CNCCL_WITH_CUDA
  cuda::NcclEngineArgs args;
  args.store = store_;
  args.rank = rank_;
  args.size = size_;
  args.options = options_.get();
  args.config = &config_;
  args.group_uid = getGroupUid();
  args.group_desc = getGroupDesc();
  args.bound_device = getBoundDeviceId();
  // gloo's CUDA works end in its worker thread, their events recorded only then: the host waits for
  // them (wait(Work&)) before a stream can be ordered after them.
  composed::Engine engine = cuda_gloo_ ? composed::Engine::gloo(cuda_gloo_) : cuda::make_nccl_engine(args);
  auto device = cuda::make_cuda_device(config_.telemetry != Telemetry::kOff, /*host_waits=*/bool(cuda_gloo_));
  auto composition = std::make_unique<composed::Composition>(std::move(engine), device, config_, &stats_, rank_, size_);
  cuda_ = c10::make_intrusive<composed::ComposedPath>(rank_, size_, std::move(composition));
  cuda_device_ = std::move(device);
  return *cuda_;
#else
  TORCH_CHECK(false, "cnccl ", op, ": CUDA tensors need cnccl's CUDA path, which this build does not have (it was "
              "built without a CUDA toolkit or against a CPU-only torch)");
#endif
}

bool ProcessGroupCNCCL::host_path_built() { return CNCCL_WITH_UCX; }

int ProcessGroupCNCCL::cuda_nccl_version() {
#if CNCCL_WITH_CUDA
  return cuda::loaded_nccl_version();
#else
  return 0;
#endif
}

void ProcessGroupCNCCL::eagerConnectSingleDevice(at::Device device) {
  if (device.is_cuda()) cuda_path("eager connect").eagerConnectSingleDevice(device);
}

std::string ProcessGroupCNCCL::cpu_transport() const { return host_ ? host_->transport() : "gloo"; }

std::string ProcessGroupCNCCL::wire_levels() const {
  return host_ ? host_->wire_levels() : config_.wire_name() + " (gloo's links)";
}

std::map<std::string, uint64_t> ProcessGroupCNCCL::stats() const {
  // The CUDA path's kernels count on their devices; the CPU's casts into stats_ (docs/design.md, "Telemetry").
  std::shared_ptr<composed::Device> cuda_device;
  {
    std::lock_guard<std::mutex> lock(cuda_mutex_);
    cuda_device = cuda_device_;
  }
  const compress::Census on_devices = cuda_device ? cuda_device->cast_counts() : compress::Census{};
  return {{"collectives", stats_.collectives.load()},
          {"compressed_collectives", stats_.compressed_collectives.load()},
          {"bytes_uncompressed", stats_.bytes_uncompressed.load()},
          {"bytes_sent", stats_.bytes_sent.load()},
          {"transport_bytes_sent", host_ ? host_->transport_bytes_sent() : 0},
          {"cast_ns", stats_.cast_ns.load()},
          {"reduce_ns", stats_.reduce_ns.load()},
          {"transfer_ns", stats_.transfer_ns.load()},
          {"restore_ns", stats_.restore_ns.load()},
          {"caller_thread_collectives", stats_.caller_thread_collectives.load()},
          {"cast_nonfinite", stats_.cast_nonfinite.load() + on_devices.nonfinite},
          {"cast_saturated", stats_.cast_saturated.load() + on_devices.saturated}};
}

WorkPtr ProcessGroupCNCCL::allreduce(std::vector<at::Tensor>& tensors, const c10d::AllreduceOptions& opts) {
  return reducing_path_for(tensors, "allreduce").allreduce(tensors, opts);
}

WorkPtr ProcessGroupCNCCL::allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                               const c10d::AllreduceCoalescedOptions& opts) {
  return reducing_path_for(tensors, "allreduce_coalesced").allreduce_coalesced(tensors, opts);
}

WorkPtr ProcessGroupCNCCL::reduce_scatter(std::vector<at::Tensor>& outputs,
                                          std::vector<std::vector<at::Tensor>>& inputs,
                                          const c10d::ReduceScatterOptions& opts) {
  return reducing_path_for(outputs, "reduce_scatter").reduce_scatter(outputs, inputs, opts);
}

WorkPtr ProcessGroupCNCCL::_reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                const c10d::ReduceScatterOptions& opts) {
  return reducing_path_for(output, "reduce_scatter_tensor")._reduce_scatter_base(output, input, opts);
}

WorkPtr ProcessGroupCNCCL::reduce_scatter_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                           std::vector<at::Tensor>& inputs,
                                                           const c10d::ReduceScatterOptions& opts) {
  return reducing_path_for(outputs, "reduce_scatter_tensor_coalesced").reduce_scatter_tensor_coalesced(outputs, inputs, opts);
}

WorkPtr ProcessGroupCNCCL::reduce(std::vector<at::Tensor>& tensors, const c10d::ReduceOptions& opts) {
  return path_for(tensors, "reduce").reduce(tensors, opts);
}

WorkPtr ProcessGroupCNCCL::broadcast(std::vector<at::Tensor>& tensors, const c10d::BroadcastOptions& opts) {
  return path_for(tensors, "broadcast").broadcast(tensors, opts);
}

WorkPtr ProcessGroupCNCCL::allgather(std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
                                     const c10d::AllgatherOptions& opts) {
  return path_for(inputs, "allgather").allgather(outputs, inputs, opts);
}

WorkPtr ProcessGroupCNCCL::_allgather_base(at::Tensor& output, at::Tensor& input, const c10d::AllgatherOptions& opts) {
  return path_for(input, "all_gather_into_tensor")._allgather_base(output, input, opts);
}

WorkPtr ProcessGroupCNCCL::allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                               std::vector<at::Tensor>& inputs, const c10d::AllgatherOptions& opts) {
  return path_for(inputs, "allgather_coalesced").allgather_coalesced(outputs, inputs, opts);
}

WorkPtr ProcessGroupCNCCL::allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                           std::vector<at::Tensor>& inputs,
                                                           const c10d::AllgatherOptions& opts) {
  return path_for(inputs, "allgather_into_tensor_coalesced").allgather_into_tensor_coalesced(outputs, inputs, opts);
}

WorkPtr ProcessGroupCNCCL::gather(std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
                                  const c10d::GatherOptions& opts) {
  return path_for(inputs, "gather").gather(outputs, inputs, opts);
}

WorkPtr ProcessGroupCNCCL::scatter(std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
                                   const c10d::ScatterOptions& opts) {
  return path_for(outputs, "scatter").scatter(outputs, inputs, opts);
}

WorkPtr ProcessGroupCNCCL::alltoall_base(at::Tensor& output, at::Tensor& input,
                                         std::vector<int64_t>& output_split_sizes,
                                         std::vector<int64_t>& input_split_sizes, const c10d::AllToAllOptions& opts) {
  return path_for(output, "all_to_all_single")
      .alltoall_base(output, input, output_split_sizes, input_split_sizes, opts);
}

WorkPtr ProcessGroupCNCCL::alltoall(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                    const c10d::AllToAllOptions& opts) {
  return path_for(outputs, "all_to_all").alltoall(outputs, inputs, opts);
}

WorkPtr ProcessGroupCNCCL::send(std::vector<at::Tensor>& tensors, int dst_rank, int tag) {
  return in_window(path_for(tensors, "send").send(tensors, dst_rank, tag), tensors);
}

WorkPtr ProcessGroupCNCCL::recv(std::vector<at::Tensor>& tensors, int src_rank, int tag) {
  return in_window(path_for(tensors, "recv").recv(tensors, src_rank, tag), tensors);
}

WorkPtr ProcessGroupCNCCL::recvAnysource(std::vector<at::Tensor>& tensors, int tag) {
  return in_window(path_for(tensors, "recv").recvAnysource(tensors, tag), tensors);
}

WorkPtr ProcessGroupCNCCL::barrier(const c10d::BarrierOptions& opts) { return cpu_->barrier(opts); }

}  // namespace cnccl

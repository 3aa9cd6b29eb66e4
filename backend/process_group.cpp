// Lifecycle, queueing, point-to-point and statistics of ProcessGroupCNCCL. The collectives'
// bodies are in host_collectives.cpp.
#include "backend/process_group.h"

#include "backend/checks.h"
#include "backend/composed/composition.h"
#include "backend/composed/issuer.h"
#include "backend/cuda/nccl_engine.h"
#include "backend/host/comm.h"
#include "backend/host/executor.h"
#include "backend/host/ucx_transport.h"

namespace cnccl {

ProcessGroupCNCCL::ProcessGroupCNCCL(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                     c10::intrusive_ptr<cnccl::Options> options,
                                     c10::intrusive_ptr<c10d::Backend> cpu_engine)
    : c10d::Backend(rank, size), store_(store), options_(std::move(options)) {
  TORCH_CHECK_VALUE(options_, "cnccl: options must not be None");
  config_ = options_->resolve();
  const std::string name = options_->group_name.empty() ? "unnamed" : options_->group_name;
  if (config_.cpu_engine == CpuEngine::kGloo) {
    TORCH_CHECK_VALUE(cpu_engine && cpu_engine->getBackendName() == "gloo", "cnccl: cpu_engine=gloo needs torch's "
                      "ProcessGroupGloo passed to the constructor (the Python registration does this)");
    composed::Engine engine{cpu_engine, "gloo", /*reduces_avg_and_premul=*/false, /*reduce_keeps_non_root=*/false,
                            /*coalesces_mixed_dtypes=*/false};
    cpu_composed_ = std::make_shared<composed::Composition>(std::move(engine), composed::make_cpu_device(), config_,
                                                            /*stats=*/nullptr, rank, size);
    issuer_ = std::make_unique<composed::Issuer>(cpu_engine, name);
    return;
  }
  TORCH_CHECK_VALUE(!cpu_engine, "cnccl: a CPU engine was passed, but cpu_engine is ucx");
  comm_ = std::make_unique<host::Comm>(std::make_unique<host::UcxTransport>(store, rank, size), name);
  executor_ = std::make_unique<host::Executor>(*comm_);
}

ProcessGroupCNCCL::~ProcessGroupCNCCL() { shutdown(); }

c10d::Backend& ProcessGroupCNCCL::engine() { return cpu_composed_->inner(); }

void ProcessGroupCNCCL::abort() {
  if (comm_) comm_->abort("abort() was called on the process group");
  if (issuer_) issuer_->abort("abort() was called on the process group");
  if (auto path = cuda_created()) path->inner().abort();
}

void ProcessGroupCNCCL::shutdown() {
  if (issuer_) issuer_->abort("shutdown() was called on the process group");
  if (auto path = cuda_created()) path->inner().shutdown();
  if (!executor_) return;
  // As with NCCL: operations still outstanding end with an error instead of waiting on peers.
  comm_->abort("shutdown() was called on the process group");
  executor_->stop();
  executor_.reset();
}

std::shared_ptr<composed::Composition> ProcessGroupCNCCL::cuda_created() {
  std::lock_guard<std::mutex> lock(cuda_mutex_);
  return cuda_;
}

composed::Composition* ProcessGroupCNCCL::cuda_for(const at::Tensor& t, const char* op) {
  return t.defined() && t.is_cuda() ? &cuda_composed(op) : nullptr;
}

composed::Composition* ProcessGroupCNCCL::cuda_for(const std::vector<at::Tensor>& ts, const char* op) {
  return ts.empty() ? nullptr : cuda_for(ts[0], op);
}

composed::Composition& ProcessGroupCNCCL::cuda_composed(const char* op) {
#if CNCCL_WITH_CUDA
  std::lock_guard<std::mutex> lock(cuda_mutex_);
  if (!cuda_) {
    cuda::NcclEngineArgs args;
    args.store = store_;
    args.rank = rank_;
    args.size = size_;
    args.options = options_.get();
    args.config = &config_;
    args.group_uid = getGroupUid();
    args.group_desc = getGroupDesc();
    args.bound_device = getBoundDeviceId();
    cuda_ = std::make_shared<composed::Composition>(cuda::make_nccl_engine(args), cuda::make_cuda_device(), config_,
                                                    &stats_, rank_, size_);
  }
  return *cuda_;
#else
  TORCH_CHECK(false, "cnccl ", op, ": CUDA tensors need cnccl's CUDA path, which this build does not have (it was "
              "built without a CUDA toolkit or against a CPU-only torch)");
#endif
}

int ProcessGroupCNCCL::cuda_nccl_version() {
#if CNCCL_WITH_CUDA
  return cuda::loaded_nccl_version();
#else
  return 0;
#endif
}

void ProcessGroupCNCCL::eagerConnectSingleDevice(at::Device device) {
  if (device.is_cuda()) cuda_composed("eager connect").inner().eagerConnectSingleDevice(device);
}

std::chrono::milliseconds ProcessGroupCNCCL::timeout_of(std::chrono::milliseconds requested) const {
  return requested == c10d::kUnsetTimeout ? options_->timeout : requested;
}

char* ProcessGroupCNCCL::scratch(int which, size_t bytes) {
  if (scratch_.size() <= size_t(which)) scratch_.resize(which + 1);
  auto& buffer = scratch_[which];
  if (buffer.size() < bytes) buffer = std::vector<char>(bytes);
  return buffer.data();
}

std::map<std::string, uint64_t> ProcessGroupCNCCL::stats() const {
  return {{"collectives", stats_.collectives.load()},
          {"compressed_collectives", stats_.compressed_collectives.load()},
          {"bytes_uncompressed", stats_.bytes_uncompressed.load()},
          {"bytes_sent", stats_.bytes_sent.load()},
          {"transport_bytes_sent", comm_ ? comm_->bytes_sent() : 0},
          {"cast_ns", stats_.cast_ns.load()},
          {"reduce_ns", stats_.reduce_ns.load()},
          {"transfer_ns", stats_.transfer_ns.load()},
          {"restore_ns", stats_.restore_ns.load()}};
}

c10::intrusive_ptr<c10d::Work> ProcessGroupCNCCL::enqueue(c10d::OpType type, const char* name,
                                                          std::string signature, std::vector<at::Tensor> outputs,
                                                          std::chrono::milliseconds timeout, const char* on_failure,
                                                          EngineCall engine_call, Body body, int seq_count) {
  if (issuer_) {
    const uint64_t seq = seq_.fetch_add(seq_count);
    return issuer_->submit(type, name, seq, std::move(signature), std::move(outputs), timeout, std::move(engine_call));
  }
  TORCH_CHECK(executor_, "cnccl ", name, ": the process group has been shut down");
  const uint64_t seq = seq_.fetch_add(seq_count);
  auto work = c10::make_intrusive<HostWork>(rank_, type, seq, std::move(outputs));
  executor_->submit([this, work, name, seq, timeout, on_failure, signature = std::move(signature),
                     body = std::move(body)] {
    try {
      if (!broken_.empty()) {
        C10_THROW_ERROR(DistBackendError, std::string("cnccl ") + name + " (seq " + std::to_string(seq) +
                                              "): the group is unusable after an earlier failure: " + broken_);
      }
      comm_->begin(name, seq, timeout, signature);
      body(*work);
      comm_->end();
      executor_->defer([work] { work->complete(); });
    } catch (const std::exception& e) {
      // c10 errors carry a backtrace in what(): the note goes after the message, not after that.
      const auto* c10_error = dynamic_cast<const c10::Error*>(&e);
      const std::string what = c10_error ? c10_error->what_without_backtrace() : e.what();
      if (broken_.empty()) broken_ = what;
      const std::string msg = what + " (" + on_failure + ")";
      auto error = std::make_exception_ptr(c10::DistBackendError({__func__, __FILE__, uint32_t(__LINE__)}, msg));
      executor_->defer([work, error] { work->fail(error); });
    }
  });
  return work;
}

c10::intrusive_ptr<c10d::Work> ProcessGroupCNCCL::enqueue_p2p(c10d::OpType type, at::Tensor tensor, int peer,
                                                              int tag, bool is_send) {
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
  const auto timeout = options_->timeout;
  executor_->submit([this, work, buffer, tensor, peer, tag, is_send, timeout]() mutable {
    auto done = [this, work, buffer, tensor](std::exception_ptr error, int source) mutable {
      if (error) return executor_->defer([work, error] { work->fail(error); });
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

c10::intrusive_ptr<c10d::Work> ProcessGroupCNCCL::send(std::vector<at::Tensor>& tensors, int dst_rank, int tag) {
  if (auto* c = cuda_for(tensors, "send")) return c->inner().send(tensors, dst_rank, tag);
  if (cpu_composed_) return engine().send(tensors, dst_rank, tag);
  return enqueue_p2p(c10d::OpType::SEND, checks::single(tensors, "send"), dst_rank, tag, true);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupCNCCL::recv(std::vector<at::Tensor>& tensors, int src_rank, int tag) {
  if (auto* c = cuda_for(tensors, "recv")) return c->inner().recv(tensors, src_rank, tag);
  if (cpu_composed_) return engine().recv(tensors, src_rank, tag);
  return enqueue_p2p(c10d::OpType::RECV, checks::single(tensors, "recv"), src_rank, tag, false);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupCNCCL::recvAnysource(std::vector<at::Tensor>& tensors, int tag) {
  if (auto* c = cuda_for(tensors, "recv")) return c->inner().recvAnysource(tensors, tag);
  if (cpu_composed_) return engine().recvAnysource(tensors, tag);
  return enqueue_p2p(c10d::OpType::RECVANYSOURCE, checks::single(tensors, "recv"), -1, tag, false);
}

}  // namespace cnccl

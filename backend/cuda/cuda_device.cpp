// The composed path's CUDA device. Casts run on the caller's current stream, where ProcessGroupNCCL
// orders its kernel after them. Restores run on a side stream that waits on the engine's
// completion events (never on the host), then the result future records its events there; the
// buffers NCCL read or wrote are recorded on that stream, so the caching allocator cannot hand
// them out before it is done, even after ProcessGroupNCCL's wait() unstashes its references.
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAGraphsC10Utils.h>
#include <c10/cuda/CUDAGuard.h>

#include <mutex>

#include "backend/cuda/nccl_engine.h"
#include "backend/wide_data.h"
#include "compress/cuda_codec.h"

namespace cnccl::cuda {
namespace {

bool capturing() { return c10::cuda::currentStreamCaptureStatusMayInitCtx() != c10::cuda::CaptureStatus::None; }

class CudaDevice final : public composed::Device {
 public:
  double premul_factor(const c10d::ReduceOp& op) override {
    const at::Tensor factor = premul_tensor_factor(op);
    TORCH_CHECK_VALUE(!(factor.defined() && factor.is_cuda() && capturing()),
                      "cnccl: a compressed PREMUL_SUM reads its factor on the host, which is not allowed for a CUDA "
                      "tensor factor while a CUDA graph is being captured; pass the factor as a Python number, or "
                      "capture with CNCCL_WIRE_DTYPE=none");
    return cnccl::premul_factor(op);
  }

  void cast(const at::Tensor& wide, const at::Tensor& wire, const Plan& plan, const compress::Dither& dither,
            uint64_t first) override {
    const cudaStream_t stream = at::cuda::getCurrentCUDAStream(wide.device().index()).stream();
    auto* dst = static_cast<uint16_t*>(wire.data_ptr());
    with_wide_data(wide, [&](auto* src) {
      const float scale = float(plan.pre_scale);
      if (plan.stochastic) return compress::cuda::cast(src, dst, wide.numel(), scale, plan.wire, dither, first, stream);
      compress::cuda::cast(src, dst, wide.numel(), scale, plan.wire, stream);
    });
  }

  void restore(const at::Tensor& wire, const at::Tensor& wide, const Plan& plan) override {
    const cudaStream_t stream = at::cuda::getCurrentCUDAStream(wide.device().index()).stream();
    const auto* src = static_cast<const uint16_t*>(wire.const_data_ptr());
    with_wide_data(wide, [&](auto* dst) {
      compress::cuda::restore(src, dst, wide.numel(), float(plan.post_scale), plan.wire, stream);
    });
  }

  void sum(const at::Tensor& rows, const at::Tensor& wire, const Plan& plan, const compress::Dither& dither,
           uint64_t first) override {
    const cudaStream_t stream = at::cuda::getCurrentCUDAStream(wire.device().index()).stream();
    const auto* in = static_cast<const uint16_t*>(rows.const_data_ptr());
    auto* dst = static_cast<uint16_t*>(wire.data_ptr());
    const size_t k = size_t(rows.size(0)), stride = size_t(rows.stride(0)), n = size_t(rows.size(1));
    if (plan.stochastic) return compress::cuda::sum(in, k, stride, dst, n, plan.wire, dither, first, stream);
    compress::cuda::sum(in, k, stride, dst, n, plan.wire, stream);
  }

  void sum_wide(const at::Tensor& rows, const at::Tensor& wide, const Plan& plan) override {
    const cudaStream_t stream = at::cuda::getCurrentCUDAStream(wide.device().index()).stream();
    const auto* src = static_cast<const uint16_t*>(rows.const_data_ptr());
    with_wide_data(wide, [&](auto* dst) {
      compress::cuda::sum(src, size_t(rows.size(0)), size_t(rows.stride(0)), dst, size_t(rows.size(1)),
                          float(plan.post_scale), plan.wire, stream);
    });
  }

  // ProcessGroupNCCL's synchronize() makes the current stream wait on the collective's end event;
  // the host does not wait (unless TORCH_NCCL_BLOCKING_WAIT asks it to).
  void order_after(const c10::intrusive_ptr<c10d::Work>& work) override {
    if (work) work->synchronize();
  }

  void after(const std::vector<composed::FuturePtr>& inner, const std::vector<at::Tensor>& buffers,
             const std::function<void()>& body) override {
    const at::Device device = buffers.front().device();
    c10::cuda::CUDAGuard device_guard(device);
    // Inside a capture the restore stays on the capturing stream: a side stream would have to be
    // joined back before the capture ends.
    const bool in_capture = capturing();
    const c10::cuda::CUDAStream stream =
        in_capture ? c10::cuda::getCurrentCUDAStream(device.index()) : side_stream(device.index());
    c10::cuda::CUDAStreamGuard stream_guard(stream);
    // Complete futures: wait() only makes the current stream wait on their events.
    for (const auto& f : inner) f->wait();
    body();
    if (in_capture) return;
    for (const auto& b : buffers) b.record_stream(stream.unwrap());
  }

  std::function<bool()> done_probe() override {
    if (capturing()) return [] { return true; };
    auto event = std::make_shared<at::cuda::CUDAEvent>();
    event->record(at::cuda::getCurrentCUDAStream());
    return [event] { return event->query(); };
  }

 private:
  c10::cuda::CUDAStream side_stream(c10::DeviceIndex index) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (side_streams_.size() <= size_t(index)) side_streams_.resize(index + 1);
    auto& stream = side_streams_[index];
    if (!stream) stream = at::cuda::getStreamFromPool(/*isHighPriority=*/false, index);
    return *stream;
  }

  std::mutex mutex_;
  std::vector<std::optional<c10::cuda::CUDAStream>> side_streams_;  // one per device, taken on first use
};

}  // namespace

std::shared_ptr<composed::Device> make_cuda_device() { return std::make_shared<CudaDevice>(); }

}  // namespace cnccl::cuda

// The composed path's CPU device: the host codec, run on whichever thread completes the inner
// work (torch's gloo worker, or the caller for an engine that finished synchronously). It has no
// streams: every operation runs at once, so every event is reached when it is recorded.
#include "backend/composed/device.h"
#include "backend/frames.h"
#include "backend/wide_data.h"
#include "compress/codec.h"
#include "compress/stochastic.h"

#if CNCCL_WITH_CUDA
namespace cnccl::cuda {
std::shared_ptr<composed::Device> make_cuda_device(bool count_casts, bool host_waits);  // backend/cuda/cuda_device.cpp
}
#endif

namespace cnccl::composed {
namespace {

std::vector<const uint16_t*> row_pointers(const at::Tensor& rows) {
  std::vector<const uint16_t*> out;
  for (int64_t q = 0; q < rows.size(0); ++q) out.push_back(static_cast<const uint16_t*>(rows[q].const_data_ptr()));
  return out;
}

class CpuDevice final : public Device {
 public:
  bool capturing(const at::Tensor&) override { return false; }
  double premul_factor(const c10d::ReduceOp& op, const at::Tensor&) override { return cnccl::premul_factor(op); }

  void cast(const at::Tensor& wide, const at::Tensor& wire, const Plan& plan, const compress::Dither& dither,
            uint64_t first) override {
    auto* dst = static_cast<uint16_t*>(wire.data_ptr());
    with_wide_data(wide, [&](auto* src) {
      const float scale = float(plan.pre_scale);
      if (plan.stochastic) return compress::cast(src, dst, wide.numel(), scale, plan.wire, dither, first);
      compress::cast(src, dst, wide.numel(), scale, plan.wire);
    });
  }

  void restore(const at::Tensor& wire, const at::Tensor& wide, const Plan& plan) override {
    const auto* src = static_cast<const uint16_t*>(wire.const_data_ptr());
    with_wide_data(wide, [&](auto* dst) {
      compress::restore(src, dst, wide.numel(), float(plan.post_scale), plan.wire);
    });
  }

  void sum(const at::Tensor& rows, const at::Tensor& wire, const Plan& plan, const compress::Dither& dither,
           uint64_t first) override {
    const auto in = row_pointers(rows);
    auto* dst = static_cast<uint16_t*>(wire.data_ptr());
    const size_t k = size_t(rows.size(0)), n = size_t(rows.size(1));
    if (plan.stochastic) return compress::sum(in.data(), k, dst, n, plan.wire, dither, first);
    compress::sum(in.data(), k, dst, n, plan.wire);
  }

  void sum_wide(const at::Tensor& rows, const at::Tensor& wide, const Plan& plan) override {
    const bool direct = wide.scalar_type() == at::kFloat && wide.is_contiguous();
    at::Tensor sums = direct ? wide : at::empty({rows.size(1)}, rows.options().dtype(at::kFloat));
    compress::sum(row_pointers(rows).data(), size_t(rows.size(0)), sums.data_ptr<float>(), size_t(rows.size(1)),
                  plan.wire);
    write_scaled_sums(sums, wide, plan.post_scale);
  }

  void encode_frames(const std::vector<at::Tensor>& rows, int64_t count, const Plan& plan, const at::Tensor& frames,
                     const compress::Dither& dither) override {
    frames::encode(rows, count, plan.pre_scale, plan.wire, plan.mx_scale, frames, plan.stochastic ? &dither : nullptr);
  }
  void sum_frames(const at::Tensor& frames, int64_t count, const Plan& plan, const at::Tensor& out,
                  const compress::Dither& dither, uint64_t first) override {
    frames::sum_encode(frames, count, plan.wire, plan.mx_scale, out, plan.stochastic ? &dither : nullptr, first);
  }
  void sum_frames_wide(const at::Tensor& frames, int64_t count, const Plan& plan, const at::Tensor& wide) override {
    const bool direct = wide.scalar_type() == at::kFloat;
    const at::Tensor sums = direct ? wide : at::empty({count}, wide.options().dtype(at::kFloat));
    frames::sum(frames.unbind(0), count, plan.wire, sums);
    write_scaled_sums(sums, wide, plan.post_scale);
  }
  void restore_frames(const at::Tensor& frames, int64_t count, const Plan& plan, const at::Tensor& wide) override {
    frames::restore(frames, count, plan.wire, plan.post_scale, wide);
  }

  void run(const std::function<void()>& work) override { work(); }

  // The host's program order is the only stream: what ran has its results in memory.
  EventPtr record() override { return reached_; }
  void wait(const EventPtr&) override {}
  void wait(c10d::Work& work) override { wait_on_host(work); }
  std::shared_ptr<void> use_side_stream() override { return nullptr; }
  void keep(const std::vector<at::Tensor>&) override {}

 private:
  struct Reached final : Event {
    bool query() override { return true; }
  };
  const EventPtr reached_ = std::make_shared<Reached>();
};

}  // namespace

void wait_on_host(c10d::Work& work) {
  c10::intrusive_ptr<c10::ivalue::Future> future;
  try {
    future = work.getFuture();
  } catch (const c10::Error&) {
    work.wait();
    return;
  }
  future->wait();
  if (future->hasError()) std::rethrow_exception(future->exception_ptr());
}

std::shared_ptr<Device> make_cpu_device() { return std::make_shared<CpuDevice>(); }

std::shared_ptr<Device> make_device_for(const c10::Device& device) {
#if CNCCL_WITH_CUDA
  if (device.is_cuda()) return cuda::make_cuda_device(false, false);
#endif
  TORCH_CHECK_VALUE(device.is_cpu(), "cnccl: this build has no composed path for tensors on ", device);
  return make_cpu_device();
}

}  // namespace cnccl::composed

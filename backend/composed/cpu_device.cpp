// The composed path's CPU device: the host codec, run on whichever thread completes the inner
// work (torch's gloo worker, or the caller for an engine that finished synchronously).
#include "backend/composed/device.h"
#include "backend/wide_data.h"
#include "compress/codec.h"

namespace cnccl::composed {
namespace {

class CpuDevice final : public Device {
 public:
  double premul_factor(const c10d::ReduceOp& op) override { return cnccl::premul_factor(op); }

  void cast(const at::Tensor& wide, const at::Tensor& wire, const Plan& plan) override {
    auto* dst = static_cast<uint16_t*>(wire.data_ptr());
    with_wide_data(wide, [&](auto* src) { compress::cast(src, dst, wide.numel(), float(plan.pre_scale), plan.wire); });
  }

  void restore(const at::Tensor& wire, const at::Tensor& wide, const Plan& plan) override {
    const auto* src = static_cast<const uint16_t*>(wire.const_data_ptr());
    with_wide_data(wide, [&](auto* dst) {
      compress::restore(src, dst, wide.numel(), float(plan.post_scale), plan.wire);
    });
  }

  // CPU futures that are complete hold values that are already in memory.
  void after(const std::vector<FuturePtr>&, const std::vector<at::Tensor>&,
             const std::function<void()>& body) override {
    body();
  }

  std::function<bool()> done_probe() override {
    return [] { return true; };
  }
};

}  // namespace

std::shared_ptr<Device> make_cpu_device() { return std::make_shared<CpuDevice>(); }

}  // namespace cnccl::composed

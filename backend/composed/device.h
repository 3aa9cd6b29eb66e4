// What the composed path needs from the device its tensors live on: the codec, how a PREMUL_SUM
// factor is read, and where a restore may run relative to the inner engine's work. The CPU
// implementation is here; the CUDA one is in backend/cuda/ (streams, events, CUDA kernels).
#pragma once

#include <ATen/core/ivalue.h>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <functional>
#include <memory>
#include <vector>

#include "backend/policy.h"
#include "compress/stochastic.h"

namespace cnccl::composed {

using FuturePtr = c10::intrusive_ptr<c10::ivalue::Future>;

class Device {
 public:
  virtual ~Device() = default;

  // PREMUL_SUM's factor as a number; the CUDA device refuses to read a device tensor back to the
  // host while its stream is being captured into a CUDA graph.
  virtual double premul_factor(const c10d::ReduceOp& op) = 0;

  // wire = round16(wide * plan.pre_scale), ordered before whatever the caller issues next
  // (CUDA: on the caller's current stream). A stochastic plan rounds with `dither`, wide's element 0
  // being element `first` of the collective's tensor.
  virtual void cast(const at::Tensor& wide, const at::Tensor& wire, const Plan& plan,
                    const compress::Dither& dither = {}, uint64_t first = 0) = 0;
  // wide = widen(wire) * plan.post_scale, on the stream `after` set up.
  virtual void restore(const at::Tensor& wire, const at::Tensor& wide, const Plan& plan) = 0;

  // fp32 sums (plan.fp32_sum). `rows`: [ranks, n] 16-bit contributions, rank 0 first.
  // wire = round16(rows[0] + rows[1] + ... in fp32), ordered like cast(); stochastic as cast().
  virtual void sum(const at::Tensor& rows, const at::Tensor& wire, const Plan& plan,
                   const compress::Dither& dither = {}, uint64_t first = 0) = 0;
  // wide = (rows[0] + rows[1] + ... in fp32) * plan.post_scale, unrounded (as restore() treats a
  // widened 16-bit value); ordered like restore().
  virtual void sum_wide(const at::Tensor& rows, const at::Tensor& wide, const Plan& plan) = 0;
  // Makes what the device does next see `work`'s results (CPU: the host waits for it and rethrows
  // its failure; CUDA: the current stream waits on it). Null: the engine ran synchronously.
  virtual void order_after(const c10::intrusive_ptr<c10d::Work>& work) = 0;

  // Runs `body` (the restores, then the completion of cnccl's future) once `inner`, which are
  // complete on the host, have produced their values on the device. `buffers` are every tensor
  // the inner engine or the restores touch (never empty: the caller's tensors are among them); they
  // must not return to an allocator before then.
  virtual void after(const std::vector<FuturePtr>& inner, const std::vector<at::Tensor>& buffers,
                     const std::function<void()>& body) = 0;

  // Whether the restores `after` last enqueued for this work have run (CUDA: an event query).
  // Returns a probe, taken inside `body`.
  virtual std::function<bool()> done_probe() = 0;
};

std::shared_ptr<Device> make_cpu_device();

}  // namespace cnccl::composed

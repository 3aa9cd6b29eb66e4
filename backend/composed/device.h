// What the composed path needs from the device its tensors live on: the codec, how a PREMUL_SUM
// factor is read, and the stream order its work runs in (docs/design.md, "Stream order"). The CPU
// implementation is here; the CUDA one is in backend/cuda/ (streams, events, CUDA kernels).
//
// Every operation below that touches tensor data is device work on the *current stream*: on CUDA
// it is enqueued there and runs later, in that stream's order; on the CPU it runs at once. The
// composition orders that work only through record()/wait(): never through what a future happens
// to hold, since c10's futures record events only for the storages they find in their value.
#pragma once

#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <functional>
#include <memory>
#include <vector>

#include "backend/policy.h"
#include "compress/stochastic.h"

namespace cnccl::composed {

// A point in one stream's work: reached once everything enqueued there before it has run.
class Event {
 public:
  virtual ~Event() = default;
  virtual bool query() = 0;
};
using EventPtr = std::shared_ptr<Event>;

class Device {
 public:
  virtual ~Device() = default;

  // Whether t's device's current stream is being captured into a CUDA graph (never on the CPU).
  virtual bool capturing(const at::Tensor& t) = 0;

  // PREMUL_SUM's factor as a number, for a collective on `t`; the CUDA device refuses to read a
  // device tensor back to the host while t's device's current stream is being captured.
  virtual double premul_factor(const c10d::ReduceOp& op, const at::Tensor& t) = 0;
  // PREMUL_SUM's factor as the kernels of a compressed collective on `t` read it, on the device: a
  // one-element fp32 tensor (Plan::pre_scale_tensor), made on the current stream, for a tensor factor on
  // t's device; undefined where the factor is to be read as a number (premul_factor).
  virtual at::Tensor premul_factor_tensor(const c10d::ReduceOp& op, const at::Tensor& t) { return {}; }

  // wire = round16(wide * plan.pre_scale). A stochastic plan rounds with `dither`, wide's element 0
  // being element `first` of the collective's tensor.
  virtual void cast(const at::Tensor& wide, const at::Tensor& wire, const Plan& plan,
                    const compress::Dither& dither = {}, uint64_t first = 0) = 0;
  // wide = widen(wire) * plan.post_scale.
  virtual void restore(const at::Tensor& wire, const at::Tensor& wide, const Plan& plan) = 0;
  // fp32 sums (plan.fp32_sum). `rows`: [ranks, n] 16-bit contributions, rank 0 first.
  // wire = round16(rows[0] + rows[1] + ... in fp32); stochastic as cast().
  virtual void sum(const at::Tensor& rows, const at::Tensor& wire, const Plan& plan,
                   const compress::Dither& dither = {}, uint64_t first = 0) = 0;
  // wide = (rows[0] + rows[1] + ... in fp32) * plan.post_scale, unrounded (as restore() treats a
  // widened 16-bit value).
  virtual void sum_wide(const at::Tensor& rows, const at::Tensor& wide, const Plan& plan) = 0;
  // Power-of-two frames, MX and NVFP4 blocks (backend/frames.h: plan.wire, plan.mx_scale), none with a
  // temporary the size of a row (docs/design.md, "Numerics", Memory).
  // frames ([rows.size(), frame_bytes(count)] bytes) = each row (at most `count` values, fp32 or fp64,
  // contiguous) times plan.pre_scale, framed; with plan.stochastic (the block wires), row r's value i
  // rounded with the dither's bits of index r x count + i.
  virtual void encode_frames(const std::vector<at::Tensor>& rows, int64_t count, const Plan& plan,
                             const at::Tensor& frames, const compress::Dither& dither = {}) = 0;
  // out (one frame; it may be a row of `frames`) = the frame of the fp32 sums of frames' rows, rank order;
  // with plan.stochastic, sum i rounded with the bits of index first + i.
  virtual void sum_frames(const at::Tensor& frames, int64_t count, const Plan& plan, const at::Tensor& out,
                          const compress::Dither& dither = {}, uint64_t first = 0) = 0;
  // wide (contiguous, `count` values) = those sums times plan.post_scale, unrounded (write_scaled_sums).
  virtual void sum_frames_wide(const at::Tensor& frames, int64_t count, const Plan& plan, const at::Tensor& wide) = 0;
  // wide (contiguous, at most rows x count values) = the frames' values, row after row, times plan.post_scale.
  virtual void restore_frames(const at::Tensor& frames, int64_t count, const Plan& plan, const at::Tensor& wide) = 0;
  // Runs `work`: ATen operations on tensor data, which are device work like the codec's (CUDA and
  // CPU call it at once: ATen enqueues on the current stream by itself).
  virtual void run(const std::function<void()>& work) = 0;

  // A point on the current stream after everything enqueued there so far.
  virtual EventPtr record() = 0;
  // The current stream of event's device waits for it (nothing when that is the event's stream).
  virtual void wait(const EventPtr& event) = 0;
  // The current stream waits for `work`, an engine's asynchronous work (CUDA: its end event on the
  // engine's stream, through WorkNCCL::synchronize, never blocking the host; CPU: the host waits).
  virtual void wait(c10d::Work& work) = 0;
  // Makes the stream that asynchronous calls restore on current until the result is destroyed
  // (CUDA: cnccl's side stream of the current device, so that the caller's stream never waits
  // for the network; during graph capture the capturing stream stays current).
  virtual std::shared_ptr<void> use_side_stream() = 0;
  // Completes the call's future with `value` on the current stream: a CUDA future records its events
  // on each of its devices' current streams as it completes, and a consumer's wait() (DDP's
  // then() callbacks, fut.wait()) orders its stream after them, so this must run where the restore ran.
  virtual void complete(c10::ivalue::Future& future, const c10::IValue& value) { future.markCompleted(value); }
  // What the device's kernels counted of their casts (docs/design.md, "Telemetry"), when it counts them
  // itself: the CPU's casts count into the calling thread's census instead (compress::CensusScope).
  virtual compress::Census cast_counts() { return {}; }
  // Keeps `buffers` from their allocator until the current stream has run what it holds now
  // (CUDA: record_stream), whatever references the engine drops before then.
  virtual void keep(const std::vector<at::Tensor>& buffers) = 0;
};

// Blocks the host until `work` has ended, rethrowing its failure: through the work's future where it has
// one (gloo completes that before the work itself and runs the future's callbacks, where the restores are,
// in between, so the work's own wait() would never return there), through wait() where it has none (gloo's
// LambdaWork).
void wait_on_host(c10d::Work& work);

std::shared_ptr<Device> make_cpu_device();
// The device of tensors on `device`: the CPU's, or CUDA's in a build with the CUDA path; any other
// throws a ValueError naming it.
std::shared_ptr<Device> make_device_for(const c10::Device& device);

}  // namespace cnccl::composed

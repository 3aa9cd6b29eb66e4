#include "backend/composed/composition.h"

#include <ATen/ATen.h>
#include <ATen/core/LegacyTypeDispatch.h>
#include <c10/core/DeviceGuard.h>

#include <algorithm>
#include <numeric>

#include "backend/checks.h"
#include "backend/composed/composed_work.h"
#include "backend/frames.h"
#include "backend/release_gate.h"
#include "backend/wide_data.h"
#include "backend/work.h"

namespace cnccl::composed {
namespace {

using WorkPtr = c10::intrusive_ptr<c10d::Work>;

template <typename Opts>
Opts with_op(const Opts& opts, RedOp op) {
  Opts inner = opts;
  inner.reduceOp = c10d::ReduceOp(op);
  return inner;
}

// The tensor's elements in logical order, as one flat tensor: a view of a contiguous tensor, a
// copy of any other. Logical order keeps a strided tensor's result equal to its contiguous
// copy's: engines split and order their reductions by position.
at::Tensor flat(const at::Tensor& t) { return t.contiguous().view({-1}); }

// Indices of `tensors`, grouped by dtype in order of first appearance (every rank groups alike).
std::vector<std::vector<size_t>> by_dtype(const std::vector<at::Tensor>& tensors) {
  std::vector<std::vector<size_t>> groups;
  std::vector<at::ScalarType> dtypes;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const auto dtype = tensors[i].scalar_type();
    size_t g = 0;
    while (g < dtypes.size() && dtypes[g] != dtype) ++g;
    if (g == dtypes.size()) {
      dtypes.push_back(dtype);
      groups.emplace_back();
    }
    groups[g].push_back(i);
  }
  return groups;
}

template <typename T>
std::vector<T> pick(const std::vector<T>& all, const std::vector<size_t>& indices) {
  std::vector<T> out;
  for (size_t i : indices) out.push_back(all[i]);
  return out;
}

std::vector<at::Tensor> stages_of(const std::vector<Composition::Staged>& staged) {
  std::vector<at::Tensor> out;
  for (const auto& s : staged) out.push_back(s.stage);
  return out;
}

// Writes an engine's result back into the caller's tensor, on the current stream (the restore's).
void unstage(Device& device, const Composition::Staged& s) {
  const bool in_place = s.target.is_contiguous();
  at::Tensor out = in_place ? flat(s.target) : at::empty({s.target.numel()}, s.target.options());
  if (s.summed) {
    write_scaled_sums(s.stage, out, s.plan.post_scale);
  } else if (s.plan.framed && s.rows) {
    // Frames, [ranks, frame bytes]: every rank's frame of this rank's part (reduce_scatter).
    device.sum_frames_wide(s.stage, out.numel(), s.plan, out);
  } else if (s.plan.framed) {
    // Every owner's frame of its part's sum (allreduce, parts of ceil(n / ranks)).
    const int64_t ranks = s.stage.size(0);
    device.restore_frames(s.stage, (out.numel() + ranks - 1) / ranks, s.plan, out);
  } else if (s.rows) {
    device.sum_wide(s.stage, out, s.plan);
  } else if (s.plan.compress) {
    device.restore(s.stage, out, s.plan);
  } else if (s.plan.post_divisor != 1) {
    out.copy_(at::div(s.stage, s.plan.post_divisor, "trunc"));
  } else {
    out.copy_(s.stage);
  }
  if (!in_place) s.target.copy_(out.view(s.target.sizes()));
}

// The current stream waits for what an engine call produced.
void wait_for(Device& device, const EngineCall& call) {
  if (call.work) device.wait(*call.work);
  device.wait(call.ran);
}

// Asynchronous calls restore on the device's side stream; synchronous ones on the caller's current
// stream, as ProcessGroupNCCL runs them (docs/design.md, "Stream order"). Current until destroyed.
std::shared_ptr<void> restore_stream(Device& device, bool async_op) {
  return async_op ? device.use_side_stream() : nullptr;
}

// The engine work's future, or null for a work that has none.
FuturePtr future_of(c10d::Work& work) {
  try {
    return work.getFuture();
  } catch (const c10::Error&) {
    return nullptr;
  }
}

void record_stats(Stats* stats, const at::Tensor& t, int64_t numel, const Plan& p) {
  if (!stats) return;
  stats->record(traffic(p, numel, numel * t.element_size()));
}

}  // namespace

Composition::Composition(Engine engine, std::shared_ptr<Device> device, const Config& config, Stats* stats, int rank,
                         int size)
    : engine_(std::move(engine)), device_(std::move(device)), config_(config), stats_(stats), rank_(rank),
      size_(size) {}

Plan Composition::plan(const at::Tensor& t, int64_t nbytes, const c10d::ReduceOp& op, bool as_is,
                       bool exact) const {
  const auto planner = exact ? plan_exact_reduction : plan_reduction;
  Plan p = planner(config_, t.scalar_type(), nbytes, op.op_, 1.0, size_);
  // PREMUL_SUM's factor is read only where cnccl applies it itself; otherwise the engine does,
  // and a CUDA tensor factor never travels to the host.
  if (op.op_ == RedOp::PREMUL_SUM && is_staged(p, op, as_is)) {
    // A compressed call's kernels read a tensor factor on its device: nothing waits for it, and a CUDA
    // graph replays it with the value the factor holds then (docs/design.md, "Stream order").
    const at::Tensor on_device = p.compress ? device_->premul_factor_tensor(op, t) : at::Tensor();
    p = planner(config_, t.scalar_type(), nbytes, op.op_, on_device.defined() ? 1.0 : device_->premul_factor(op, t),
                size_);
    p.pre_scale_tensor = on_device;
  }
  // The dither's offsets are kernel arguments taken from a host counter at the call: a captured call
  // would replay them, rounding every replay alike (docs/design.md, "Stream order").
  TORCH_CHECK_VALUE(!(p.stochastic && device_->capturing(t)), "cnccl: rounding=sr (CNCCL_ROUNDING / Options.rounding) "
                    "cannot be captured into a CUDA graph: every replay would reuse the captured call's dither and "
                    "round alike; capture this group's collectives with rounding=rne");
  return p;
}

std::vector<std::vector<size_t>> Composition::calls_for(const std::vector<at::Tensor>& tensors) const {
  if (!engine_.coalesces_mixed_dtypes) return by_dtype(tensors);
  std::vector<size_t> all(tensors.size());
  std::iota(all.begin(), all.end(), 0);
  return tensors.empty() ? std::vector<std::vector<size_t>>{} : std::vector<std::vector<size_t>>{all};
}

bool Composition::is_staged(const Plan& p, const c10d::ReduceOp& op, bool as_is) const {
  const bool scaled_op = op.op_ == RedOp::AVG || op.op_ == RedOp::PREMUL_SUM;
  return p.compress || !as_is || (scaled_op && !engine_.reduces_avg_and_premul);
}

at::Tensor Composition::stage(const at::Tensor& src, const Plan& p, int64_t numel) const {
  const auto dtype = p.compress ? frames::wire_dtype(p.wire) : src.scalar_type();
  return at::empty({numel}, src.options().dtype(dtype));
}

void Composition::stage_into(const at::Tensor& src, const at::Tensor& dst, const Plan& p,
                             const compress::Dither& dither, uint64_t first) const {
  device_->run([device = device_, src, dst, p, dither, first] {
    if (p.compress) return device->cast(flat(src), dst, p, dither, first);
    dst.copy_(flat(src));
    if (p.pre_scale != 1.0) dst.mul_(p.pre_scale);
  });
}

// The work's synchronize() orders what the engine ran on its own stream; the event, what it ran on
// the issuing stream: a synchronous call's kernels, and all of an IntraNodeCommWork's (whose
// synchronize() orders nothing; ENABLE_INTRA_NODE_COMM=1).
EngineCall Composition::called(WorkPtr work) const { return {std::move(work), device_->record()}; }

std::pair<compress::Dither, compress::Dither> Composition::dithers(const Plan& p, int64_t numel) {
  const auto seq = static_cast<uint32_t>(p.stochastic && numel > 0 ? stochastic_seq_++ : 0);
  return {compress::contribution_dither(p.sr_seed, seq, uint32_t(rank_)), compress::sum_dither(p.sr_seed, seq)};
}

Composition::WorkPtr Composition::to_owners(const at::Tensor& sent, const at::Tensor& rows, const Timing& timing) {
  c10d::AllToAllOptions opts;
  opts.timeout = timing.timeout;
  opts.asyncOp = timing.async_op;
  std::vector<int64_t> equal_splits;
  at::Tensor out = rows.view({-1}), in = sent.view({-1});
  return inner().alltoall_base(out, in, equal_splits, equal_splits, opts);
}

void Composition::wait_for_owners(const EngineCall& call, const std::vector<at::Tensor>& buffers) const {
  try {
    wait_for(*device_, call);
  } catch (...) {
    // gloo: the host waited, and the all-to-all failed; nothing was written back yet.
    std::rethrow_exception(errors::as_backend_error(
        std::current_exception(), "cnccl (over " + engine_.name + "): the all-to-all to the owners failed"));
  }
  // The engine dropped its references to the buffers at that wait (ProcessGroupNCCL unstashes them in
  // synchronize()), and the call may yet fail before finish() keeps them: kept here on the stream that
  // uses them next (record_stream holds a block until the streams it names pass the point of its release).
  device_->keep(buffers);
}

int64_t Composition::owner_chunks(int64_t wire_bytes, int64_t part) {
  // Fewer chunks would save nothing: two hold what one does (the stage, twice half of it more).
  return wire_bytes >= kOwnerChunks * kOwnerChunkBytes && part >= kOwnerChunks ? kOwnerChunks : 1;
}

Composition::Issued Composition::allreduce_fp32_sums(const at::Tensor& t, const Plan& p, const Timing& timing) {
  if (p.framed) return allreduce_frames(t, p, timing);
  const int64_t n = t.numel(), part = (n + size_ - 1) / size_;
  const auto [contributions, sums] = dithers(p, n);
  at::Tensor sent = stage(t, p, part * size_);
  stage_into(t, sent.narrow(0, 0, n), p, contributions);
  if (part * size_ > n) device_->run([pad = sent.narrow(0, n, part * size_ - n)] { pad.zero_(); });
  const at::Tensor parts = sent.view({size_, part});
  // This rank's sum lands in its own row of `sent` once the all-to-all has read it there, and the
  // allgather gathers in place (both engines allow it: NCCL by the pointers, gloo through a flat
  // buffer of its own). In chunks the columns go out a piece at a time through `outgoing`
  // (docs/design.md, "Memory"); one chunk sends `sent` itself.
  const int64_t chunks = owner_chunks(sent.nbytes(), part), width = (part + chunks - 1) / chunks;
  at::Tensor rows = stage(t, p, size_ * width);
  at::Tensor outgoing = chunks > 1 ? at::empty_like(rows) : sent;
  const at::Tensor mine = parts[rank_];
  std::vector<EngineCall> calls;
  std::shared_ptr<void> on_restore_stream;
  for (int64_t first = 0; first < part; first += width) {
    const int64_t cols = std::min(width, part - first);
    const at::Tensor out = rows.narrow(0, 0, size_ * cols), in = outgoing.narrow(0, 0, size_ * cols);
    if (chunks > 1) {
      // On the stream of the sum before: the engine's read of the last chunk was waited for there.
      device_->run([in, src = parts.narrow(1, first, cols), size = size_, cols] { in.view({size, cols}).copy_(src); });
    }
    calls.push_back(called(to_owners(in, out, timing)));
    // The owner's sum, the next chunk and the allgather run on the stream the restore will: never
    // make the caller's stream wait for the network (docs/design.md, "Stream order"). The engine
    // issues the next chunk after what that stream holds, the sum that read `rows` included.
    if (calls.size() == 1) on_restore_stream = restore_stream(*device_, timing.async_op);
    wait_for_owners(calls.back(), {sent, rows, outgoing});
    device_->sum(out.view({size_, cols}), mine.narrow(0, first, cols), p, sums, uint64_t(rank_ * part + first));
  }
  c10d::AllgatherOptions back;
  back.timeout = timing.timeout;
  back.asyncOp = timing.async_op;
  at::Tensor mine_in = mine;
  calls.push_back(called(inner()._allgather_base(sent, mine_in, back)));
  // Every all-to-all's failure shows on its own work (NCCL's watchdog sets it there): the restore
  // waits on each.
  std::vector<at::Tensor> buffers{sent, rows};
  if (chunks > 1) buffers.push_back(outgoing);
  return {std::move(calls), {sent.narrow(0, 0, n), t, p}, std::move(buffers)};
}

Composition::FramesAtOwners Composition::frames_to_owners(const at::Tensor& frames, const Timing& timing) {
  FramesAtOwners at;
  const int64_t frame = frames.size(1);
  if (frames.nbytes() < kFrameChunks * kOwnerChunkBytes || frame < kFrameChunks * 4) {
    at.frames = at::empty_like(frames);
    at.calls.push_back(called(to_owners(frames, at.frames, timing)));
    at.buffers = {frames, at.frames};
    return at;
  }
  // Whole 4-byte words a chunk (every frame is).
  const int64_t width = (frame / 4 + kFrameChunks - 1) / kFrameChunks * 4;
  const at::Tensor outgoing = at::empty({size_ * width}, frames.options()), incoming = at::empty_like(outgoing);
  at.frames = frames;
  at.buffers = {frames, outgoing, incoming};
  for (int64_t first = 0; first < frame; first += width) {
    const int64_t cols = std::min(width, frame - first);
    const at::Tensor columns = frames.narrow(1, first, cols);
    const at::Tensor in = outgoing.narrow(0, 0, size_ * cols).view({size_, cols});
    const at::Tensor out = incoming.narrow(0, 0, size_ * cols).view({size_, cols});
    // On the stream of the copy before: the engine's read of the last chunk was waited for there.
    device_->run([in, columns] { in.copy_(columns); });
    at.calls.push_back(called(to_owners(in, out, timing)));
    // As allreduce_fp32_sums's: the copies, the next chunk and what follows on the restore's stream.
    if (at.calls.size() == 1) at.on_restore_stream = restore_stream(*device_, timing.async_op);
    wait_for_owners(at.calls.back(), at.buffers);
    // Columns already sent take what came back for them.
    device_->run([columns, out] { columns.copy_(out); });
  }
  at.waited = true;
  return at;
}

Composition::Issued Composition::allreduce_frames(const at::Tensor& t, const Plan& p, const Timing& timing) {
  const int64_t n = t.numel(), part = (n + size_ - 1) / size_;
  const auto [contributions, sums] = dithers(p, n);
  const at::Tensor sent = at::empty({size_, frames::frame_bytes(part, p.wire)}, t.options().dtype(at::kByte));
  // A strided t's contiguous copy is device work too, on the stream the encoding runs on.
  device_->run([device = device_, t, p, sent, part, size = size_, contributions = contributions] {
    device->encode_frames(frames::parts_of(flat(t), size, part), part, p, sent, contributions);
  });
  FramesAtOwners at = frames_to_owners(sent, timing);
  if (!at.waited) {
    at.on_restore_stream = restore_stream(*device_, timing.async_op);
    wait_for_owners(at.calls.back(), at.buffers);
  }
  // The owner's frame of its sums takes the place of its own contribution's, and the allgather gathers
  // around it in place (as allreduce_fp32_sums's).
  const at::Tensor mine = at.frames[rank_];
  device_->sum_frames(at.frames, part, p, mine, sums, uint64_t(rank_ * part));
  at::Tensor gathered = at.frames.view({-1}), mine_flat = mine.view({-1});
  c10d::AllgatherOptions back;
  back.timeout = timing.timeout;
  back.asyncOp = timing.async_op;
  at.calls.push_back(called(inner()._allgather_base(gathered, mine_flat, back)));
  return {std::move(at.calls), {at.frames, t, p}, std::move(at.buffers)};
}

Composition::Issued Composition::reduce_scatter_fp32_sums(const std::vector<at::Tensor>& parts,
                                                          const at::Tensor& output, const Plan& p,
                                                          const Timing& timing) {
  const int64_t each = output.numel();
  // The sums land in the stage already sent, which holds them from two ranks on (4 bytes against 2 x ranks).
  if (!p.framed && size_ >= 2 && owner_chunks(2 * each * size_, each) > 1) {
    return reduce_scatter_in_chunks(parts, output, p, timing);
  }
  if (p.framed) {
    const at::Tensor sent = at::empty({size_, frames::frame_bytes(each, p.wire)}, output.options().dtype(at::kByte));
    device_->encode_frames(parts, each, p, sent, dithers(p, each).first);
    FramesAtOwners at = frames_to_owners(sent, timing);
    Staged staged{at.frames, output, p};
    staged.rows = true;
    return {std::move(at.calls), staged, std::move(at.buffers)};
  }
  const at::Tensor sent = stage(output, p, each * size_).view({size_, each});
  const compress::Dither contributions = dithers(p, each).first;
  for (int i = 0; i < size_; ++i) stage_into(parts[i], sent[i], p, contributions, uint64_t(i * each));
  at::Tensor rows = at::empty_like(sent);
  EngineCall call = called(to_owners(sent, rows, timing));
  Staged staged{rows, output, p};
  staged.rows = true;
  return {{call}, staged, {sent}};
}

Composition::Issued Composition::reduce_scatter_in_chunks(const std::vector<at::Tensor>& parts,
                                                          const at::Tensor& output, const Plan& p,
                                                          const Timing& timing) {
  const int64_t each = output.numel(), chunks = owner_chunks(2 * each * size_, each);
  const int64_t width = (each + chunks - 1) / chunks;
  // Chunk-major: chunk c's columns of every part, [ranks, columns], one block that goes out as it is.
  // Its fp32 sums take bytes [4 first, 4 (first + columns)) of the stage, which its all-to-all and the
  // ones before it have read ([0, 2 ranks (first + columns))); an even count makes the fp32 view.
  const at::Tensor store = stage(output, p, (each * size_ + 1) / 2 * 2);
  const at::Tensor sent = store.narrow(0, 0, each * size_);
  const at::Tensor sums = store.view(at::kFloat).narrow(0, 0, each);
  const compress::Dither contributions = dithers(p, each).first;
  std::vector<at::Tensor> flats;
  for (const auto& part : parts) flats.push_back(flat(part));
  for (int64_t first = 0; first < each; first += width) {
    const int64_t cols = std::min(width, each - first);
    const at::Tensor block = sent.narrow(0, size_ * first, size_ * cols).view({size_, cols});
    for (int i = 0; i < size_; ++i) {
      stage_into(flats[i].narrow(0, first, cols), block[i], p, contributions, uint64_t(i * each + first));
    }
  }
  at::Tensor rows = stage(output, p, size_ * width);
  Plan unscaled = p;
  unscaled.post_scale = 1.0;
  std::vector<EngineCall> calls;
  std::shared_ptr<void> on_restore_stream;
  for (int64_t first = 0; first < each; first += width) {
    const int64_t cols = std::min(width, each - first);
    const at::Tensor in = sent.narrow(0, size_ * first, size_ * cols), out = rows.narrow(0, 0, size_ * cols);
    calls.push_back(called(to_owners(in, out, timing)));
    // As allreduce_fp32_sums's: the sums on the restore's stream, which the next chunk's engine call
    // waits on before it receives into `rows`.
    if (calls.size() == 1) on_restore_stream = restore_stream(*device_, timing.async_op);
    wait_for_owners(calls.back(), {store, rows});
    device_->sum_wide(out.view({size_, cols}), sums.narrow(0, first, cols), unscaled);
  }
  Staged staged{sums, output, p};
  staged.summed = true;
  return {std::move(calls), staged, {store, rows}};
}

c10::intrusive_ptr<c10d::Work> Composition::allreduce(std::vector<at::Tensor>& tensors,
                                                      const c10d::AllreduceOptions& opts) {
  TORCH_CHECK_VALUE(tensors.size() == 1, "cnccl allreduce: expects exactly one tensor, got ", tensors.size());
  const at::Tensor& t = tensors[0];
  checks::on_device_of(t, t, "allreduce");
  const Plan p = plan(t, t.nbytes(), opts.reduceOp, t.is_contiguous());
  record_stats(stats_, t, t.numel(), p);
  if (!is_staged(p, opts.reduceOp, t.is_contiguous())) return inner().allreduce(tensors, opts);
  c10::DeviceGuard guard(t.device());
  const Timing timing{opts.timeout, opts.asyncOp};
  if (has_fp32_sums(p, t.numel())) {
    Issued issued = allreduce_fp32_sums(t, p, timing);
    return finish(c10d::OpType::ALLREDUCE, "allreduce", timing, issued.calls, {issued.staged}, issued.buffers,
                  tensors);
  }
  std::vector<at::Tensor> stages{stage(t, p, t.numel())};
  stage_into(t, stages[0], p);
  EngineCall call = called(inner().allreduce(stages, with_op(opts, p.inner_op)));
  return finish(c10d::OpType::ALLREDUCE, "allreduce", timing, {call}, {{stages[0], t, p}}, {}, tensors);
}

c10::intrusive_ptr<c10d::Work> Composition::allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                                const c10d::AllreduceCoalescedOptions& opts) {
  TORCH_CHECK_VALUE(!tensors.empty(), "cnccl allreduce_coalesced: no tensors");
  std::vector<at::Tensor> direct;
  std::vector<Staged> staged;
  std::vector<std::pair<at::Tensor, Plan>> fp32_sums;
  for (const auto& t : tensors) {
    checks::on_device_of(t, tensors[0], "allreduce_coalesced");
    // Planned once: a plan may read a PREMUL_SUM's CUDA tensor factor on the host (Composition::plan).
    const Plan p = plan(t, t.nbytes(), opts.reduceOp, t.is_contiguous());
    record_stats(stats_, t, t.numel(), p);
    if (has_fp32_sums(p, t.numel())) {
      fp32_sums.emplace_back(t, p);
    } else if (is_staged(p, opts.reduceOp, t.is_contiguous())) {
      staged.push_back({stage(t, p, t.numel()), t, p});
    } else {
      direct.push_back(t);
    }
  }
  const bool one_call = by_dtype(tensors).size() == 1 || engine_.coalesces_mixed_dtypes;
  if (staged.empty() && fp32_sums.empty() && one_call) return inner().allreduce_coalesced(tensors, opts);
  c10::DeviceGuard guard(tensors[0].device());
  for (const auto& s : staged) stage_into(s.target, s.stage, s.plan);
  // Staged tensors reduce with the plan's inner op (their scales are already applied), the
  // others with the caller's: each kind is its own coalesced call, and each dtype too (engines
  // refuse mixed ones). Every rank splits alike.
  std::vector<EngineCall> calls;
  const std::vector<at::Tensor> stages = stages_of(staged);
  for (const auto& group : calls_for(stages)) {
    auto part = pick(stages, group);
    calls.push_back(called(inner().allreduce_coalesced(part, with_op(opts, staged[group[0]].plan.inner_op))));
  }
  for (const auto& group : calls_for(direct)) {
    auto part = pick(direct, group);
    calls.push_back(called(inner().allreduce_coalesced(part, opts)));
  }
  // Each tensor with fp32 sums is its own all-to-all and allgather.
  const Timing timing{opts.timeout, opts.asyncOp};
  std::vector<at::Tensor> buffers;
  for (const auto& [t, p] : fp32_sums) {
    Issued issued = allreduce_fp32_sums(t, p, timing);
    calls.insert(calls.end(), issued.calls.begin(), issued.calls.end());
    staged.push_back(issued.staged);
    buffers.insert(buffers.end(), issued.buffers.begin(), issued.buffers.end());
  }
  return finish(c10d::OpType::ALLREDUCE_COALESCED, "allreduce_coalesced", timing, std::move(calls),
                std::move(staged), std::move(buffers), tensors);
}

c10::intrusive_ptr<c10d::Work> Composition::reduce_scatter_tensor(at::Tensor& output, at::Tensor& input,
                                                                  const c10d::ReduceScatterOptions& opts) {
  checks::reduce_scatter_sizes(output, input, size_, "reduce_scatter_tensor");
  const bool contiguous = input.is_contiguous() && output.is_contiguous();
  const Plan p = plan(input, input.nbytes(), opts.reduceOp, contiguous);
  record_stats(stats_, input, input.numel(), p);
  if (!is_staged(p, opts.reduceOp, contiguous)) return inner()._reduce_scatter_base(output, input, opts);
  c10::DeviceGuard guard(input.device());
  const Timing timing{opts.timeout, opts.asyncOp};
  if (has_fp32_sums(p, output.numel())) {
    Issued issued = reduce_scatter_fp32_sums(flat(input).chunk(size_), output, p, timing);
    return finish(c10d::OpType::_REDUCE_SCATTER_BASE, "reduce_scatter_tensor", timing, issued.calls,
                  {issued.staged}, issued.buffers, {output});
  }
  at::Tensor stage_in = stage(input, p, input.numel());
  stage_into(input, stage_in, p);
  at::Tensor stage_out = stage(input, p, output.numel());
  EngineCall call = called(inner()._reduce_scatter_base(stage_out, stage_in, with_op(opts, p.inner_op)));
  return finish(c10d::OpType::_REDUCE_SCATTER_BASE, "reduce_scatter_tensor", timing, {call},
                {{stage_out, output, p}}, {stage_in}, {output});
}

c10::intrusive_ptr<c10d::Work> Composition::reduce_scatter(std::vector<at::Tensor>& outputs,
                                                           std::vector<std::vector<at::Tensor>>& inputs,
                                                           const c10d::ReduceScatterOptions& opts) {
  TORCH_CHECK_VALUE(outputs.size() == 1 && inputs.size() == 1, "cnccl reduce_scatter: expects one output and one "
                    "input list, got ", outputs.size(), " and ", inputs.size());
  const at::Tensor& out = outputs[0];
  checks::on_device_of(out, out, "reduce_scatter");
  TORCH_CHECK_VALUE(int(inputs[0].size()) == size_, "cnccl reduce_scatter: input list has ", inputs[0].size(),
                    " tensors, expected one per rank (", size_, ")");
  for (const auto& in : inputs[0]) {
    checks::on_device_of(in, out, "reduce_scatter");
    TORCH_CHECK_TYPE(in.scalar_type() == out.scalar_type(), "cnccl reduce_scatter: input dtype ", in.scalar_type(),
                     " does not match output dtype ", out.scalar_type());
    TORCH_CHECK_VALUE(in.numel() == out.numel(), "cnccl reduce_scatter: an input has ", in.numel(),
                      " elements, expected the output's ", out.numel());
  }
  bool contiguous = out.is_contiguous();
  for (const auto& in : inputs[0]) contiguous = contiguous && in.is_contiguous();
  const Plan p = plan(out, out.nbytes() * size_, opts.reduceOp, contiguous);
  record_stats(stats_, out, out.numel() * size_, p);
  if (!is_staged(p, opts.reduceOp, contiguous)) return inner().reduce_scatter(outputs, inputs, opts);
  c10::DeviceGuard guard(out.device());
  const Timing timing{opts.timeout, opts.asyncOp};
  if (has_fp32_sums(p, out.numel())) {
    Issued issued = reduce_scatter_fp32_sums(inputs[0], out, p, timing);
    return finish(c10d::OpType::REDUCE_SCATTER, "reduce_scatter", timing, issued.calls, {issued.staged},
                  issued.buffers, outputs);
  }
  // The list goes out as one flat staged buffer, written part by part: the engine's own list
  // form would copy the inputs into one first.
  at::Tensor stage_in = stage(out, p, out.numel() * size_);
  for (int i = 0; i < size_; ++i) stage_into(inputs[0][i], stage_in.narrow(0, i * out.numel(), out.numel()), p);
  at::Tensor stage_out = stage(out, p, out.numel());
  EngineCall call = called(inner()._reduce_scatter_base(stage_out, stage_in, with_op(opts, p.inner_op)));
  return finish(c10d::OpType::REDUCE_SCATTER, "reduce_scatter", timing, {call}, {{stage_out, out, p}}, {stage_in},
                outputs);
}

c10::intrusive_ptr<c10d::Work> Composition::reduce_scatter_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                            std::vector<at::Tensor>& inputs,
                                                                            const c10d::ReduceScatterOptions& opts) {
  TORCH_CHECK_VALUE(outputs.size() == inputs.size() && !inputs.empty(), "cnccl reduce_scatter_tensor_coalesced: "
                    "needs as many outputs as inputs, got ", outputs.size(), " and ", inputs.size());
  std::vector<at::Tensor> direct_in, direct_out, staged_in, stage_ins;
  std::vector<Staged> staged;
  std::vector<size_t> fp32_sums;
  std::vector<Plan> fp32_plans;
  for (size_t i = 0; i < inputs.size(); ++i) {
    checks::on_device_of(inputs[i], inputs[0], "reduce_scatter_tensor_coalesced");
    checks::reduce_scatter_sizes(outputs[i], inputs[i], size_, "reduce_scatter_tensor_coalesced");
    const bool contiguous = inputs[i].is_contiguous() && outputs[i].is_contiguous();
    const Plan p = plan(inputs[i], inputs[i].nbytes(), opts.reduceOp, contiguous);
    record_stats(stats_, inputs[i], inputs[i].numel(), p);
    if (has_fp32_sums(p, outputs[i].numel())) {
      fp32_sums.push_back(i);
      fp32_plans.push_back(p);
    } else if (is_staged(p, opts.reduceOp, contiguous)) {
      staged_in.push_back(inputs[i]);
      stage_ins.push_back(stage(inputs[i], p, inputs[i].numel()));
      staged.push_back({stage(inputs[i], p, outputs[i].numel()), outputs[i], p});
    } else {
      direct_in.push_back(inputs[i]);
      direct_out.push_back(outputs[i]);
    }
  }
  const bool one_call = by_dtype(inputs).size() == 1 || engine_.coalesces_mixed_dtypes;
  if (staged.empty() && fp32_sums.empty() && one_call) {
    return inner().reduce_scatter_tensor_coalesced(outputs, inputs, opts);
  }
  c10::DeviceGuard guard(inputs[0].device());
  for (size_t i = 0; i < staged.size(); ++i) stage_into(staged_in[i], stage_ins[i], staged[i].plan);
  std::vector<EngineCall> calls;
  const std::vector<at::Tensor> stage_outs = stages_of(staged);
  for (const auto& group : calls_for(stage_outs)) {
    auto outs = pick(stage_outs, group);
    auto ins = pick(stage_ins, group);
    calls.push_back(called(
        inner().reduce_scatter_tensor_coalesced(outs, ins, with_op(opts, staged[group[0]].plan.inner_op))));
  }
  for (const auto& group : calls_for(direct_in)) {
    auto outs = pick(direct_out, group);
    auto ins = pick(direct_in, group);
    calls.push_back(called(inner().reduce_scatter_tensor_coalesced(outs, ins, opts)));
  }
  // Each tensor with fp32 sums is its own all-to-all.
  const Timing timing{opts.timeout, opts.asyncOp};
  for (size_t k = 0; k < fp32_sums.size(); ++k) {
    const size_t i = fp32_sums[k];
    Issued issued = reduce_scatter_fp32_sums(flat(inputs[i]).chunk(size_), outputs[i], fp32_plans[k], timing);
    calls.insert(calls.end(), issued.calls.begin(), issued.calls.end());
    staged.push_back(issued.staged);
    stage_ins.insert(stage_ins.end(), issued.buffers.begin(), issued.buffers.end());
  }
  // The inputs that went to the engine as they are must be kept too: the engine drops its own
  // references to them when the restore's stream waits on it.
  stage_ins.insert(stage_ins.end(), direct_in.begin(), direct_in.end());
  return finish(c10d::OpType::COALESCED, "reduce_scatter_tensor_coalesced", timing, std::move(calls),
                std::move(staged), std::move(stage_ins), outputs);
}

c10::intrusive_ptr<c10d::Work> Composition::reduce(std::vector<at::Tensor>& tensors, const c10d::ReduceOptions& opts) {
  TORCH_CHECK_VALUE(tensors.size() == 1, "cnccl reduce: expects exactly one tensor, got ", tensors.size());
  const at::Tensor& t = tensors[0];
  checks::on_device_of(t, t, "reduce");
  const bool root = opts.rootRank == rank_;
  const bool as_is = t.is_contiguous() && (root || engine_.reduce_keeps_non_root);
  const Plan p = plan(t, t.nbytes(), opts.reduceOp, as_is, /*exact=*/true);
  record_stats(stats_, t, t.numel(), p);
  if (!is_staged(p, opts.reduceOp, as_is)) return inner().reduce(tensors, opts);
  c10::DeviceGuard guard(t.device());
  std::vector<at::Tensor> stages{stage(t, p, t.numel())};
  stage_into(t, stages[0], p);
  EngineCall call = called(inner().reduce(stages, with_op(opts, p.inner_op)));
  std::vector<Staged> staged;
  if (root) staged.push_back({stages[0], t, p});
  return finish(c10d::OpType::REDUCE, "reduce", {opts.timeout, opts.asyncOp}, {call}, std::move(staged), stages,
                tensors);
}

c10::intrusive_ptr<c10d::Work> Composition::allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                                std::vector<at::Tensor>& inputs,
                                                                const c10d::AllgatherOptions& opts) {
  const auto groups = by_dtype(inputs);
  if (groups.size() <= 1 || engine_.coalesces_mixed_dtypes) return inner().allgather_coalesced(outputs, inputs, opts);
  TORCH_CHECK_VALUE(int(outputs.size()) == size_, "cnccl allgather_coalesced: expected one output list per rank (",
                    size_, "), got ", outputs.size());
  std::vector<EngineCall> calls;
  std::vector<at::Tensor> all_outputs;
  for (const auto& list : outputs) {
    TORCH_CHECK_VALUE(list.size() == inputs.size(), "cnccl allgather_coalesced: each output list needs one tensor per "
                      "input (", inputs.size(), "), got ", list.size());
    all_outputs.insert(all_outputs.end(), list.begin(), list.end());
  }
  c10::DeviceGuard guard(inputs[0].device());
  for (const auto& group : groups) {
    std::vector<std::vector<at::Tensor>> outs;
    for (const auto& list : outputs) outs.push_back(pick(list, group));
    auto ins = pick(inputs, group);
    calls.push_back(called(inner().allgather_coalesced(outs, ins, opts)));
  }
  return finish(c10d::OpType::ALLGATHER_COALESCED, "allgather_coalesced", {opts.timeout, opts.asyncOp},
                std::move(calls), {}, {}, all_outputs);
}

WorkPtr Composition::finish(c10d::OpType type, const char* name, const Timing& timing, std::vector<EngineCall> calls,
                            std::vector<Staged> staged, std::vector<at::Tensor> inputs,
                            std::vector<at::Tensor> outputs) {
  const at::Device device = outputs.front().device();
  // CPU futures take no devices; CUDA ones record events on the current streams.
  const std::vector<c10::Device> devices = device.is_cpu() ? std::vector<c10::Device>{} : std::vector{device};
  const auto list_type = c10::ListType::create(c10::TensorType::get());
  const std::string context = std::string("cnccl ") + name + " (over " + engine_.name + ")";
  // The futures say when the host may enqueue the restores (CUDA: at once, NCCL's complete at
  // issue; gloo: once it is done); the device orders them (wait_for each call).
  std::vector<FuturePtr> futures;
  std::vector<WorkPtr> works;
  for (const auto& call : calls) {
    if (!call.work) continue;
    if (FuturePtr f = future_of(*call.work)) {
      works.push_back(call.work);
      futures.push_back(std::move(f));
      continue;
    }
    // Some of gloo's works (reduce_scatter_single in torch 2.15, a LambdaWork) have no future to chain on:
    // waited here, and done; not kept for the work's isCompleted(), which a LambdaWork never reports.
    try {
      call.work->wait();
    } catch (...) {
      std::rethrow_exception(
          errors::as_backend_error(std::current_exception(), context + ": the inner collective failed"));
    }
  }
  // Everything the engine or the restores touch: the device keeps it from the allocator until done.
  std::vector<at::Tensor> buffers = std::move(inputs);
  for (const auto& s : staged) buffers.push_back(s.stage);
  buffers.insert(buffers.end(), outputs.begin(), outputs.end());
  auto result = c10::make_intrusive<c10::ivalue::Future>(list_type, devices);
  if (stats_) {
    std::string wire = "none";
    for (const auto& s : staged) wire = s.plan.compress ? compress::wire_name(s.plan.wire) : wire;
    profile_collective(type, outputs, wire, result);
  }
  auto work = c10::make_intrusive<ComposedWork>(rank_, type, context, seq_++, std::move(works), result, outputs,
                                                device_);
  auto restore = [device_of = device_, device, work, result, futures, calls = std::move(calls),
                  staged = std::move(staged), buffers = std::move(buffers), outputs, context,
                  async_op = timing.async_op] {
    for (const auto& f : futures) {
      if (f->hasError()) {
        // Nothing was written back: the caller's tensors hold what they held before the call.
        result->setError(errors::as_backend_error(f->exception_ptr(), context + ": the inner collective failed"));
        return;
      }
    }
    try {
      // gloo runs this on its worker thread, with that thread's grad mode (a C++ future's callbacks
      // do not carry the adding thread's state): writes into the caller's tensors stay below
      // autograd, as every cnccl thread's do (docs/design.md, "Threads and autograd").
      const at::AutoDispatchBelowADInplaceOrView below_autograd;
      const c10::DeviceGuard guard(device);
      const auto on_restore_stream = restore_stream(*device_of, async_op);
      for (const auto& call : calls) wait_for(*device_of, call);
      // Kept before anything that may throw: the waits above let the engine drop its references.
      device_of->keep(buffers);
      device_of->run([device_of, staged] {
        for (const auto& s : staged) unstage(*device_of, s);
      });
      work->set_restored(device_of->record());
      device_of->complete(*result, c10::IValue(outputs));
    } catch (...) {
      if (!result->completed()) result->setError(errors::as_backend_error(std::current_exception(), context));
    }
  };
  const bool all_done = std::all_of(futures.begin(), futures.end(), [](const FuturePtr& f) { return f->completed(); });
  if (all_done) {
    restore();
  } else {
    // The engine's thread runs it (it completes the result's future, which runs its callbacks) and
    // drops it, perhaps with the last reference to a caller's tensors: through the gate
    // (docs/design.md, "Threads", at exit).
    auto on_done = [restore = std::function<void()>(restore)](c10::ivalue::Future&) mutable {
      release_gate::run_then_drop(restore);
    };
    if (futures.size() == 1) {
      futures[0]->addCallback(std::move(on_done));
    } else {
      c10::List<FuturePtr> list(c10::FutureType::create(c10::AnyType::get()));
      for (const auto& f : futures) list.push_back(f);
      c10::collectAll(list)->addCallback(std::move(on_done));
    }
  }
  if (!timing.async_op) work->wait();
  return work;
}

}  // namespace cnccl::composed

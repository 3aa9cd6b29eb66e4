// The composed path (docs/design.md, "The composed path"): cnccl's compression wrapped around an
// inner c10d engine (ProcessGroupNCCL for CUDA tensors; ProcessGroupGloo for CPU tensors with
// cpu_engine=gloo). For each allreduce / reduce_scatter: plan -> stage (cast to 16 bits) ->
// inner collective -> restore into the caller's tensors, with a future that completes after the
// restore. It knows neither the engine nor the device: the Device interface holds what differs.
#pragma once

#include <torch/csrc/distributed/c10d/Backend.hpp>

#include <atomic>
#include <memory>
#include <string>

#include "backend/composed/device.h"
#include "backend/options.h"
#include "backend/stats.h"

namespace cnccl::composed {

// What one engine call left for the restore to wait on: its work (none for a synchronous call) and a
// point on the issuing stream right after it; the restore waits on both (docs/design.md, "Stream order").
struct EngineCall {
  c10::intrusive_ptr<c10d::Work> work;
  EventPtr ran;
};

struct Engine {
  c10::intrusive_ptr<c10d::Backend> backend;
  std::string name;  // "nccl", "gloo": for messages
  // What gloo lacks and the composition makes up for. NCCL has all three.
  // AVG and PREMUL_SUM (gloo has no PREMUL_SUM and no integer AVG): the composition applies their
  // scales around a SUM, as it does when compressing.
  bool reduces_avg_and_premul = true;
  // gloo's reduce overwrites the non-root ranks' tensors: they reduce a copy instead.
  bool reduce_keeps_non_root = true;
  // gloo refuses allreduce_coalesced of mixed dtypes and garbles allgather_coalesced of them:
  // such calls go out as one coalesced call per dtype.
  bool coalesces_mixed_dtypes = true;

  // torch's ProcessGroupGloo, CPU or CUDA tensors: it has none of the three.
  static Engine gloo(c10::intrusive_ptr<c10d::Backend> backend) {
    return {std::move(backend), "gloo", /*reduces_avg_and_premul=*/false, /*reduce_keeps_non_root=*/false,
            /*coalesces_mixed_dtypes=*/false};
  }
};

class Composition {
 public:
  // `stats`: where the composition counts its collectives and whether it opens their profiler
  // ranges; null where the caller already does both (the gloo issuer, issued_path.h).
  Composition(Engine engine, std::shared_ptr<Device> device, const Config& config, Stats* stats, int rank, int size);

  // Every collective that is not an allreduce or reduce_scatter goes straight to the engine.
  c10d::Backend& inner() { return *engine_.backend; }
  const std::string& engine_name() const { return engine_.name; }

  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors, const c10d::AllreduceOptions& opts);
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                     const c10d::AllreduceCoalescedOptions& opts);
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts);
  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor(at::Tensor& output, at::Tensor& input,
                                                       const c10d::ReduceScatterOptions& opts);
  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                 std::vector<at::Tensor>& inputs,
                                                                 const c10d::ReduceScatterOptions& opts);
  // Never compressed (docs/design.md, "Semantics"); staged only for
  // what the engine lacks.
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors, const c10d::ReduceOptions& opts);
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                     std::vector<at::Tensor>& inputs,
                                                     const c10d::AllgatherOptions& opts);

  // One tensor staged for the engine: a 16-bit copy (compressed) or a scaled copy in its own
  // dtype (an op the engine lacks, or a strided tensor). The result goes back into `target`,
  // unless there is none (reduce's non-root ranks).
  struct Staged {
    at::Tensor stage;
    at::Tensor target;
    Plan plan;
    // `stage` holds every rank's contribution, one row each: the restore sums them in fp32
    // (a reduce_scatter with fp32 sums). With plan.framed the stage is frames, one row each.
    bool rows = false;
    // `stage` holds the fp32 sums themselves, unscaled (a reduce_scatter summed chunk by chunk).
    bool summed = false;
  };

 private:
  using WorkPtr = c10::intrusive_ptr<c10d::Work>;

  // A compressed reduction with fp32 sums (plan.fp32_sum; docs/design.md, "Numerics"), issued:
  // the engine's works, what the restore reads and writes, and the buffers the engine uses.
  struct Issued {
    std::vector<EngineCall> calls;
    Staged staged;
    std::vector<at::Tensor> buffers;
  };
  // The 16-bit stage goes to each part's owner in one alltoall_base; the owner sums the rows in
  // fp32 in rank order and rounds once (Device::sum, after the engine's alltoall), and
  // _allgather_base brings every part back. Parts are equal, the last padded with zeros.
  // Row q of `sent` ([ranks, ...], or flat in ranks equal parts) to rank q, in one alltoall_base;
  // `rows` (shaped like `sent`) receives every rank's row for this one, rank 0 first.
  // The caller's timeout, and whether the call is asynchronous: every engine call it makes is too.
  struct Timing {
    std::chrono::milliseconds timeout;
    bool async_op;
  };
  WorkPtr to_owners(const at::Tensor& sent, const at::Tensor& rows, const Timing& timing);
  // With p.framed, allreduce_frames instead. The owner's sum and the allgather run on the stream the
  // restore will, after the all-to-all. From kOwnerChunks x kOwnerChunkBytes of wire on, the all-to-all
  // goes in kOwnerChunks column chunks, each summed before the next is received into the same buffer:
  // the call holds (1 + 2/chunks) x the wire's bytes (docs/design.md, "Numerics", Memory).
  Issued allreduce_fp32_sums(const at::Tensor& t, const Plan& p, const Timing& timing);
  static constexpr int64_t kOwnerChunks = 4;
  static constexpr int64_t kOwnerChunkBytes = int64_t(1) << 20;
  // How many chunks the all-to-all of `wire_bytes` in parts of `part` elements goes in.
  static int64_t owner_chunks(int64_t wire_bytes, int64_t part);
  // The current stream waits for an all-to-all to the owners, and keeps `buffers` for what it runs next.
  void wait_for_owners(const EngineCall& call, const std::vector<at::Tensor>& buffers) const;
  // The same in frames (backend/frames.h): the owner decodes and sums the frames it
  // receives, frames its sum with the sum's own exponent where its own frame was, and the allgather
  // moves frames around it.
  Issued allreduce_frames(const at::Tensor& t, const Plan& p, const Timing& timing);
  // Frames ([ranks, frame bytes], row q for rank q) at their owners: `frames` then holds every rank's
  // frame for this one, rank 0 first. From kFrameChunks x kOwnerChunkBytes of frames on, the all-to-all
  // goes in kFrameChunks column chunks through one buffer each way, each chunk received into the columns
  // it was sent from, so that the call holds (1 + 2/kFrameChunks) x the frames' bytes (docs/design.md,
  // "Numerics", Memory); `waited` then, and the copies after the first chunk's all-to-all ran on the
  // restore's stream, which stays current while `on_restore_stream` lives. Below, `frames` is a second buffer the engine receives into.
  struct FramesAtOwners {
    at::Tensor frames;
    std::vector<EngineCall> calls;
    std::vector<at::Tensor> buffers;
    bool waited = false;
    std::shared_ptr<void> on_restore_stream;
  };
  FramesAtOwners frames_to_owners(const at::Tensor& frames, const Timing& timing);
  static constexpr int64_t kFrameChunks = 8;
  // `parts` (part q, staged as 16 bits or as a frame, for rank q) go out in one alltoall_base (frames:
  // frames_to_owners); the restore sums the rows into `output` (Device::sum_wide, or
  // Device::sum_frames_wide), never rounding to the wire. Unframed, from kOwnerChunks x kOwnerChunkBytes
  // of wire on, the parts go in column chunks
  // into one buffer of rows, each chunk summed in fp32 where the stage was already sent; the restore
  // scales those sums into `output` (docs/design.md, "Numerics", Memory).
  Issued reduce_scatter_fp32_sums(const std::vector<at::Tensor>& parts, const at::Tensor& output, const Plan& p,
                                  const Timing& timing);
  Issued reduce_scatter_in_chunks(const std::vector<at::Tensor>& parts, const at::Tensor& output, const Plan& p,
                                  const Timing& timing);
  // Whether a reduction of `numel` elements takes the forms above. Frames carry empty tensors
  // too: no engine reduces an 8-bit wire.
  static bool has_fp32_sums(const Plan& p, int64_t numel) { return p.framed || (p.fp32_sum && numel > 0); }

  // `exact`: plan as reduce() does, never compressed (policy.h).
  Plan plan(const at::Tensor& t, int64_t nbytes, const c10d::ReduceOp& op, bool as_is, bool exact = false) const;
  // Whether a tensor goes to the engine as a staged copy. `as_is`: whether it (and the tensors it
  // pairs with) could go as they are: contiguous (engines read one block, and gloo silently
  // misreads strided inputs), and not a non-root reduce input that gloo would overwrite.
  bool is_staged(const Plan& p, const c10d::ReduceOp& op, bool as_is) const;
  // The coalesced engine calls for `tensors`: one, or one per dtype for an engine that needs it.
  std::vector<std::vector<size_t>> calls_for(const std::vector<at::Tensor>& tensors) const;
  at::Tensor stage(const at::Tensor& src, const Plan& p, int64_t numel) const;
  // A stochastic plan's cast rounds with `dither`, src's element 0 being element `first` of the tensor.
  void stage_into(const at::Tensor& src, const at::Tensor& dst, const Plan& p, const compress::Dither& dither = {},
                  uint64_t first = 0) const;
  // The stochastic roundings of a tensor's contributions and of its owners' sums, keyed by how many
  // stochastic reductions of non-empty tensors the group issued before it (compress/stochastic.h).
  std::pair<compress::Dither, compress::Dither> dithers(const Plan& p, int64_t numel);
  // An engine call's result, with the point to wait on when it returned no work.
  EngineCall called(WorkPtr work) const;
  // Builds cnccl's work over the engine's calls: the restores are enqueued once the host may (the
  // calls' futures), ordered after every call on the device; a synchronous call (asyncOp=false)
  // returns once the caller's stream is ordered after them.
  WorkPtr finish(c10d::OpType type, const char* name, const Timing& timing, std::vector<EngineCall> calls,
                 std::vector<Staged> staged, std::vector<at::Tensor> inputs, std::vector<at::Tensor> outputs);

  const Engine engine_;
  const std::shared_ptr<Device> device_;
  const Config config_;
  Stats* const stats_;
  const int rank_;
  const int size_;
  std::atomic<uint64_t> seq_{0};
  std::atomic<uint64_t> stochastic_seq_{0};
};

}  // namespace cnccl::composed

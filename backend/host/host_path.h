// The host path (docs/design.md, "Two paths"): cnccl's own collectives on CPU tensors, over a
// Transport (UCX). Every collective is a Call (call.h: checked, planned, signed) plus one Step
// per tensor, and goes through one funnel, submit(): on the group's executor thread it begins
// each step (the signature headers), runs pre -> algorithm -> post, times those phases and
// records the call's traffic. The collectives themselves (reductions.cpp, data_movement.cpp)
// only say what each phase does.
#pragma once

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <atomic>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "backend/call.h"
#include "backend/host/algorithms/algorithms.h"
#include "backend/host/shm/shm_algorithms.h"
#include "backend/host/shm/shm_segment.h"
#include "backend/stats.h"
#include "backend/work.h"
#include "compress/stochastic.h"

namespace cnccl::host {

class Executor;

class HostPath final : public c10d::Backend {
 public:
  HostPath(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size, std::string group_name,
           const Config& config, std::chrono::milliseconds timeout, Stats& stats);
  ~HostPath() override;

  const std::string getBackendName() const override { return "cnccl-host"; }
  uint64_t getSequenceNumberForGroup() override { return seq_.load(); }
  uint64_t transport_bytes_sent() const;
  // "shm" when the group's reductions, allgathers and broadcasts go through shared memory;
  // "shm within each host, ucx across N hosts" when its allreduces are hierarchical; else
  // "ucx (<why not shm>)".
  std::string transport() const;
  // The wire of compressed sums at each level: "<wire> inside each host, <wire> across N hosts" for a
  // wire per level, else "<wire> on every link".
  std::string wire_levels() const;

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                     const c10d::AllreduceCoalescedOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors, const c10d::ReduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                     std::vector<at::Tensor>& inputs,
                                                     const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                 std::vector<at::Tensor>& inputs,
                                                                 const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs,
                                        std::vector<at::Tensor>& inputs, const c10d::GatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs,
                                         std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                      const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                 std::vector<at::Tensor>& inputs,
                                                                 const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& output_split_sizes,
                                               std::vector<int64_t>& input_split_sizes,
                                               const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst_rank, int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src_rank, int tag) override;
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors, int tag) override;
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override;

  void abort() override;
  void shutdown() override;

 private:
  // The buffers a step's phases share, from the comm's Scratch, sized as the step asked.
  struct Buffers {
    char* workspace;
    char* staging;
  };
  // One tensor's part of a collective. pre: into the workspace (cast, or pack and scale);
  // algorithm: over the transport; post: out of it (restore, or unscale and unpack). The funnel
  // times them as cast_ns, transfer_ns (less what the algorithm's timed reducers and producers
  // count as reduce_ns and cast_ns) and restore_ns.
  struct Step {
    size_t workspace_bytes = 0;
    size_t staging_bytes = 0;
    std::function<void(const Buffers&)> pre, algorithm, post;
    // The algorithm goes through shared memory, whose first step agrees on the signature.
    bool on_shm = false;
    // Set once the algorithm has written results into the caller's tensor (as they arrive): a
    // failure after that leaves it partly written. Null for steps that never do.
    std::shared_ptr<bool> wrote_results;
  };

  // The funnel: records `call`'s traffic and queues its steps, one per signature.
  c10::intrusive_ptr<c10d::Work> submit(Call call, std::vector<Step> steps);
  void run(const Step& step);
  c10::intrusive_ptr<c10d::Work> submit_p2p(c10d::OpType type, at::Tensor tensor, int peer, int tag, bool is_send);

  // An algorithm's reducer, timed into reduce_ns; its producer, into cast_ns.
  Reducer timed_reducer(Reducer reduce);
  Producer timed_producer(Producer produce);
  RankSum timed_reducer(RankSum sum);
  // Reduce-phase work outside a RankSum (an owner's encode of its whole sum), run timed into reduce_ns.
  void timed_reduce(std::function<void()> work);
  ChunkProduce timed_producer(ChunkProduce produce);
  // Restore-phase work inside an algorithm, run timed into restore_ns.
  void timed_restore(std::function<void()> work);
  // A shared-memory reduction's consumer, timed into restore_ns.
  ChunkConsume timed_consumer(ChunkConsume consume);
  // The steps of the reductions, shared by their list, tensor and coalesced forms.
  Step allreduce_step(const at::Tensor& tensor, const Plan& plan);
  Step reduce_scatter_step(const std::vector<at::Tensor>& inputs, const at::Tensor& output, const Plan& plan);
  // Their forms in frames (plan.framed; reductions/framed_reductions.cpp), chunked through shared memory (on_shm)
  // or over the transport: power-of-two frames cut into pieces, MX blocks.
  Step framed_allreduce_step(const at::Tensor& tensor, const Plan& plan, bool on_shm);
  Step framed_reduce_scatter_step(const std::vector<at::Tensor>& inputs, const at::Tensor& output, const Plan& plan,
                                  bool on_shm);
  Step mx_allreduce_step(const at::Tensor& tensor, const Plan& plan, bool on_shm);
  // With plan.rotated (reductions/rotated_reductions.cpp): the step without it on rotated copies, the result
  // rotated back into the caller's tensor after its post.
  Step rotated_allreduce_step(const at::Tensor& tensor, const Plan& plan);
  Step rotated_reduce_scatter_step(const std::vector<at::Tensor>& inputs, const at::Tensor& output, const Plan& plan);
  Step mx_reduce_scatter_step(const std::vector<at::Tensor>& inputs, const at::Tensor& output, const Plan& plan,
                              bool on_shm);
  // Their forms with a wire per level (plan.per_level; reductions/level_reductions.cpp), on a group across hosts
  // that share memory inside each. per_level_step runs both: `make_rows` (in pre) gives the L local
  // parts' contributions (each at most `count` elements, fp32 or fp64, one dtype), each in pieces of
  // `segment` elements (the last may be short) read where they lie. The workspace's first
  // `staging_bytes` are the caller's.
  struct LevelResults {
    // An allreduce's: where this local part's results go in `workspace`, and of its `count` elements the
    // `have` that exist, in `dtype`; `wrote` as Step::wrote_results. Null for a reduce_scatter.
    std::function<char*(char* workspace)> at;
    int64_t have = 0;
    at::ScalarType dtype = at::kFloat;
    std::shared_ptr<bool> wrote;
    // An allreduce's level 3: elements [first, first + len) of every local part, restored by its owner,
    // to every rank of the host; called in the same order on all of them.
    std::function<void(size_t first, size_t len, char* workspace)> share;
    // A reduce_scatter's restore of its sub-part's fp32 sums, after level 2.
    std::function<void(const float* sums, char* workspace)> finish;
  };
  Step per_level_step(std::function<std::vector<std::vector<at::Tensor>>()> make_rows, int64_t count,
                      int64_t segment, const Plan& plan, size_t staging_bytes, LevelResults results);
  Step per_level_allreduce_step(const at::Tensor& tensor, const Plan& plan);
  Step per_level_reduce_scatter_step(const std::vector<at::Tensor>& inputs, const at::Tensor& output, const Plan& plan);
  // Runs a chunked reduction through shared memory or over the transport.
  void reduce(const ChunkedReduction& reduction, bool on_shm);
  // The stochastic roundings of a step's contributions and of its owners' sums, keyed by how many
  // stochastic reductions of non-empty tensors the group issued before it (compress/stochastic.h).
  std::pair<compress::Dither, compress::Dither> dithers(const Plan& plan, size_t numel);
  // Allgathers `input` into `out` (world size x its bytes), then unpacks into `outputs` if any.
  Step allgather_step(const at::Tensor& input, const std::vector<at::Tensor>& outputs, char* out = nullptr);

  Group group() const { return {config_, rank_, size_, timeout_}; }
  SharedMemory shared_memory() const;
  // Shared memory among every rank of the group: all its collectives but point-to-point use it.
  bool all_on_shm() const { return shared_memory() == SharedMemory::kOneHost; }

  // The group's settings; a wire per level collapses to wire_dtype where the group has one level.
  Config config_;
  const std::chrono::milliseconds timeout_;
  Stats& stats_;
  std::atomic<uint64_t> seq_{0};
  std::atomic<uint64_t> stochastic_seq_{0};
  // The group's other processes on this host, by group rank: Comm's waits see a death through
  // their pidfds at once, whatever carries the data.
  std::map<int, Liveness> host_peers_;
  std::unique_ptr<Comm> comm_;
  std::unique_ptr<ShmComm> shm_;  // this host's ranks; null when they cannot share memory, or CNCCL_SHM=off
  std::unique_ptr<Comm> cross_;   // with shm_ on several hosts: the ranks of this one's local rank, one per host
  std::string no_shm_because_;
  std::string broken_;  // executor thread only: the first failure, after which the group is unusable
  // The rotation's copies (reductions/rotated_reductions.cpp), kept for later calls: memory a step in flight
  // does not hold.
  class RotationCopies {
   public:
    // A contiguous flat tensor of `numel` elements of `dtype`.
    at::Tensor take(int64_t numel, at::ScalarType dtype);
    // Frees the kept buffers (shutdown: no step runs again); views still alive keep theirs.
    void clear();

   private:
    std::mutex mutex_;
    std::vector<at::Tensor> kept_;  // bytes; in use while a view of one lives
  };
  RotationCopies rotation_copies_;
  // Shared with the works' helpers (HostWork::set_helper), which hold it weakly.
  std::shared_ptr<Executor> executor_;
  const Executor* executor_id_ = nullptr;  // its address, compared with (never read) once it is gone
  // shutdown() runs once, perhaps from a callback on an executor thread while a caller's thread
  // shuts the group down too.
  std::mutex shutdown_mutex_;
  std::condition_variable shutdown_cv_;
  bool shutdown_started_ = false;
  bool shutdown_done_ = false;
};

}  // namespace cnccl::host

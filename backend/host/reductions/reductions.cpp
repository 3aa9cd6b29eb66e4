// The host path's reductions: allreduce, reduce_scatter and reduce in all their forms. Each
// makes its Call (checked, planned, signed) and one Step per tensor for the funnel.
#include <memory>

#include "backend/host/host_path.h"
#include "backend/host/shm/shm_algorithms.h"
#include "backend/host/shm/shm_comm.h"
#include "backend/host/staging.h"
#include "backend/host/transport/comm.h"
#include "backend/host/transport/tags.h"

namespace cnccl::host {
namespace {

// Where a reduce_scatter with fp32 sums keeps them: after the 16-bit parts, on a cache line.
size_t sums_offset(size_t wire_bytes) { return (wire_bytes + 63) / 64 * 64; }

}  // namespace

std::pair<compress::Dither, compress::Dither> HostPath::dithers(const Plan& plan, size_t numel) {
  const auto seq = static_cast<uint32_t>(plan.stochastic && numel > 0 ? stochastic_seq_++ : 0);
  return {compress::contribution_dither(plan.sr_seed, seq, uint32_t(rank_)), compress::sum_dither(plan.sr_seed, seq)};
}

HostPath::Step HostPath::allreduce_step(const at::Tensor& tensor, const Plan& plan) {
  if (plan.rotated) return rotated_allreduce_step(tensor, plan);
  if (plan.per_level) return per_level_allreduce_step(tensor, plan);
  const size_t n = tensor.numel();
  const size_t elem = plan.compress ? 2 : tensor.element_size();
  const at::ScalarType dtype = tensor.scalar_type();
  const AllreduceAlgorithm algorithm =
      choose_allreduce(int64_t(n * elem), shared_memory(), plan.fp32_sum, framing_of(plan));
  if (framing_of(plan) == Framing::kBlocks) return mx_allreduce_step(tensor, plan, algorithm == AllreduceAlgorithm::kShm);
  if (plan.framed) return framed_allreduce_step(tensor, plan, algorithm == AllreduceAlgorithm::kShm);
  const auto dithered = dithers(plan, n);
  const compress::Dither contributions = dithered.first, sums = dithered.second;
  auto src = std::make_shared<at::Tensor>();  // the tensor as one block, from pre on
  Step step;
  const bool through_shm = algorithm == AllreduceAlgorithm::kShm || algorithm == AllreduceAlgorithm::kHierarchical;
  const bool chunked = algorithm == AllreduceAlgorithm::kChunked;
  step.on_shm = algorithm == AllreduceAlgorithm::kShm;
  // Through shared memory and in the chunked all-to-all the results go straight into the caller's
  // tensor as each chunk comes back, a pass less than restoring from a workspace after the last
  // chunk, unless the group asked for its tensors to stay as they were when a collective fails
  // (docs/design.md, "Shared memory").
  const bool direct = (step.on_shm || chunked) && tensor.is_contiguous() && !config_.untouched_on_failure;
  step.workspace_bytes = direct ? 0 : n * elem;
  if (direct) step.wrote_results = std::make_shared<bool>(false);
  const std::shared_ptr<bool> wrote = step.wrote_results;
  step.pre = [=](const Buffers& b) {
    *src = tensor.contiguous();
    if (through_shm || chunked) return;  // cast a chunk at a time, as the chunks are sent
    auto* wire = reinterpret_cast<uint16_t*>(b.workspace);
    if (plan.compress) return cast_into(*src, wire, plan, contributions);
    pack(*src, b.workspace);
    pre_scale(b.workspace, n, dtype, plan);
  };
  step.algorithm = [=, this](const Buffers& b) {
    if (through_shm || chunked) {
      const char* x = static_cast<const char*>(src->const_data_ptr());
      const size_t wide = src->element_size();
      auto source = [=](size_t i) { return x + i * wide; };
      const int ranks = chunked ? size_ : shm_->size();
      ChunkedReduction local{Parts::even(n, ranks), elem,
                         timed_producer(chunk_producer(source, plan, dtype, contributions)),
                         timed_reducer(rank_sum(plan, dtype, ranks, sums)), b.workspace,
                         ChunkedReduction::kAll};
      if (direct) {
        // *src is the tensor itself (contiguous).
        local.consume = timed_consumer([consume = chunk_consumer(static_cast<char*>(tensor.data_ptr()), plan, dtype),
                                        wrote](size_t offset, size_t count, const char* result) {
          *wrote = true;
          consume(offset, count, result);
        });
      }
      if (algorithm == AllreduceAlgorithm::kShm) return reduce_shm(*shm_, local);
      if (chunked) return reduce_chunked(*comm_, local);
      comm_->end();  // the group's signature agreement, before any data moves
      return allreduce_hierarchical(*shm_, *cross_, local, timed_reducer(reducer(plan, dtype)));
    }
    if (algorithm == AllreduceAlgorithm::kAlltoall) {
      const Parts parts = Parts::even(n, size_);
      reduce_scatter_alltoall(*comm_, b.workspace, parts, elem,
                              timed_reducer(rank_sum(plan, dtype, size_, sums)),
                              b.workspace + parts.offset[rank_] * elem);
      return allgather_ring(*comm_, b.workspace, parts, elem, tags::kSecondPhase);
    }
    allreduce_direct(*comm_, b.workspace, n, elem, timed_reducer(reducer(plan, dtype)));
  };
  step.post = [=](const Buffers& b) {
    src->reset();
    if (direct) return;  // restored chunk by chunk already
    if (plan.compress) return restore_into(reinterpret_cast<uint16_t*>(b.workspace), tensor, plan);
    post_scale(b.workspace, n, dtype, plan);
    unpack(b.workspace, tensor);
  };
  return step;
}

HostPath::Step HostPath::reduce_scatter_step(const std::vector<at::Tensor>& inputs, const at::Tensor& output,
                                             const Plan& plan) {
  if (plan.rotated) return rotated_reduce_scatter_step(inputs, output, plan);
  if (plan.per_level) return per_level_reduce_scatter_step(inputs, output, plan);
  const size_t each = output.numel();
  const size_t elem = plan.compress ? 2 : output.element_size();
  const at::ScalarType dtype = output.scalar_type();
  const AllreduceAlgorithm algorithm = choose_reduce_scatter(shared_memory(), plan.fp32_sum, framing_of(plan));
  if (framing_of(plan) == Framing::kBlocks) {
    return mx_reduce_scatter_step(inputs, output, plan, algorithm == AllreduceAlgorithm::kShm);
  }
  if (plan.framed) return framed_reduce_scatter_step(inputs, output, plan, algorithm == AllreduceAlgorithm::kShm);
  const bool on_shm = algorithm == AllreduceAlgorithm::kShm;
  const bool fused = algorithm == AllreduceAlgorithm::kRing && FusedCast::applies(plan, dtype);
  const int size = size_;
  const compress::Dither contributions = dithers(plan, each).first;
  // With fp32 sums the own part's result is fp32, after the 16-bit parts; through shared memory
  // the own part's result comes first.
  const size_t sums_at = plan.fp32_sum ? sums_offset(on_shm ? 0 : each * elem * size) : 0;
  const size_t result_at = plan.fp32_sum ? sums_at : on_shm ? 0 : each * elem * rank_;
  auto srcs = std::make_shared<std::vector<at::Tensor>>();  // the inputs as blocks, from pre on
  Step step;
  step.workspace_bytes = plan.fp32_sum ? sums_at + each * sizeof(float) : each * elem * size;
  step.on_shm = on_shm;
  step.pre = [=](const Buffers& b) {
    for (const auto& in : inputs) srcs->push_back(in.contiguous());
    if (fused || on_shm) return;  // cast as the ring reduces (FusedCast), or as shared memory takes it
    for (int i = 0; i < size; ++i) {
      char* part = b.workspace + each * elem * i;
      if (plan.compress) {
        cast_into((*srcs)[i], reinterpret_cast<uint16_t*>(part), plan, contributions, each * i);
      } else {
        pack((*srcs)[i], part);
      }
    }
    if (!plan.compress) pre_scale(b.workspace, each * size, dtype, plan);
  };
  step.algorithm = [=, this](const Buffers& b) {
    // Nothing to move (every rank agreed on the count through the signature header).
    if (each == 0 && !on_shm) return;
    const Parts parts = Parts::equal(each, size);
    if (on_shm) {
      std::vector<const char*> x;
      for (const auto& in : *srcs) x.push_back(static_cast<const char*>(in.const_data_ptr()));
      const size_t wide = output.element_size();
      auto source = [x, each, wide](size_t i) { return x[i / each] + i % each * wide; };
      const RankSum sum = plan.fp32_sum ? fp32_rank_sum(plan, size) : rank_sum(plan, dtype, size);
      const ChunkProduce produce = chunk_producer(source, plan, dtype, contributions);
      return reduce_shm(*shm_, {parts, elem, timed_producer(produce), timed_reducer(sum), b.workspace + result_at,
                                ChunkedReduction::kOwn, 0, plan.fp32_sum ? sizeof(float) : 0});
    }
    if (algorithm == AllreduceAlgorithm::kAlltoall) {
      return reduce_scatter_alltoall(*comm_, b.workspace, parts, elem, timed_reducer(fp32_rank_sum(plan, size)),
                                     b.workspace + result_at);
    }
    if (!fused) return reduce_scatter_ring(*comm_, b.workspace, parts, elem, timed_reducer(reducer(plan, dtype)));
    std::vector<const float*> x;
    for (const auto& in : *srcs) x.push_back(in.const_data_ptr<float>());
    const FusedCast cast{reinterpret_cast<uint16_t*>(b.workspace),
                         [x, each](size_t i) { return x[i / each] + i % each; }, float(plan.pre_scale), plan.wire};
    reduce_scatter_ring(*comm_, b.workspace, parts, elem, timed_reducer(cast.reducer()),
                        timed_producer(cast.producer()));
  };
  step.post = [=](const Buffers& b) {
    srcs->clear();
    char* mine = b.workspace + result_at;
    if (plan.fp32_sum) return restore_sums_into(reinterpret_cast<const float*>(mine), output, plan);
    if (plan.compress) return restore_into(reinterpret_cast<uint16_t*>(mine), output, plan);
    post_scale(mine, each, dtype, plan);
    unpack(mine, output);
  };
  return step;
}

c10::intrusive_ptr<c10d::Work> HostPath::allreduce(std::vector<at::Tensor>& tensors,
                                                   const c10d::AllreduceOptions& opts) {
  Call call = calls::allreduce(tensors, opts, group());
  Step step = allreduce_step(tensors[0], call.plans[0]);
  return submit(std::move(call), {std::move(step)});
}

c10::intrusive_ptr<c10d::Work> HostPath::allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                             const c10d::AllreduceCoalescedOptions& opts) {
  Call call = calls::allreduce_coalesced(tensors, opts, group());
  std::vector<Step> steps;
  for (size_t i = 0; i < tensors.size(); ++i) steps.push_back(allreduce_step(tensors[i], call.plans[i]));
  return submit(std::move(call), std::move(steps));
}

c10::intrusive_ptr<c10d::Work> HostPath::reduce_scatter(std::vector<at::Tensor>& outputs,
                                                        std::vector<std::vector<at::Tensor>>& inputs,
                                                        const c10d::ReduceScatterOptions& opts) {
  Call call = calls::reduce_scatter(outputs, inputs, opts, group());
  Step step = reduce_scatter_step(inputs[0], outputs[0], call.plans[0]);
  return submit(std::move(call), {std::move(step)});
}

c10::intrusive_ptr<c10d::Work> HostPath::_reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                              const c10d::ReduceScatterOptions& opts) {
  Call call = calls::reduce_scatter_tensor(output, input, opts, group());
  Step step = reduce_scatter_step(input.contiguous().reshape({-1}).chunk(size_), output, call.plans[0]);
  return submit(std::move(call), {std::move(step)});
}

c10::intrusive_ptr<c10d::Work> HostPath::reduce_scatter_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                         std::vector<at::Tensor>& inputs,
                                                                         const c10d::ReduceScatterOptions& opts) {
  Call call = calls::reduce_scatter_tensor_coalesced(outputs, inputs, opts, group());
  std::vector<Step> steps;
  for (size_t i = 0; i < inputs.size(); ++i) {
    steps.push_back(
        reduce_scatter_step(inputs[i].contiguous().reshape({-1}).chunk(size_), outputs[i], call.plans[i]));
  }
  return submit(std::move(call), std::move(steps));
}

c10::intrusive_ptr<c10d::Work> HostPath::reduce(std::vector<at::Tensor>& tensors, const c10d::ReduceOptions& opts) {
  Call call = calls::reduce(tensors, opts, group());
  const at::Tensor t = tensors[0];
  const Plan plan = call.plans[0];
  const int root = int(opts.rootRank);
  const bool is_root = rank_ == root;
  const bool on_shm = all_on_shm();
  auto src = std::make_shared<at::Tensor>();  // the tensor as one block, from pre on (shared memory)
  Step step;
  step.workspace_bytes = t.nbytes();
  step.on_shm = on_shm;
  step.pre = [=](const Buffers& b) {
    if (on_shm) {
      *src = t.contiguous();
      return;
    }
    pack(t, b.workspace);
    pre_scale(b.workspace, t.numel(), t.scalar_type(), plan);
  };
  step.algorithm = [=, this](const Buffers& b) {
    if (on_shm) {
      const char* x = static_cast<const char*>(src->const_data_ptr());
      const size_t elem = t.element_size();
      auto source = [x, elem](size_t i) { return x + i * elem; };
      return reduce_shm(*shm_, {Parts::even(t.numel(), size_), elem,
                                timed_producer(chunk_producer(source, plan, t.scalar_type())),
                                timed_reducer(rank_sum(plan, t.scalar_type(), size_)), b.workspace,
                                ChunkedReduction::kRoot, root});
    }
    reduce_direct(*comm_, b.workspace, t.numel(), t.element_size(), root,
                  timed_reducer(reducer(plan, t.scalar_type())));
  };
  step.post = [=](const Buffers& b) {
    src->reset();
    if (!is_root) return;
    post_scale(b.workspace, t.numel(), t.scalar_type(), plan);
    unpack(b.workspace, t);
  };
  return submit(std::move(call), {std::move(step)});
}

}  // namespace cnccl::host

#include "backend/call.h"

#include "backend/checks.h"

namespace cnccl {
namespace {

std::string describe(const at::Tensor& t) {
  return std::to_string(t.numel()) + " x " + c10::toString(t.scalar_type());
}
// Everything in a reduction's plan that changes its bytes, so that ranks configured differently
// fail on the signature instead of summing different things: the scale sum_scaling adds (a
// PREMUL_SUM factor may differ between ranks, as with NCCL, and stays out) and the seed of the
// stochastic rounding.
std::string describe(const at::Tensor& t, const Plan& plan, RedOp op) {
  if (plan.per_level) {
    auto name = [](const std::optional<compress::Wire>& w) { return w ? compress::wire_name(*w) : std::string("fp32"); };
    return describe(t) + ", " + op_name(op) + ", " + name(plan.inside) + " wire inside hosts, " + name(plan.across) +
           " across, fp32 sums" + (plan.post_scale != 1.0 ? ", sum scaled by the world size" : "") +
           (plan.stochastic ? ", stochastic rounding seed " + std::to_string(plan.sr_seed) : "") + ", " +
           compress::mx_scale_name(plan.mx_scale) + " MX scales";
  }
  return describe(t) + ", " + op_name(op) + ", " + (plan.compress ? compress::wire_name(plan.wire) : "no") + " wire" +
         (plan.post_scale != 1.0 ? ", sum scaled by the world size" : "") + (plan.fp32_sum ? ", fp32 sums" : "") +
         (plan.stochastic ? ", stochastic rounding seed " + std::to_string(plan.sr_seed) : "") +
         (plan.framed ? (compress::is_mx(plan.wire)
                             ? ", MX blocks (" + std::string(compress::mx_scale_name(plan.mx_scale)) + " scales)"
                         : plan.wire == compress::Wire::kNvfp4 ? std::string(", NVFP4 blocks")
                                                               : ", pow2 frames")
                      : "") +
         (plan.rotated ? ", Hadamard rotation with signs " + std::to_string(plan.rotation_signs) : "");
}
std::string with_root(std::string what, int64_t root) { return what + ", root " + std::to_string(root); }

// `opts`: any c10d options struct (each has a timeout and asyncOp).
template <typename Options>
Call make(c10d::OpType type, const char* name, const Options& opts, const Group& g, std::vector<at::Tensor> outputs) {
  Call call;
  call.type = type;
  call.name = name;
  call.timeout = opts.timeout == c10d::kUnsetTimeout ? g.timeout : opts.timeout;
  call.async_op = opts.asyncOp;
  call.outputs = std::move(outputs);
  return call;
}

// One tensor's part of a call.
void add(Call& call, std::string signature, Traffic traffic) {
  call.signatures.push_back(std::move(signature));
  call.traffic.push_back(traffic);
}

Plan plan_for(const at::Tensor& t, int64_t nbytes, const c10d::ReduceOp& op, const Group& g) {
  return plan_reduction(g.config, t.scalar_type(), nbytes, op.op_, premul_factor(op), g.size);
}

// A reduction of `t` (`numel` elements sent, of `nbytes`), planned and described.
void add_reduction(Call& call, const at::Tensor& t, int64_t numel, int64_t nbytes, const c10d::ReduceOp& op,
                   const Group& g) {
  call.plans.push_back(plan_for(t, nbytes, op, g));
  add(call, describe(t, call.plans.back(), op.op_), traffic(call.plans.back(), numel, nbytes));
}

Call coalesced(Call call) {
  call.coalesced = true;
  call.on_failure = kCoalescedFailure;
  return call;
}

// Byte offsets and lengths of `splits` rows of `row_bytes` (equal split of `rows` when empty).
void layout(const std::vector<int64_t>& splits, int64_t rows, int size, size_t row_bytes, const char* what,
            std::vector<size_t>& off, std::vector<size_t>& len) {
  std::vector<int64_t> s = splits;
  if (s.empty()) {
    TORCH_CHECK_VALUE(rows % size == 0, "cnccl all_to_all_single: ", what, " dim 0 (", rows,
                      ") is not divisible by the world size (", size, ") and no split sizes were given");
    s.assign(size, rows / size);
  }
  TORCH_CHECK_VALUE(int(s.size()) == size, "cnccl all_to_all_single: ", what, " split sizes has ", s.size(),
                    " entries, expected the world size (", size, ")");
  int64_t total = 0;
  for (int64_t v : s) {
    TORCH_CHECK_VALUE(v >= 0, "cnccl all_to_all_single: negative ", what, " split size ", v);
    off.push_back(size_t(total) * row_bytes);
    len.push_back(size_t(v) * row_bytes);
    total += v;
  }
  TORCH_CHECK_VALUE(total == rows, "cnccl all_to_all_single: ", what, " split sizes sum to ", total,
                    " but dim 0 has ", rows, " rows");
}

}  // namespace

std::string Call::signature() const {
  if (!coalesced) return signatures.empty() ? std::string() : signatures[0];
  std::string all = std::to_string(signatures.size()) + " tensors: ";
  for (size_t i = 0; i < signatures.size(); ++i) all += (i ? "; " : "") + signatures[i];
  return all;
}

std::string Call::wire() const {
  for (const auto& p : plans) {
    if (p.compress) return compress::wire_name(p.wire);
  }
  return "none";
}

namespace calls {

Call allreduce(const std::vector<at::Tensor>& tensors, const c10d::AllreduceOptions& opts, const Group& g) {
  const at::Tensor& t = checks::single(tensors, "allreduce");
  Call call = make(c10d::OpType::ALLREDUCE, "allreduce", opts, g, tensors);
  add_reduction(call, t, t.numel(), t.nbytes(), opts.reduceOp, g);
  return call;
}

Call allreduce_coalesced(const std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts,
                         const Group& g) {
  TORCH_CHECK_VALUE(!tensors.empty(), "cnccl allreduce_coalesced: no tensors");
  Call call = coalesced(make(c10d::OpType::ALLREDUCE_COALESCED, "allreduce_coalesced", opts, g, tensors));
  for (const auto& t : tensors) {
    checks::host_tensor(t, "allreduce_coalesced");
    add_reduction(call, t, t.numel(), t.nbytes(), opts.reduceOp, g);
  }
  return call;
}

Call reduce_scatter(const std::vector<at::Tensor>& outputs, const std::vector<std::vector<at::Tensor>>& inputs,
                    const c10d::ReduceScatterOptions& opts, const Group& g) {
  const at::Tensor& out = checks::single(outputs, "reduce_scatter");
  TORCH_CHECK_VALUE(inputs.size() == 1, "cnccl reduce_scatter: expects one input list, got ", inputs.size());
  checks::list_like(inputs[0], g.size, out, "reduce_scatter", "input");
  Call call = make(c10d::OpType::REDUCE_SCATTER, "reduce_scatter", opts, g, outputs);
  call.plans.push_back(plan_for(out, out.nbytes() * g.size, opts.reduceOp, g));
  add(call, describe(out, call.plans[0], opts.reduceOp.op_),
      traffic(call.plans[0], out.numel() * g.size, out.nbytes() * g.size));
  return call;
}

Call reduce_scatter_tensor(const at::Tensor& output, const at::Tensor& input, const c10d::ReduceScatterOptions& opts,
                           const Group& g) {
  checks::host_tensor(output, "reduce_scatter_tensor");
  checks::host_tensor(input, "reduce_scatter_tensor");
  checks::reduce_scatter_sizes(output, input, g.size, "reduce_scatter_tensor");
  Call call = make(c10d::OpType::_REDUCE_SCATTER_BASE, "reduce_scatter_tensor", opts, g, {output});
  add_reduction(call, input, input.numel(), input.nbytes(), opts.reduceOp, g);
  return call;
}

Call reduce_scatter_tensor_coalesced(const std::vector<at::Tensor>& outputs, const std::vector<at::Tensor>& inputs,
                                     const c10d::ReduceScatterOptions& opts, const Group& g) {
  TORCH_CHECK_VALUE(outputs.size() == inputs.size() && !inputs.empty(),
                    "cnccl reduce_scatter_tensor_coalesced: needs as many outputs as inputs, got ", outputs.size(),
                    " and ", inputs.size());
  Call call = coalesced(
      make(c10d::OpType::COALESCED, "reduce_scatter_tensor_coalesced", opts, g, outputs));
  for (size_t i = 0; i < inputs.size(); ++i) {
    checks::host_tensor(inputs[i], "reduce_scatter_tensor_coalesced");
    checks::host_tensor(outputs[i], "reduce_scatter_tensor_coalesced");
    TORCH_CHECK_VALUE(inputs[i].numel() == outputs[i].numel() * g.size &&
                          inputs[i].scalar_type() == outputs[i].scalar_type(),
                      "cnccl reduce_scatter_tensor_coalesced: input ", i, " must be world size x output ", i,
                      " elements of the same dtype");
    add_reduction(call, inputs[i], inputs[i].numel(), inputs[i].nbytes(), opts.reduceOp, g);
  }
  return call;
}

Call reduce(const std::vector<at::Tensor>& tensors, const c10d::ReduceOptions& opts, const Group& g) {
  const at::Tensor& t = checks::single(tensors, "reduce");
  checks::root(opts.rootRank, g.size, "reduce");
  Call call = make(c10d::OpType::REDUCE, "reduce", opts, g, tensors);
  call.plans.push_back(plan_exact_reduction(g.config, t.scalar_type(), t.nbytes(), opts.reduceOp.op_,
                                            premul_factor(opts.reduceOp), g.size));
  add(call, with_root(describe(t, call.plans[0], opts.reduceOp.op_), opts.rootRank), exact_traffic(t.nbytes()));
  return call;
}

Call allgather(const std::vector<std::vector<at::Tensor>>& outputs, const std::vector<at::Tensor>& inputs,
               const c10d::AllgatherOptions& opts, const Group& g) {
  const at::Tensor& in = checks::single(inputs, "allgather");
  TORCH_CHECK_VALUE(outputs.size() == 1, "cnccl allgather: expects one output list, got ", outputs.size());
  checks::list_like(outputs[0], g.size, in, "allgather", "output");
  Call call = make(c10d::OpType::ALLGATHER, "allgather", opts, g, outputs[0]);
  add(call, describe(in), exact_traffic(in.nbytes() * g.size));
  return call;
}

Call allgather_into_tensor(const at::Tensor& output, const at::Tensor& input, const c10d::AllgatherOptions& opts,
                           const Group& g) {
  checks::host_tensor(output, "all_gather_into_tensor");
  checks::host_tensor(input, "all_gather_into_tensor");
  TORCH_CHECK_TYPE(input.scalar_type() == output.scalar_type(), "cnccl all_gather_into_tensor: output dtype ",
                   output.scalar_type(), " does not match input dtype ", input.scalar_type());
  TORCH_CHECK_VALUE(output.numel() == input.numel() * g.size, "cnccl all_gather_into_tensor: output has ",
                    output.numel(), " elements, expected world size (", g.size, ") x input (", input.numel(), ")");
  Call call = make(c10d::OpType::_ALLGATHER_BASE, "all_gather_into_tensor", opts, g, {output});
  call.on_failure = kOutputsUndefined;
  add(call, describe(input), exact_traffic(output.nbytes()));
  return call;
}

Call allgather_coalesced(const std::vector<std::vector<at::Tensor>>& outputs, const std::vector<at::Tensor>& inputs,
                         const c10d::AllgatherOptions& opts, const Group& g) {
  // c10d's layout (gloo's): outputs[r][i] receives rank r's inputs[i].
  TORCH_CHECK_VALUE(!inputs.empty(), "cnccl allgather_coalesced: no input tensors");
  TORCH_CHECK_VALUE(int(outputs.size()) == g.size, "cnccl allgather_coalesced: expects one output list per rank (",
                    g.size, "), got ", outputs.size());
  std::vector<at::Tensor> flat_outputs;
  for (const auto& in : inputs) checks::host_tensor(in, "allgather_coalesced");
  for (int r = 0; r < g.size; ++r) {
    TORCH_CHECK_VALUE(outputs[r].size() == inputs.size(), "cnccl allgather_coalesced: output list ", r, " has ",
                      outputs[r].size(), " tensors, expected one per input (", inputs.size(), ")");
    for (size_t i = 0; i < inputs.size(); ++i) {
      checks::host_tensor(outputs[r][i], "allgather_coalesced");
      checks::same_kind(inputs[i], outputs[r][i], "allgather_coalesced", "output");
    }
    flat_outputs.insert(flat_outputs.end(), outputs[r].begin(), outputs[r].end());
  }
  Call call = coalesced(
      make(c10d::OpType::ALLGATHER_COALESCED, "allgather_coalesced", opts, g, std::move(flat_outputs)));
  for (const auto& in : inputs) add(call, describe(in), exact_traffic(in.nbytes() * g.size));
  return call;
}

Call allgather_into_tensor_coalesced(const std::vector<at::Tensor>& outputs, const std::vector<at::Tensor>& inputs,
                                     const c10d::AllgatherOptions& opts, const Group& g) {
  TORCH_CHECK_VALUE(outputs.size() == inputs.size() && !inputs.empty(),
                    "cnccl allgather_into_tensor_coalesced: needs as many outputs as inputs");
  Call call = coalesced(
      make(c10d::OpType::COALESCED, "allgather_into_tensor_coalesced", opts, g, outputs));
  for (size_t i = 0; i < inputs.size(); ++i) {
    checks::host_tensor(inputs[i], "allgather_into_tensor_coalesced");
    checks::host_tensor(outputs[i], "allgather_into_tensor_coalesced");
    TORCH_CHECK_VALUE(outputs[i].numel() == inputs[i].numel() * g.size &&
                          outputs[i].scalar_type() == inputs[i].scalar_type(),
                      "cnccl allgather_into_tensor_coalesced: output ", i, " must be world size x input ", i,
                      " elements of the same dtype");
    add(call, describe(inputs[i]), exact_traffic(outputs[i].nbytes()));
  }
  return call;
}

Call broadcast(const std::vector<at::Tensor>& tensors, const c10d::BroadcastOptions& opts, const Group& g) {
  const at::Tensor& t = checks::single(tensors, "broadcast");
  checks::root(opts.rootRank, g.size, "broadcast");
  Call call = make(c10d::OpType::BROADCAST, "broadcast", opts, g, tensors);
  add(call, with_root(describe(t), opts.rootRank), exact_traffic(t.nbytes()));
  return call;
}

Call gather(const std::vector<std::vector<at::Tensor>>& outputs, const std::vector<at::Tensor>& inputs,
            const c10d::GatherOptions& opts, const Group& g) {
  const at::Tensor& in = checks::single(inputs, "gather");
  checks::root(opts.rootRank, g.size, "gather");
  Call call = make(c10d::OpType::GATHER, "gather", opts, g,
                   checks::root_list(outputs, g.rank == opts.rootRank, g.size, in, "gather", "output"));
  add(call, with_root(describe(in), opts.rootRank), exact_traffic(in.nbytes()));
  return call;
}

Call scatter(const std::vector<at::Tensor>& outputs, const std::vector<std::vector<at::Tensor>>& inputs,
             const c10d::ScatterOptions& opts, const Group& g) {
  const at::Tensor& out = checks::single(outputs, "scatter");
  checks::root(opts.rootRank, g.size, "scatter");
  checks::root_list(inputs, g.rank == opts.rootRank, g.size, out, "scatter", "input");
  Call call = make(c10d::OpType::SCATTER, "scatter", opts, g, outputs);
  add(call, with_root(describe(out), opts.rootRank), exact_traffic(out.nbytes()));
  return call;
}

Call alltoall_single(const at::Tensor& output, const at::Tensor& input, const std::vector<int64_t>& output_splits,
                     const std::vector<int64_t>& input_splits, const c10d::AllToAllOptions& opts, const Group& g,
                     AlltoallLayout* layout_out) {
  checks::host_tensor(output, "all_to_all_single");
  checks::host_tensor(input, "all_to_all_single");
  TORCH_CHECK_TYPE(input.scalar_type() == output.scalar_type(), "cnccl all_to_all_single: output dtype ",
                   output.scalar_type(), " does not match input dtype ", input.scalar_type());
  const int64_t in_rows = input.dim() ? input.size(0) : 1, out_rows = output.dim() ? output.size(0) : 1;
  const size_t in_row = in_rows ? input.nbytes() / in_rows : 0, out_row = out_rows ? output.nbytes() / out_rows : 0;
  TORCH_CHECK_VALUE(in_rows == 0 || out_rows == 0 || in_row == out_row,
                    "cnccl all_to_all_single: input and output rows have different sizes");
  AlltoallLayout l;
  layout(input_splits, in_rows, g.size, in_row, "input", l.send_off, l.send_len);
  layout(output_splits, out_rows, g.size, out_row, "output", l.recv_off, l.recv_len);
  TORCH_CHECK_VALUE(l.send_len[g.rank] == l.recv_len[g.rank], "cnccl all_to_all_single: this rank sends itself ",
                    l.send_len[g.rank], " bytes but expects ", l.recv_len[g.rank]);
  if (layout_out) *layout_out = std::move(l);
  Call call = make(c10d::OpType::ALLTOALL_BASE, "all_to_all_single", opts, g, {output});
  // Split sizes may differ between ranks; the dtype and row size may not.
  add(call, std::string(c10::toString(input.scalar_type())) + " rows of " + std::to_string(in_row) + " bytes",
      exact_traffic(input.nbytes()));
  return call;
}

Call alltoall(const std::vector<at::Tensor>& outputs, const std::vector<at::Tensor>& inputs,
              const c10d::AllToAllOptions& opts, const Group& g) {
  TORCH_CHECK_VALUE(int(inputs.size()) == g.size && int(outputs.size()) == g.size, "cnccl all_to_all: expects ",
                    g.size, " input and output tensors, got ", inputs.size(), " and ", outputs.size());
  int64_t in_total = 0;
  for (int i = 0; i < g.size; ++i) {
    checks::host_tensor(inputs[i], "all_to_all");
    checks::host_tensor(outputs[i], "all_to_all");
    TORCH_CHECK_TYPE(inputs[i].scalar_type() == outputs[i].scalar_type(), "cnccl all_to_all: output ", i,
                     " dtype does not match input ", i);
    in_total += inputs[i].nbytes();
  }
  TORCH_CHECK_VALUE(inputs[g.rank].nbytes() == outputs[g.rank].nbytes(),
                    "cnccl all_to_all: this rank's own input and output differ in size");
  Call call = make(c10d::OpType::ALLTOALL, "all_to_all", opts, g, outputs);
  add(call, c10::toString(inputs[0].scalar_type()), exact_traffic(in_total));
  return call;
}

Call barrier(const c10d::BarrierOptions& opts, const Group& g) {
  Call call = make(c10d::OpType::BARRIER, "barrier", opts, g, {});
  add(call, "", Traffic{});
  return call;
}

}  // namespace calls
}  // namespace cnccl

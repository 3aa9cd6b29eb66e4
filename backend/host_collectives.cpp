// Collectives on CPU tensors. Each one checks its arguments on the caller's thread, then queues
// a body that works in a scratch buffer and writes the caller's outputs only once everything has
// arrived: a collective that fails leaves the caller's tensors as they were.
#include <atomic>
#include <chrono>
#include <cstring>

#include "backend/checks.h"
#include "backend/composed/composition.h"
#include "backend/host/algorithms.h"
#include "backend/host/comm.h"
#include "backend/process_group.h"

namespace cnccl {
namespace {

constexpr const char* kUntouched = "the caller's tensors were not modified";
constexpr const char* kOutputsUndefined = "output tensors may be partially written; inputs were not modified";
// Each tensor of a coalesced call is written once its own part completes (see coalesced()).
constexpr const char* kCoalescedFailure =
    "tensors of this coalesced call before the one that failed may already hold their results; the others were "
    "not modified";
// Above this the ring's n-1 half-size steps beat one full exchange with every peer.
constexpr size_t kDirectAllreduceMaxBytes = 256 * 1024;

at::Tensor view(char* data, int64_t numel, at::ScalarType dtype) {
  return at::from_blob(data, {numel}, at::TensorOptions().dtype(dtype));
}

host::Reducer aten_reducer(at::ScalarType dtype, RedOp op) {
  return [dtype, op](void* acc_ptr, const void* in_ptr, size_t n) {
    at::Tensor acc = view(static_cast<char*>(acc_ptr), int64_t(n), dtype);
    at::Tensor in = view(static_cast<char*>(const_cast<void*>(in_ptr)), int64_t(n), dtype);
    const bool boolean = dtype == at::kBool;
    switch (op) {
      case RedOp::SUM: boolean ? acc.logical_or_(in) : acc.add_(in); break;
      case RedOp::PRODUCT: boolean ? acc.logical_and_(in) : acc.mul_(in); break;
      case RedOp::MIN: at::minimum_out(acc, acc, in); break;
      case RedOp::MAX: at::maximum_out(acc, acc, in); break;
      case RedOp::BAND: acc.bitwise_and_(in); break;
      case RedOp::BOR: acc.bitwise_or_(in); break;
      case RedOp::BXOR: acc.bitwise_xor_(in); break;
      default: TORCH_CHECK(false, "cnccl: no reducer for op ", op_name(op));
    }
  };
}

host::Reducer wire_reducer(codec::Wire wire, RedOp op) {
  if (op == RedOp::SUM) {
    return [wire](void* acc, const void* in, size_t n) {
      codec::add(static_cast<uint16_t*>(acc), static_cast<const uint16_t*>(in), n, wire);
    };
  }
  return aten_reducer(wire == codec::Wire::kFp16 ? at::kHalf : at::kBFloat16, op);
}

// A compressed SUM's reducer that casts this rank's own contribution as it goes: the wire element
// at index i of `ws` comes from source(i). Used with the ring algorithms, which reduce every part
// but the first one sent exactly once before sending it, so casting ahead only that part and
// folding the rest into their reduction saves a pass over memory.
template <typename Source>
host::Reducer cast_add_reducer(uint16_t* ws, Source source, const Plan& plan) {
  return [ws, source, scale = float(plan.pre_scale), wire = plan.wire](void* acc, const void* in, size_t n) {
    auto* out = static_cast<uint16_t*>(acc);
    codec::cast_add(source(size_t(out - ws)), static_cast<const uint16_t*>(in), out, n, scale, wire);
  };
}

// What every rank must agree on for a collective (checked through Comm::begin's headers).
std::string describe(const at::Tensor& t) {
  return std::to_string(t.numel()) + " x " + c10::toString(t.scalar_type());
}
std::string describe(const at::Tensor& t, const Plan& plan, RedOp op) {
  return describe(t) + ", " + op_name(op) + ", " + (plan.compress ? codec::wire_name(plan.wire) : "no") + " wire";
}
std::string with_root(std::string what, int root) { return what + ", root " + std::to_string(root); }
// A coalesced call's first header carries every tensor's signature, so ranks that disagree on any
// part fail before the first tensor's result is written.
std::string coalesced(const std::vector<std::string>& parts) {
  std::string all = std::to_string(parts.size()) + " tensors: ";
  for (size_t i = 0; i < parts.size(); ++i) all += (i ? "; " : "") + parts[i];
  return all;
}

bool folds_cast(const Plan& plan, at::ScalarType dtype) {
  return plan.compress && plan.inner_op == RedOp::SUM && dtype == at::kFloat;
}

// Casts `src` (fp32 or fp64, contiguous) into the 16-bit workspace.
void cast_into(const at::Tensor& src, uint16_t* dst, const Plan& plan) {
  const size_t n = src.numel();
  if (src.scalar_type() == at::kFloat) {
    codec::cast(src.const_data_ptr<float>(), dst, n, float(plan.pre_scale), plan.wire);
  } else {
    codec::cast(src.const_data_ptr<double>(), dst, n, float(plan.pre_scale), plan.wire);
  }
}

// Restores the 16-bit workspace into `dst` (any strides) with the plan's post-scale.
void restore_into(const uint16_t* src, const at::Tensor& dst, const Plan& plan) {
  at::Tensor out = dst.is_contiguous() ? dst : at::empty_like(dst, at::MemoryFormat::Contiguous);
  const size_t n = dst.numel();
  if (dst.scalar_type() == at::kFloat) {
    codec::restore(src, out.mutable_data_ptr<float>(), n, float(plan.post_scale), plan.wire);
  } else {
    codec::restore(src, out.mutable_data_ptr<double>(), n, float(plan.post_scale), plan.wire);
  }
  if (!out.is_same(dst)) dst.copy_(out);
}

// Copies `src` (any strides) into raw contiguous memory.
void pack(const at::Tensor& src, char* dst) {
  if (src.numel() == 0) return;
  view(dst, src.numel(), src.scalar_type()).copy_(src.reshape({-1}));
}

void unpack(char* src, const at::Tensor& dst) {
  if (dst.numel() == 0) return;
  dst.copy_(view(src, dst.numel(), dst.scalar_type()).view(dst.sizes()));
}

// Adds the time from construction (or the last lap) to a counter on lap().
class PhaseTimer {
 public:
  void lap(std::atomic<uint64_t>& into) {
    const auto now = std::chrono::steady_clock::now();
    into += uint64_t(std::chrono::duration_cast<std::chrono::nanoseconds>(now - start_).count());
    start_ = now;
  }

 private:
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
};

// A reducer that also adds its own time to `into`.
host::Reducer timed(host::Reducer reduce, std::atomic<uint64_t>& into) {
  return [reduce = std::move(reduce), &into](void* acc, const void* in, size_t n) {
    PhaseTimer t;
    reduce(acc, in, n);
    t.lap(into);
  };
}

// Uncompressed AVG/PREMUL_SUM scaling, in the tensor's own dtype.
void pre_scale(char* data, int64_t numel, at::ScalarType dtype, const Plan& plan) {
  if (plan.pre_scale != 1.0) view(data, numel, dtype).mul_(plan.pre_scale);
}
void post_scale(char* data, int64_t numel, at::ScalarType dtype, const Plan& plan) {
  if (plan.post_divisor != 1) view(data, numel, dtype).div_(plan.post_divisor, "trunc");
}

}  // namespace

void ProcessGroupCNCCL::run_allreduce(const at::Tensor& tensor, const Plan& plan) {
  PhaseTimer timer;
  at::Tensor t = tensor;
  const size_t n = t.numel();
  const at::Tensor src = t.contiguous();
  const size_t elem = plan.compress ? 2 : t.element_size();
  char* ws = scratch(0, n * elem);
  const uint64_t reduce_before = stats_.reduce_ns.load();
  const bool ring = n * elem > kDirectAllreduceMaxBytes;
  auto* wire = reinterpret_cast<uint16_t*>(ws);
  host::Reducer reduce;
  if (ring && folds_cast(plan, t.scalar_type())) {
    const host::Parts parts = host::Parts::even(n, size_);
    const int first = (rank_ + size_ - 1) % size_;
    const float* x = src.const_data_ptr<float>();
    codec::cast(x + parts.offset[first], wire + parts.offset[first], parts.length[first], float(plan.pre_scale),
                plan.wire);
    reduce = cast_add_reducer(wire, [x](size_t i) { return x + i; }, plan);
  } else if (plan.compress) {
    reduce = wire_reducer(plan.wire, plan.inner_op);
    cast_into(src, wire, plan);
  } else {
    reduce = aten_reducer(t.scalar_type(), plan.inner_op);
    pack(src, ws);
    pre_scale(ws, n, t.scalar_type(), plan);
  }
  reduce = timed(std::move(reduce), stats_.reduce_ns);
  timer.lap(stats_.cast_ns);
  if (ring) {
    host::allreduce_ring(*comm_, ws, n, elem, reduce);
  } else {
    host::allreduce_direct(*comm_, ws, n, elem, reduce);
  }
  timer.lap(stats_.transfer_ns);
  stats_.transfer_ns -= stats_.reduce_ns.load() - reduce_before;
  if (plan.compress) {
    restore_into(wire, t, plan);
  } else {
    post_scale(ws, n, t.scalar_type(), plan);
    unpack(ws, t);
  }
  timer.lap(stats_.restore_ns);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupCNCCL::allreduce(std::vector<at::Tensor>& tensors,
                                                            const c10d::AllreduceOptions& opts) {
  if (auto* c = cuda_for(tensors, "allreduce")) return c->allreduce(tensors, opts);
  const at::Tensor& t = checks::single(tensors, "allreduce");
  const Plan plan = plan_reduction(config_, t.scalar_type(), t.nbytes(), opts.reduceOp.op_,
                                   premul_factor(opts.reduceOp), size_);
  stats_.record(t.nbytes(), plan.compress ? t.numel() * 2 : t.nbytes(), plan.compress);
  return enqueue(
      c10d::OpType::ALLREDUCE, "allreduce", describe(t, plan, opts.reduceOp.op_), tensors, timeout_of(opts.timeout),
      kUntouched, [=, this]() mutable { return cpu_composed_->allreduce(tensors, opts); },
      [this, t, plan](HostWork&) { run_allreduce(t, plan); });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupCNCCL::allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                                      const c10d::AllreduceCoalescedOptions& opts) {
  if (auto* c = cuda_for(tensors, "allreduce_coalesced")) return c->allreduce_coalesced(tensors, opts);
  TORCH_CHECK_VALUE(!tensors.empty(), "cnccl allreduce_coalesced: no tensors");
  std::vector<Plan> plans;
  std::vector<std::string> sigs;
  for (const auto& t : tensors) {
    checks::host_tensor(t, "allreduce_coalesced");
    plans.push_back(plan_reduction(config_, t.scalar_type(), t.nbytes(), opts.reduceOp.op_,
                                   premul_factor(opts.reduceOp), size_));
    sigs.push_back(describe(t, plans.back(), opts.reduceOp.op_));
    stats_.record(t.nbytes(), plans.back().compress ? t.numel() * 2 : t.nbytes(), plans.back().compress);
  }
  const auto timeout = timeout_of(opts.timeout);
  return enqueue(
      c10d::OpType::ALLREDUCE_COALESCED, "allreduce_coalesced", coalesced(sigs), tensors, timeout, kCoalescedFailure,
      [=, this]() mutable { return cpu_composed_->allreduce_coalesced(tensors, opts); },
      [this, tensors, plans, sigs, timeout](HostWork& work) {
        for (size_t i = 0; i < tensors.size(); ++i) {
          if (i) comm_->begin("allreduce_coalesced", work.getSequencenumber() + i, timeout, sigs[i]);
          run_allreduce(tensors[i], plans[i]);
        }
      },
      int(tensors.size()));
}

void ProcessGroupCNCCL::run_reduce_scatter(const std::vector<at::Tensor>& inputs, const at::Tensor& output,
                                           const Plan& plan) {
  at::Tensor out = output;
  const size_t each = out.numel();
  // Nothing to move (every rank agreed on the count through the signature header); the fused
  // cast's source lookup would divide by `each`.
  if (each == 0) return;
  PhaseTimer timer;
  const size_t elem = plan.compress ? 2 : out.element_size();
  char* ws = scratch(0, each * elem * size_);
  auto* wire = reinterpret_cast<uint16_t*>(ws);
  const uint64_t reduce_before = stats_.reduce_ns.load();
  host::Reducer reduce;
  if (folds_cast(plan, out.scalar_type())) {
    std::vector<at::Tensor> srcs;
    for (const auto& in : inputs) srcs.push_back(in.contiguous());
    const int first = (rank_ + size_ - 1) % size_;
    cast_into(srcs[first], wire + each * first, plan);
    std::vector<const float*> x;
    for (const auto& in : srcs) x.push_back(in.const_data_ptr<float>());
    // The reducer keeps `srcs` alive: they may be contiguous copies made here.
    reduce = cast_add_reducer(wire, [x, each, srcs](size_t i) { return x[i / each] + i % each; }, plan);
  } else {
    for (int i = 0; i < size_; ++i) {
      char* part = ws + each * elem * i;
      if (plan.compress) {
        cast_into(inputs[i].contiguous(), reinterpret_cast<uint16_t*>(part), plan);
      } else {
        pack(inputs[i], part);
      }
    }
    if (!plan.compress) pre_scale(ws, each * size_, out.scalar_type(), plan);
    reduce = plan.compress ? wire_reducer(plan.wire, plan.inner_op) : aten_reducer(out.scalar_type(), plan.inner_op);
  }
  timer.lap(stats_.cast_ns);
  host::reduce_scatter_ring(*comm_, ws, host::Parts::equal(each, size_), elem,
                            timed(std::move(reduce), stats_.reduce_ns));
  timer.lap(stats_.transfer_ns);
  stats_.transfer_ns -= stats_.reduce_ns.load() - reduce_before;
  char* mine = ws + each * elem * rank_;
  if (plan.compress) {
    restore_into(reinterpret_cast<uint16_t*>(mine), out, plan);
  } else {
    post_scale(mine, each, out.scalar_type(), plan);
    unpack(mine, out);
  }
  timer.lap(stats_.restore_ns);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupCNCCL::reduce_scatter(std::vector<at::Tensor>& outputs,
                                                                 std::vector<std::vector<at::Tensor>>& inputs,
                                                                 const c10d::ReduceScatterOptions& opts) {
  if (auto* c = cuda_for(outputs, "reduce_scatter")) return c->reduce_scatter(outputs, inputs, opts);
  const at::Tensor& out = checks::single(outputs, "reduce_scatter");
  TORCH_CHECK_VALUE(inputs.size() == 1, "cnccl reduce_scatter: expects one input list, got ", inputs.size());
  checks::list_like(inputs[0], size_, out, "reduce_scatter", "input");
  const int64_t nbytes = out.nbytes() * size_;
  const Plan plan = plan_reduction(config_, out.scalar_type(), nbytes, opts.reduceOp.op_,
                                   premul_factor(opts.reduceOp), size_);
  stats_.record(nbytes, plan.compress ? out.numel() * size_ * 2 : nbytes, plan.compress);
  std::vector<at::Tensor> ins = inputs[0];
  return enqueue(
      c10d::OpType::REDUCE_SCATTER, "reduce_scatter", describe(out, plan, opts.reduceOp.op_), outputs,
      timeout_of(opts.timeout), kUntouched,
      [=, this]() mutable { return cpu_composed_->reduce_scatter(outputs, inputs, opts); },
      [this, ins, out, plan](HostWork&) { run_reduce_scatter(ins, out, plan); });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupCNCCL::_reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                                       const c10d::ReduceScatterOptions& opts) {
  if (auto* c = cuda_for(output, "reduce_scatter_tensor")) return c->reduce_scatter_tensor(output, input, opts);
  checks::host_tensor(output, "reduce_scatter_tensor");
  checks::host_tensor(input, "reduce_scatter_tensor");
  TORCH_CHECK_TYPE(input.scalar_type() == output.scalar_type(), "cnccl reduce_scatter_tensor: input dtype ",
                   input.scalar_type(), " does not match output dtype ", output.scalar_type());
  TORCH_CHECK_VALUE(input.numel() == output.numel() * size_, "cnccl reduce_scatter_tensor: input has ",
                    input.numel(), " elements, expected world size (", size_, ") x output (", output.numel(), ")");
  const Plan plan = plan_reduction(config_, input.scalar_type(), input.nbytes(), opts.reduceOp.op_,
                                   premul_factor(opts.reduceOp), size_);
  stats_.record(input.nbytes(), plan.compress ? input.numel() * 2 : input.nbytes(), plan.compress);
  std::vector<at::Tensor> parts = input.contiguous().reshape({-1}).chunk(size_);
  return enqueue(
      c10d::OpType::_REDUCE_SCATTER_BASE, "reduce_scatter_tensor", describe(input, plan, opts.reduceOp.op_), {output},
      timeout_of(opts.timeout), kUntouched,
      [=, this]() mutable { return cpu_composed_->reduce_scatter_tensor(output, input, opts); },
      [this, parts, output, plan](HostWork&) { run_reduce_scatter(parts, output, plan); });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupCNCCL::reduce_scatter_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs, const c10d::ReduceScatterOptions& opts) {
  if (auto* c = cuda_for(outputs, "reduce_scatter_tensor_coalesced")) {
    return c->reduce_scatter_tensor_coalesced(outputs, inputs, opts);
  }
  TORCH_CHECK_VALUE(outputs.size() == inputs.size() && !inputs.empty(),
                    "cnccl reduce_scatter_tensor_coalesced: needs as many outputs as inputs, got ", outputs.size(),
                    " and ", inputs.size());
  std::vector<std::vector<at::Tensor>> parts;
  std::vector<Plan> plans;
  std::vector<std::string> sigs;
  for (size_t i = 0; i < inputs.size(); ++i) {
    checks::host_tensor(inputs[i], "reduce_scatter_tensor_coalesced");
    checks::host_tensor(outputs[i], "reduce_scatter_tensor_coalesced");
    TORCH_CHECK_VALUE(inputs[i].numel() == outputs[i].numel() * size_ &&
                          inputs[i].scalar_type() == outputs[i].scalar_type(),
                      "cnccl reduce_scatter_tensor_coalesced: input ", i, " must be world size x output ", i,
                      " elements of the same dtype");
    plans.push_back(plan_reduction(config_, inputs[i].scalar_type(), inputs[i].nbytes(), opts.reduceOp.op_,
                                   premul_factor(opts.reduceOp), size_));
    sigs.push_back(describe(inputs[i], plans.back(), opts.reduceOp.op_));
    stats_.record(inputs[i].nbytes(), plans.back().compress ? inputs[i].numel() * 2 : inputs[i].nbytes(),
                  plans.back().compress);
    parts.push_back(inputs[i].contiguous().reshape({-1}).chunk(size_));
  }
  const auto timeout = timeout_of(opts.timeout);
  return enqueue(
      c10d::OpType::COALESCED, "reduce_scatter_tensor_coalesced", coalesced(sigs), outputs, timeout, kCoalescedFailure,
      [=, this]() mutable { return cpu_composed_->reduce_scatter_tensor_coalesced(outputs, inputs, opts); },
      [this, parts, outputs, plans, sigs, timeout](HostWork& work) {
        for (size_t i = 0; i < parts.size(); ++i) {
          if (i) {
            comm_->begin("reduce_scatter_tensor_coalesced", work.getSequencenumber() + i, timeout, sigs[i]);
          }
          run_reduce_scatter(parts[i], outputs[i], plans[i]);
        }
      },
      int(inputs.size()));
}

void ProcessGroupCNCCL::run_allgather(const at::Tensor& input, char* out) {
  const size_t bytes = input.nbytes();
  pack(input, out + bytes * rank_);
  host::allgather_ring(*comm_, out, host::Parts::equal(bytes, size_), 1);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupCNCCL::allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                                            std::vector<at::Tensor>& inputs,
                                                            const c10d::AllgatherOptions& opts) {
  if (auto* c = cuda_for(inputs, "allgather")) return c->inner().allgather(outputs, inputs, opts);
  const at::Tensor& in = checks::single(inputs, "allgather");
  TORCH_CHECK_VALUE(outputs.size() == 1, "cnccl allgather: expects one output list, got ", outputs.size());
  checks::list_like(outputs[0], size_, in, "allgather", "output");
  stats_.record(in.nbytes() * size_, in.nbytes() * size_, false);
  std::vector<at::Tensor> outs = outputs[0];
  return enqueue(
      c10d::OpType::ALLGATHER, "allgather", describe(in), outs, timeout_of(opts.timeout), kUntouched,
      [=, this]() mutable { return engine().allgather(outputs, inputs, opts); },
      [this, in, outs](HostWork&) mutable {
        char* ws = scratch(0, in.nbytes() * size_);
        run_allgather(in, ws);
        for (int i = 0; i < size_; ++i) unpack(ws + in.nbytes() * i, outs[i]);
      });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupCNCCL::allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                                      std::vector<at::Tensor>& inputs,
                                                                      const c10d::AllgatherOptions& opts) {
  if (auto* c = cuda_for(inputs, "allgather_coalesced")) return c->allgather_coalesced(outputs, inputs, opts);
  // c10d's layout (gloo's): outputs[r][i] receives rank r's inputs[i].
  TORCH_CHECK_VALUE(!inputs.empty(), "cnccl allgather_coalesced: no input tensors");
  TORCH_CHECK_VALUE(int(outputs.size()) == size_, "cnccl allgather_coalesced: expects one output list per rank (",
                    size_, "), got ", outputs.size());
  std::vector<at::Tensor> flat_outputs;
  for (const auto& in : inputs) checks::host_tensor(in, "allgather_coalesced");
  for (int r = 0; r < size_; ++r) {
    TORCH_CHECK_VALUE(outputs[r].size() == inputs.size(), "cnccl allgather_coalesced: output list ", r, " has ",
                      outputs[r].size(), " tensors, expected one per input (", inputs.size(), ")");
    for (size_t i = 0; i < inputs.size(); ++i) {
      checks::host_tensor(outputs[r][i], "allgather_coalesced");
      checks::same_kind(inputs[i], outputs[r][i], "allgather_coalesced", "output");
    }
    flat_outputs.insert(flat_outputs.end(), outputs[r].begin(), outputs[r].end());
  }
  std::vector<std::string> sigs;
  for (const auto& in : inputs) {
    stats_.record(in.nbytes() * size_, in.nbytes() * size_, false);
    sigs.push_back(describe(in));
  }
  const auto timeout = timeout_of(opts.timeout);
  auto outs = outputs;
  return enqueue(
      c10d::OpType::ALLGATHER_COALESCED, "allgather_coalesced", coalesced(sigs), flat_outputs, timeout,
      kCoalescedFailure, [=, this]() mutable { return cpu_composed_->allgather_coalesced(outputs, inputs, opts); },
      [this, inputs, outs, timeout](HostWork& work) mutable {
        for (size_t i = 0; i < inputs.size(); ++i) {
          if (i) {
            comm_->begin("allgather_coalesced", work.getSequencenumber() + i, timeout, describe(inputs[i]));
          }
          char* ws = scratch(0, inputs[i].nbytes() * size_);
          run_allgather(inputs[i], ws);
          for (int r = 0; r < size_; ++r) unpack(ws + inputs[i].nbytes() * r, outs[r][i]);
        }
      },
      int(inputs.size()));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupCNCCL::_allgather_base(at::Tensor& output, at::Tensor& input,
                                                                  const c10d::AllgatherOptions& opts) {
  if (auto* c = cuda_for(input, "all_gather_into_tensor")) return c->inner()._allgather_base(output, input, opts);
  checks::host_tensor(output, "all_gather_into_tensor");
  checks::host_tensor(input, "all_gather_into_tensor");
  TORCH_CHECK_TYPE(input.scalar_type() == output.scalar_type(), "cnccl all_gather_into_tensor: output dtype ",
                   output.scalar_type(), " does not match input dtype ", input.scalar_type());
  TORCH_CHECK_VALUE(output.numel() == input.numel() * size_, "cnccl all_gather_into_tensor: output has ",
                    output.numel(), " elements, expected world size (", size_, ") x input (", input.numel(), ")");
  stats_.record(output.nbytes(), output.nbytes(), false);
  return enqueue(
      c10d::OpType::_ALLGATHER_BASE, "all_gather_into_tensor", describe(input), {output}, timeout_of(opts.timeout),
      kOutputsUndefined, [=, this]() mutable { return engine()._allgather_base(output, input, opts); },
      [this, output, input](HostWork&) mutable {
        if (output.is_contiguous()) {
          run_allgather(input, static_cast<char*>(output.data_ptr()));
        } else {
          char* ws = scratch(0, output.nbytes());
          run_allgather(input, ws);
          unpack(ws, output);
        }
      });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupCNCCL::allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                                  std::vector<at::Tensor>& inputs,
                                                                                  const c10d::AllgatherOptions& opts) {
  if (auto* c = cuda_for(inputs, "allgather_into_tensor_coalesced")) {
    return c->inner().allgather_into_tensor_coalesced(outputs, inputs, opts);
  }
  TORCH_CHECK_VALUE(outputs.size() == inputs.size() && !inputs.empty(),
                    "cnccl allgather_into_tensor_coalesced: needs as many outputs as inputs");
  std::vector<std::string> sigs;
  for (size_t i = 0; i < inputs.size(); ++i) {
    checks::host_tensor(inputs[i], "allgather_into_tensor_coalesced");
    checks::host_tensor(outputs[i], "allgather_into_tensor_coalesced");
    TORCH_CHECK_VALUE(outputs[i].numel() == inputs[i].numel() * size_ &&
                          outputs[i].scalar_type() == inputs[i].scalar_type(),
                      "cnccl allgather_into_tensor_coalesced: output ", i, " must be world size x input ", i,
                      " elements of the same dtype");
    stats_.record(outputs[i].nbytes(), outputs[i].nbytes(), false);
    sigs.push_back(describe(inputs[i]));
  }
  const auto timeout = timeout_of(opts.timeout);
  return enqueue(
      c10d::OpType::COALESCED, "allgather_into_tensor_coalesced", coalesced(sigs), outputs, timeout, kCoalescedFailure,
      [=, this]() mutable { return engine().allgather_into_tensor_coalesced(outputs, inputs, opts); },
      [this, outputs, inputs, timeout](HostWork& work) mutable {
        for (size_t i = 0; i < inputs.size(); ++i) {
          if (i) {
            comm_->begin("allgather_into_tensor_coalesced", work.getSequencenumber() + i, timeout, describe(inputs[i]));
          }
          char* ws = scratch(0, outputs[i].nbytes());
          run_allgather(inputs[i], ws);
          unpack(ws, outputs[i]);
        }
      },
      int(inputs.size()));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupCNCCL::broadcast(std::vector<at::Tensor>& tensors,
                                                            const c10d::BroadcastOptions& opts) {
  if (auto* c = cuda_for(tensors, "broadcast")) return c->inner().broadcast(tensors, opts);
  const at::Tensor& t = checks::single(tensors, "broadcast");
  checks::root(opts.rootRank, size_, "broadcast");
  stats_.record(t.nbytes(), t.nbytes(), false);
  const int root = int(opts.rootRank);
  return enqueue(
      c10d::OpType::BROADCAST, "broadcast", with_root(describe(t), root), tensors, timeout_of(opts.timeout), kUntouched,
      [=, this]() mutable { return engine().broadcast(tensors, opts); },
      [this, t, root](HostWork&) mutable {
        char* ws = scratch(0, t.nbytes());
        if (rank_ == root) pack(t, ws);
        host::broadcast_direct(*comm_, ws, t.nbytes(), root);
        if (rank_ != root) unpack(ws, t);
      });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupCNCCL::reduce(std::vector<at::Tensor>& tensors,
                                                         const c10d::ReduceOptions& opts) {
  if (auto* c = cuda_for(tensors, "reduce")) return c->reduce(tensors, opts);
  const at::Tensor& t = checks::single(tensors, "reduce");
  checks::root(opts.rootRank, size_, "reduce");
  // reduce is never lossy (docs/design.md, "Semantics"): plan with compression off, for the scaling alone.
  Config exact = config_;
  exact.wire.reset();
  const Plan plan =
      plan_reduction(exact, t.scalar_type(), t.nbytes(), opts.reduceOp.op_, premul_factor(opts.reduceOp), size_);
  stats_.record(t.nbytes(), t.nbytes(), false);
  const int root = int(opts.rootRank);
  return enqueue(
      c10d::OpType::REDUCE, "reduce", with_root(describe(t, plan, opts.reduceOp.op_), root), tensors,
      timeout_of(opts.timeout), kUntouched, [=, this]() mutable { return cpu_composed_->reduce(tensors, opts); },
      [this, t, root, plan](HostWork&) mutable {
        const int64_t n = t.numel();
        char* ws = scratch(0, t.nbytes());
        pack(t, ws);
        pre_scale(ws, n, t.scalar_type(), plan);
        host::reduce_direct(*comm_, ws, n, t.element_size(), root, aten_reducer(t.scalar_type(), plan.inner_op));
        if (rank_ == root) {
          post_scale(ws, n, t.scalar_type(), plan);
          unpack(ws, t);
        }
      });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupCNCCL::gather(std::vector<std::vector<at::Tensor>>& outputs,
                                                         std::vector<at::Tensor>& inputs,
                                                         const c10d::GatherOptions& opts) {
  if (auto* c = cuda_for(inputs, "gather")) return c->inner().gather(outputs, inputs, opts);
  const at::Tensor& in = checks::single(inputs, "gather");
  checks::root(opts.rootRank, size_, "gather");
  const int root = int(opts.rootRank);
  const std::vector<at::Tensor> outs = checks::root_list(outputs, rank_ == root, size_, in, "gather", "output");
  stats_.record(in.nbytes(), in.nbytes(), false);
  return enqueue(
      c10d::OpType::GATHER, "gather", with_root(describe(in), root), outs, timeout_of(opts.timeout), kUntouched,
      [=, this]() mutable { return engine().gather(outputs, inputs, opts); },
      [this, in, outs, root](HostWork&) mutable {
        const size_t bytes = in.nbytes();
        char* ws = scratch(0, bytes * (rank_ == root ? size_ : 1));
        char* src = scratch(1, bytes);
        pack(in, src);
        host::gather_direct(*comm_, src, bytes, ws, root);
        for (size_t i = 0; i < outs.size(); ++i) unpack(ws + bytes * i, outs[i]);
      });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupCNCCL::scatter(std::vector<at::Tensor>& outputs,
                                                          std::vector<std::vector<at::Tensor>>& inputs,
                                                          const c10d::ScatterOptions& opts) {
  if (auto* c = cuda_for(outputs, "scatter")) return c->inner().scatter(outputs, inputs, opts);
  const at::Tensor& out = checks::single(outputs, "scatter");
  checks::root(opts.rootRank, size_, "scatter");
  const int root = int(opts.rootRank);
  const std::vector<at::Tensor> ins = checks::root_list(inputs, rank_ == root, size_, out, "scatter", "input");
  stats_.record(out.nbytes(), out.nbytes(), false);
  return enqueue(
      c10d::OpType::SCATTER, "scatter", with_root(describe(out), root), outputs, timeout_of(opts.timeout), kUntouched,
      [=, this]() mutable { return engine().scatter(outputs, inputs, opts); },
      [this, ins, out, root](HostWork&) mutable {
        const size_t bytes = out.nbytes();
        char* src = scratch(1, bytes * ins.size());
        for (size_t i = 0; i < ins.size(); ++i) pack(ins[i], src + bytes * i);
        char* ws = scratch(0, bytes);
        host::scatter_direct(*comm_, src, ws, bytes, root);
        unpack(ws, out);
      });
}

namespace {

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

c10::intrusive_ptr<c10d::Work> ProcessGroupCNCCL::alltoall_base(at::Tensor& output, at::Tensor& input,
                                                                std::vector<int64_t>& output_split_sizes,
                                                                std::vector<int64_t>& input_split_sizes,
                                                                const c10d::AllToAllOptions& opts) {
  if (auto* c = cuda_for(output, "all_to_all_single")) {
    return c->inner().alltoall_base(output, input, output_split_sizes, input_split_sizes, opts);
  }
  checks::host_tensor(output, "all_to_all_single");
  checks::host_tensor(input, "all_to_all_single");
  TORCH_CHECK_TYPE(input.scalar_type() == output.scalar_type(), "cnccl all_to_all_single: output dtype ",
                   output.scalar_type(), " does not match input dtype ", input.scalar_type());
  const int64_t in_rows = input.dim() ? input.size(0) : 1, out_rows = output.dim() ? output.size(0) : 1;
  const size_t in_row = in_rows ? input.nbytes() / in_rows : 0, out_row = out_rows ? output.nbytes() / out_rows : 0;
  TORCH_CHECK_VALUE(in_rows == 0 || out_rows == 0 || in_row == out_row,
                    "cnccl all_to_all_single: input and output rows have different sizes");
  std::vector<size_t> send_off, send_len, recv_off, recv_len;
  layout(input_split_sizes, in_rows, size_, in_row, "input", send_off, send_len);
  layout(output_split_sizes, out_rows, size_, out_row, "output", recv_off, recv_len);
  TORCH_CHECK_VALUE(send_len[rank_] == recv_len[rank_], "cnccl all_to_all_single: this rank sends itself ",
                    send_len[rank_], " bytes but expects ", recv_len[rank_]);
  stats_.record(input.nbytes(), input.nbytes(), false);
  // Split sizes may differ between ranks; the dtype and row size may not.
  const std::string sig =
      std::string(c10::toString(input.scalar_type())) + " rows of " + std::to_string(in_row) + " bytes";
  return enqueue(
      c10d::OpType::ALLTOALL_BASE, "all_to_all_single", sig, {output}, timeout_of(opts.timeout), kUntouched,
      [=, this]() mutable {
        return engine().alltoall_base(output, input, output_split_sizes, input_split_sizes, opts);
      },
      [this, output, input, send_off, send_len, recv_off, recv_len](HostWork&) mutable {
        char* src = scratch(1, input.nbytes());
        pack(input, src);
        char* ws = scratch(0, output.nbytes());
        host::alltoall_direct(*comm_, src, send_off, send_len, ws, recv_off, recv_len);
        unpack(ws, output);
      });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupCNCCL::alltoall(std::vector<at::Tensor>& outputs,
                                                           std::vector<at::Tensor>& inputs,
                                                           const c10d::AllToAllOptions& opts) {
  if (auto* c = cuda_for(outputs, "all_to_all")) return c->inner().alltoall(outputs, inputs, opts);
  TORCH_CHECK_VALUE(int(inputs.size()) == size_ && int(outputs.size()) == size_, "cnccl all_to_all: expects ",
                    size_, " input and output tensors, got ", inputs.size(), " and ", outputs.size());
  std::vector<size_t> send_off, send_len, recv_off, recv_len;
  size_t in_total = 0, out_total = 0;
  for (int i = 0; i < size_; ++i) {
    checks::host_tensor(inputs[i], "all_to_all");
    checks::host_tensor(outputs[i], "all_to_all");
    TORCH_CHECK_TYPE(inputs[i].scalar_type() == outputs[i].scalar_type(), "cnccl all_to_all: output ", i,
                     " dtype does not match input ", i);
    send_off.push_back(in_total);
    send_len.push_back(inputs[i].nbytes());
    in_total += inputs[i].nbytes();
    recv_off.push_back(out_total);
    recv_len.push_back(outputs[i].nbytes());
    out_total += outputs[i].nbytes();
  }
  TORCH_CHECK_VALUE(send_len[rank_] == recv_len[rank_], "cnccl all_to_all: this rank's own input and output ",
                    "differ in size");
  stats_.record(in_total, in_total, false);
  return enqueue(
      c10d::OpType::ALLTOALL, "all_to_all", c10::toString(inputs[0].scalar_type()), outputs, timeout_of(opts.timeout),
      kUntouched, [=, this]() mutable { return engine().alltoall(outputs, inputs, opts); },
      [this, outputs, inputs, send_off, send_len, recv_off, recv_len, in_total, out_total](HostWork&) mutable {
        char* src = scratch(1, in_total);
        for (int i = 0; i < size_; ++i) pack(inputs[i], src + send_off[i]);
        char* ws = scratch(0, out_total);
        host::alltoall_direct(*comm_, src, send_off, send_len, ws, recv_off, recv_len);
        for (int i = 0; i < size_; ++i) unpack(ws + recv_off[i], outputs[i]);
      });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupCNCCL::barrier(const c10d::BarrierOptions& opts) {
  stats_.collectives += 1;
  return enqueue(
      c10d::OpType::BARRIER, "barrier", "", {}, timeout_of(opts.timeout), kUntouched,
      [=, this]() mutable { return engine().barrier(opts); }, [this](HostWork&) { host::barrier_direct(*comm_); });
}

}  // namespace cnccl

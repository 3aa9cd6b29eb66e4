#include "backend/cuda/nccl_path.h"

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <nccl.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>

#include "backend/cuda/compressed_work.h"
#include "compress/cuda_codec.h"

namespace cnccl::cuda {
namespace {

// The inner group's keys live under this sub-prefix of the group's store.
constexpr const char* kStorePrefix = "cnccl/nccl";
// NCCL's bf16 reductions arrived in 2.10 (NCCL_VERSION(2, 10, 0)).
constexpr int kNcclBf16Version = 21000;

at::ScalarType wire_dtype(codec::Wire wire) { return wire == codec::Wire::kFp16 ? at::kHalf : at::kBFloat16; }

void check_tensor(const at::Tensor& t, const at::Tensor& like, const char* op) {
  TORCH_CHECK_VALUE(t.is_cuda() && t.device() == like.device(), "cnccl ", op, ": all tensors must be on ",
                    like.device(), ", got one on ", t.device());
  TORCH_CHECK_VALUE(t.layout() == at::kStrided, "cnccl ", op, ": ", t.layout(), " tensors are not supported");
  // Elementwise cast and restore only need the elements to fill one block of memory.
  TORCH_CHECK_VALUE(t.is_non_overlapping_and_dense(), "cnccl ", op,
                    ": tensors must be dense (contiguous in some memory format), as NCCL requires");
}

void check_reduce_scatter(const at::Tensor& output, const at::Tensor& input, int size, const char* op) {
  TORCH_CHECK_TYPE(input.scalar_type() == output.scalar_type(), "cnccl ", op, ": input dtype ",
                   input.scalar_type(), " does not match output dtype ", output.scalar_type());
  TORCH_CHECK_VALUE(input.numel() == output.numel() * size, "cnccl ", op, ": input has ", input.numel(),
                    " elements, expected world size (", size, ") x output (", output.numel(), ")");
  TORCH_CHECK_VALUE(input.is_contiguous() && output.is_contiguous(), "cnccl ", op,
                    ": input and output must be contiguous, as NCCL requires");
}

c10d::ReduceOp inner_op(const Plan& plan) { return c10d::ReduceOp(plan.inner_op); }

template <typename Opts>
Opts with_inner_op(const Opts& opts, const Plan& plan) {
  Opts inner = opts;
  inner.reduceOp = inner_op(plan);
  return inner;
}

}  // namespace

std::shared_ptr<CudaPath> make_nccl_path(const CudaPathArgs& args) { return std::make_shared<NcclPath>(args); }

int loaded_nccl_version() {
  static const int version = [] {
    int v = 0;
    const ncclResult_t rc = ncclGetVersion(&v);
    TORCH_CHECK(rc == ncclSuccess, "cnccl: ncclGetVersion failed: ", ncclGetErrorString(rc));
    return v;
  }();
  return version;
}

NcclPath::NcclPath(const CudaPathArgs& args)
    : rank_(args.rank), size_(args.size), config_(*args.config), stats_(*args.stats) {
  // torch's own message, raised before the constructor: ProcessGroupNCCL's constructor leaves
  // the heap corrupted when it throws this itself (seen with torch 2.15 on a machine without a GPU).
  TORCH_CHECK_VALUE(at::cuda::getNumGPUs() > 0, "ProcessGroupNCCL is only supported with GPUs, no GPUs found!");
  auto options = c10d::ProcessGroupNCCL::Options::create();
  options->timeout = args.options->timeout;
  options->group_name = args.options->group_name;
  options->global_ranks_in_group = args.options->global_ranks_in_group;
  auto store = c10::make_intrusive<c10d::PrefixStore>(kStorePrefix, args.store);
  inner_ = c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank_, size_, options);
  if (!args.group_uid.empty()) inner_->setGroupUid(args.group_uid);
  inner_->setGroupDesc(args.group_desc);
  if (args.bound_device) inner_->setBoundDeviceId(args.bound_device);
}

NcclPath::~NcclPath() = default;

c10::Stream NcclPath::side_stream(c10::DeviceIndex device) {
  std::lock_guard<std::mutex> lock(streams_mutex_);
  if (side_streams_.size() <= size_t(device)) side_streams_.resize(device + 1);
  auto& stream = side_streams_[device];
  if (!stream) stream = at::cuda::getStreamFromPool(/*isHighPriority=*/false, device).unwrap();
  return *stream;
}

Plan NcclPath::plan(const at::Tensor& t, int64_t nbytes, const c10d::ReduceOp& op) const {
  Plan p = plan_reduction(config_, t.scalar_type(), nbytes, op.op_, premul_factor(op), size_);
  if (p.compress && p.wire == codec::Wire::kBf16) {
    const int version = cuda::loaded_nccl_version();
    TORCH_CHECK_VALUE(version >= kNcclBf16Version, "cnccl: the bf16 wire needs NCCL >= 2.10, but this process "
                      "loaded NCCL ", version, "; use CNCCL_WIRE_DTYPE=fp16");
  }
  return p;
}

void NcclPath::cast_into(const at::Tensor& wide, const at::Tensor& wire, const Plan& plan) const {
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream(wide.device().index()).stream();
  auto* dst = static_cast<uint16_t*>(wire.data_ptr());
  if (wide.scalar_type() == at::kFloat) {
    codec::cuda::cast(wide.const_data_ptr<float>(), dst, wide.numel(), float(plan.pre_scale), plan.wire, stream);
  } else {
    codec::cuda::cast(wide.const_data_ptr<double>(), dst, wide.numel(), float(plan.pre_scale), plan.wire, stream);
  }
}

at::Tensor NcclPath::cast(const at::Tensor& wide, const Plan& plan) const {
  // Allocated on the caller's current stream, where the cast runs; NCCL and the side stream
  // record their own uses of it.
  at::Tensor wire = at::empty({wide.numel()}, wide.options().dtype(wire_dtype(plan.wire)));
  cast_into(wide, wire, plan);
  return wire;
}

c10::intrusive_ptr<c10d::Work> NcclPath::finish(c10d::OpType type,
                                                std::vector<c10::intrusive_ptr<c10d::Work>> inner_works,
                                                std::vector<Restore> restores, std::vector<at::Tensor> outputs) {
  const at::Device device = outputs.front().device();
  const c10::cuda::CUDAStream side(c10::cuda::CUDAStream::UNCHECKED, side_stream(device.index()));
  c10::cuda::CUDAStreamGuard on_side(side);
  // Under the guard, an NCCL work's wait() makes the side stream (not the host) wait for it.
  for (const auto& w : inner_works) w->wait();
  for (const auto& r : restores) {
    auto* src = static_cast<const uint16_t*>(r.wire.const_data_ptr());
    const float scale = float(r.plan.post_scale);
    if (r.wide.scalar_type() == at::kFloat) {
      codec::cuda::restore(src, r.wide.mutable_data_ptr<float>(), r.wide.numel(), scale, r.plan.wire, side.stream());
    } else {
      codec::cuda::restore(src, r.wide.mutable_data_ptr<double>(), r.wide.numel(), scale, r.plan.wire, side.stream());
    }
    // The allocator must not hand these blocks out again before the side stream is done with them.
    r.wire.record_stream(side.unwrap());
    r.wide.record_stream(side.unwrap());
  }
  auto restored = std::make_shared<at::cuda::CUDAEvent>();
  restored->record(side);
  // Completed now, after the restores were enqueued: the future records its event on the
  // current (side) stream, so whoever waits on it sees the restored tensors.
  auto future = c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()),
                                                         std::vector<c10::Device>{device});
  future->markCompleted(c10::IValue(outputs));
  return c10::make_intrusive<CompressedWork>(rank_, type, std::move(inner_works), std::move(future),
                                             std::move(restored), std::move(outputs));
}

c10::intrusive_ptr<c10d::Work> NcclPath::allreduce(std::vector<at::Tensor>& tensors,
                                                   const c10d::AllreduceOptions& opts) {
  TORCH_CHECK_VALUE(tensors.size() == 1, "cnccl allreduce: expects exactly one tensor, got ", tensors.size());
  const at::Tensor& t = tensors[0];
  const Plan p = plan(t, t.nbytes(), opts.reduceOp);
  stats_.record(t.nbytes(), p.compress ? t.numel() * 2 : t.nbytes(), p.compress);
  if (!p.compress) return inner_->allreduce(tensors, opts);
  check_tensor(t, t, "allreduce");
  c10::cuda::CUDAGuard guard(t.device());
  std::vector<at::Tensor> wire{cast(t, p)};
  auto work = inner_->allreduce(wire, with_inner_op(opts, p));
  return finish(c10d::OpType::ALLREDUCE, {work}, {{wire[0], t, p}}, tensors);
}

c10::intrusive_ptr<c10d::Work> NcclPath::allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                             const c10d::AllreduceCoalescedOptions& opts) {
  TORCH_CHECK_VALUE(!tensors.empty(), "cnccl allreduce_coalesced: no tensors");
  std::vector<at::Tensor> plain, wire;
  std::vector<Restore> restores;
  std::optional<Plan> wire_plan;
  for (const auto& t : tensors) {
    check_tensor(t, tensors[0], "allreduce_coalesced");
    const Plan p = plan(t, t.nbytes(), opts.reduceOp);
    stats_.record(t.nbytes(), p.compress ? t.numel() * 2 : t.nbytes(), p.compress);
    if (!p.compress) {
      plain.push_back(t);
      continue;
    }
    wire_plan = p;
    restores.push_back({at::Tensor(), t, p});
  }
  if (restores.empty()) return inner_->allreduce_coalesced(tensors, opts);
  c10::cuda::CUDAGuard guard(tensors[0].device());
  for (auto& r : restores) {
    r.wire = cast(r.wide, r.plan);
    wire.push_back(r.wire);
  }
  // Compressed and plain tensors need different inner ops (the scales are already applied to
  // the former), so each kind goes in its own coalesced call; every rank splits alike.
  std::vector<c10::intrusive_ptr<c10d::Work>> works{inner_->allreduce_coalesced(wire, with_inner_op(opts, *wire_plan))};
  if (!plain.empty()) works.push_back(inner_->allreduce_coalesced(plain, opts));
  return finish(c10d::OpType::ALLREDUCE_COALESCED, std::move(works), std::move(restores), tensors);
}

c10::intrusive_ptr<c10d::Work> NcclPath::reduce_scatter_tensor(at::Tensor& output, at::Tensor& input,
                                                               const c10d::ReduceScatterOptions& opts) {
  const Plan p = plan(input, input.nbytes(), opts.reduceOp);
  stats_.record(input.nbytes(), p.compress ? input.numel() * 2 : input.nbytes(), p.compress);
  if (!p.compress) return inner_->_reduce_scatter_base(output, input, opts);
  check_tensor(input, input, "reduce_scatter_tensor");
  check_tensor(output, input, "reduce_scatter_tensor");
  check_reduce_scatter(output, input, size_, "reduce_scatter_tensor");
  c10::cuda::CUDAGuard guard(input.device());
  at::Tensor wire_in = cast(input, p);
  at::Tensor wire_out = at::empty({output.numel()}, wire_in.options());
  auto work = inner_->_reduce_scatter_base(wire_out, wire_in, with_inner_op(opts, p));
  return finish(c10d::OpType::_REDUCE_SCATTER_BASE, {work}, {{wire_out, output, p}}, {output});
}

c10::intrusive_ptr<c10d::Work> NcclPath::reduce_scatter(std::vector<at::Tensor>& outputs,
                                                        std::vector<std::vector<at::Tensor>>& inputs,
                                                        const c10d::ReduceScatterOptions& opts) {
  TORCH_CHECK_VALUE(outputs.size() == 1 && inputs.size() == 1, "cnccl reduce_scatter: expects one output and one "
                    "input list, got ", outputs.size(), " and ", inputs.size());
  const at::Tensor& out = outputs[0];
  TORCH_CHECK_VALUE(int(inputs[0].size()) == size_, "cnccl reduce_scatter: input list has ", inputs[0].size(),
                    " tensors, expected one per rank (", size_, ")");
  const int64_t nbytes = out.nbytes() * size_;
  const Plan p = plan(out, nbytes, opts.reduceOp);
  stats_.record(nbytes, p.compress ? out.numel() * size_ * 2 : nbytes, p.compress);
  if (!p.compress) return inner_->reduce_scatter(outputs, inputs, opts);
  check_tensor(out, out, "reduce_scatter");
  c10::cuda::CUDAGuard guard(out.device());
  // The list form goes out as one flat 16-bit buffer: the casts write it directly, where NCCL's
  // own list form would first copy the inputs into one.
  at::Tensor wire_in = at::empty({out.numel() * size_}, out.options().dtype(wire_dtype(p.wire)));
  for (int i = 0; i < size_; ++i) {
    const at::Tensor& in = inputs[0][i];
    check_tensor(in, out, "reduce_scatter");
    TORCH_CHECK_VALUE(in.numel() == out.numel() && in.scalar_type() == out.scalar_type(), "cnccl reduce_scatter: "
                      "input ", i, " must have the output's dtype and element count");
    cast_into(in, wire_in.narrow(0, i * out.numel(), out.numel()), p);
  }
  at::Tensor wire_out = at::empty({out.numel()}, wire_in.options());
  auto work = inner_->_reduce_scatter_base(wire_out, wire_in, with_inner_op(opts, p));
  return finish(c10d::OpType::REDUCE_SCATTER, {work}, {{wire_out, out, p}}, outputs);
}

c10::intrusive_ptr<c10d::Work> NcclPath::reduce_scatter_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                         std::vector<at::Tensor>& inputs,
                                                                         const c10d::ReduceScatterOptions& opts) {
  TORCH_CHECK_VALUE(outputs.size() == inputs.size() && !inputs.empty(), "cnccl reduce_scatter_tensor_coalesced: "
                    "needs as many outputs as inputs, got ", outputs.size(), " and ", inputs.size());
  std::vector<at::Tensor> plain_in, plain_out, wide_in, wire_in, wire_out;
  std::vector<Restore> restores;
  std::optional<Plan> wire_plan;
  for (size_t i = 0; i < inputs.size(); ++i) {
    check_tensor(inputs[i], inputs[0], "reduce_scatter_tensor_coalesced");
    check_tensor(outputs[i], inputs[0], "reduce_scatter_tensor_coalesced");
    check_reduce_scatter(outputs[i], inputs[i], size_, "reduce_scatter_tensor_coalesced");
    const Plan p = plan(inputs[i], inputs[i].nbytes(), opts.reduceOp);
    stats_.record(inputs[i].nbytes(), p.compress ? inputs[i].numel() * 2 : inputs[i].nbytes(), p.compress);
    if (!p.compress) {
      plain_in.push_back(inputs[i]);
      plain_out.push_back(outputs[i]);
      continue;
    }
    wire_plan = p;
    wide_in.push_back(inputs[i]);
    restores.push_back({at::Tensor(), outputs[i], p});
  }
  if (restores.empty()) return inner_->reduce_scatter_tensor_coalesced(outputs, inputs, opts);
  c10::cuda::CUDAGuard guard(inputs[0].device());
  for (size_t i = 0; i < restores.size(); ++i) {
    wire_in.push_back(cast(wide_in[i], restores[i].plan));
    restores[i].wire = at::empty({restores[i].wide.numel()}, wire_in.back().options());
    wire_out.push_back(restores[i].wire);
  }
  std::vector<c10::intrusive_ptr<c10d::Work>> works{
      inner_->reduce_scatter_tensor_coalesced(wire_out, wire_in, with_inner_op(opts, *wire_plan))};
  if (!plain_in.empty()) works.push_back(inner_->reduce_scatter_tensor_coalesced(plain_out, plain_in, opts));
  return finish(c10d::OpType::COALESCED, std::move(works), std::move(restores), outputs);
}

}  // namespace cnccl::cuda

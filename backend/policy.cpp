#include "backend/policy.h"

#include <torch/version.h>

namespace cnccl {
namespace {

#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 13)
using PreMulSupplement = c10d::PreMulSumSupplement;
#else
using PreMulSupplement = c10d::NCCLPreMulSumSupplement;
#endif

bool is_supported_dtype(at::ScalarType t) {
  switch (t) {
    case at::kBool: case at::kByte: case at::kChar: case at::kShort: case at::kInt: case at::kLong:
    case at::kHalf: case at::kBFloat16: case at::kFloat: case at::kDouble:
    case at::kComplexFloat: case at::kComplexDouble:
      return true;
    default:
      return false;
  }
}

}  // namespace

const char* op_name(RedOp op) {
  switch (op) {
    case RedOp::SUM: return "SUM";
    case RedOp::AVG: return "AVG";
    case RedOp::PRODUCT: return "PRODUCT";
    case RedOp::MIN: return "MIN";
    case RedOp::MAX: return "MAX";
    case RedOp::BAND: return "BAND";
    case RedOp::BOR: return "BOR";
    case RedOp::BXOR: return "BXOR";
    case RedOp::PREMUL_SUM: return "PREMUL_SUM";
    default: return "UNUSED";
  }
}

void check_reduction(at::ScalarType dtype, RedOp op) {
  TORCH_CHECK_TYPE(is_supported_dtype(dtype), "cnccl: reductions do not support dtype ", dtype);
  const bool floating = at::isFloatingType(dtype), complex = at::isComplexType(dtype), boolean = dtype == at::kBool;
  switch (op) {
    case RedOp::SUM: case RedOp::PRODUCT:
      return;
    case RedOp::AVG:
      TORCH_CHECK_TYPE(!boolean, "cnccl: AVG is not defined for bool tensors");
      return;
    case RedOp::PREMUL_SUM:
      TORCH_CHECK_TYPE(floating || complex, "cnccl: PREMUL_SUM needs a floating-point tensor, got ", dtype);
      return;
    case RedOp::MIN: case RedOp::MAX:
      TORCH_CHECK_TYPE(!complex, "cnccl: ", op_name(op), " is not defined for complex tensors");
      return;
    case RedOp::BAND: case RedOp::BOR: case RedOp::BXOR:
      TORCH_CHECK_TYPE(!floating && !complex, "cnccl: ", op_name(op), " needs an integer or bool tensor, got ", dtype);
      return;
    default:
      TORCH_CHECK_VALUE(false, "cnccl: unsupported reduce op ", int(op));
  }
}

Plan plan_reduction(const Config& config, at::ScalarType dtype, int64_t nbytes, RedOp op, double factor,
                    int world_size) {
  check_reduction(dtype, op);
  Plan plan;
  const bool wide_float = dtype == at::kFloat || (dtype == at::kDouble && config.compress_fp64);
  const bool sum_like = op == RedOp::SUM || op == RedOp::AVG || op == RedOp::PREMUL_SUM;
  // An 8-bit or block wire is a sum's frames only: MIN and MAX go on as they are.
  const bool frames_only = config.wire && (*config.wire == compress::Wire::kE4m3 ||
                                           *config.wire == compress::Wire::kE5m2 || compress::is_blocks(*config.wire));
  const bool compressible_op = sum_like || (!frames_only && (op == RedOp::MIN || op == RedOp::MAX));
  plan.compress = config.wire.has_value() && wide_float && compressible_op && nbytes >= config.min_bytes;
  if (plan.compress) plan.wire = *config.wire;

  plan.inner_op = sum_like ? RedOp::SUM : op;
  if (op == RedOp::PREMUL_SUM) {
    plan.pre_scale = factor;
  } else if (op == RedOp::AVG) {
    // Floats pre-divide (what NCCL and the fp16 hook do); integers sum, then divide truncating.
    if (at::isFloatingType(dtype) || at::isComplexType(dtype)) {
      plan.pre_scale = 1.0 / world_size;
    } else {
      plan.post_divisor = world_size;
    }
  } else if (op == RedOp::SUM && plan.compress && config.sum_scaling == SumScaling::kWorld) {
    plan.pre_scale = 1.0 / world_size;
    plan.post_scale = world_size;
  }
  plan.fp32_sum = plan.compress && sum_like && config.accumulate == Accumulate::kFp32;
  plan.stochastic = plan.fp32_sum && config.rounding == Rounding::kStochastic;
  plan.sr_seed = config.sr_seed;
  plan.framed = plan.fp32_sum && (config.scaling == Scaling::kPow2 || compress::is_blocks(plan.wire));
  plan.mx_scale = config.mx_scale;
  plan.rotated = plan.compress && sum_like && config.rotation == Rotation::kHadamard;
  if (plan.rotated) plan.rotation_signs = compress::rotation_signs(config.sr_seed);
  if (config.per_level() && wide_float && sum_like && nbytes >= config.min_bytes) {
    plan.per_level = plan.compress = plan.fp32_sum = plan.framed = true;
    plan.stochastic = config.rounding == Rounding::kStochastic;
    plan.inside = config.wire;
    plan.across = config.wire_across();
    if (plan.across) plan.wire = *plan.across;
    if (op == RedOp::SUM && config.sum_scaling == SumScaling::kWorld) {
      plan.pre_scale = 1.0 / world_size;
      plan.post_scale = world_size;
    }
  }
  return plan;
}

Plan plan_exact_reduction(const Config& config, at::ScalarType dtype, int64_t nbytes, RedOp op, double factor,
                          int world_size) {
  Config exact = config;
  exact.wire.reset();
  exact.inter_host_wire.reset();
  return plan_reduction(exact, dtype, nbytes, op, factor, world_size);
}

Traffic traffic(const Plan& plan, int64_t numel, int64_t nbytes) {
  if (!plan.compress) return {nbytes, nbytes, false};
  // Per level: what crosses hosts, where compression pays.
  if (plan.per_level && !plan.across) return {nbytes, numel * int64_t(sizeof(float)), true};
  if (compress::is_mx(plan.wire)) return {nbytes, int64_t(compress::mx_bytes(size_t(numel), plan.wire)), true};
  if (plan.wire == compress::Wire::kNvfp4) return {nbytes, int64_t(compress::nv_bytes(size_t(numel))), true};
  return {nbytes, numel * int64_t(compress::wire_bytes(plan.wire)), true};
}

AllreduceAlgorithm choose_allreduce(int64_t wire_bytes, SharedMemory shared_memory, bool fp32_sum, Framing framing) {
  if (framing != Framing::kNone) {
    return shared_memory == SharedMemory::kOneHost ? AllreduceAlgorithm::kShm : AllreduceAlgorithm::kAlltoall;
  }
  if (shared_memory == SharedMemory::kOneHost) return AllreduceAlgorithm::kShm;
  if (fp32_sum) return AllreduceAlgorithm::kAlltoall;
  if (shared_memory == SharedMemory::kPerHost) return AllreduceAlgorithm::kHierarchical;
  return wire_bytes > kDirectAllreduceMaxBytes ? AllreduceAlgorithm::kChunked : AllreduceAlgorithm::kDirect;
}

AllreduceAlgorithm choose_reduce_scatter(SharedMemory shared_memory, bool fp32_sum, Framing framing) {
  if (framing != Framing::kNone) {
    return shared_memory == SharedMemory::kOneHost ? AllreduceAlgorithm::kShm : AllreduceAlgorithm::kAlltoall;
  }
  if (shared_memory == SharedMemory::kOneHost) return AllreduceAlgorithm::kShm;
  return fp32_sum ? AllreduceAlgorithm::kAlltoall : AllreduceAlgorithm::kRing;
}

void check_nccl_supports(const Config& config, int nccl_version) {
  TORCH_CHECK_VALUE(config.wire != compress::Wire::kBf16 || nccl_version >= kNcclBf16Version,
                    "cnccl: the bf16 wire needs NCCL >= 2.10, but this process loaded NCCL ", nccl_version,
                    "; use CNCCL_WIRE_DTYPE=fp16 (Options.wire_dtype)");
}

namespace {

const PreMulSupplement& premul_supplement(const c10d::ReduceOp& op) {
  const auto* supplement = dynamic_cast<const PreMulSupplement*>(op.supplement_.get());
  TORCH_CHECK_VALUE(supplement, "cnccl: PREMUL_SUM without a factor");
  return *supplement;
}

}  // namespace

at::Tensor premul_tensor_factor(const c10d::ReduceOp& op) {
  if (op.op_ != RedOp::PREMUL_SUM) return {};
  return premul_supplement(op).tensor_factor;
}

double premul_factor(const c10d::ReduceOp& op) {
  if (op.op_ != RedOp::PREMUL_SUM) return 1.0;
  const PreMulSupplement* supplement = &premul_supplement(op);
  if (supplement->tensor_factor.defined()) {
    TORCH_CHECK_VALUE(supplement->tensor_factor.numel() == 1, "cnccl: PREMUL_SUM factor must have one element");
    return supplement->tensor_factor.item<double>();
  }
  return supplement->double_factor;
}

}  // namespace cnccl

#include "backend/host/staging.h"

#include "backend/frames.h"
#include "backend/wide_data.h"

namespace cnccl::host {
namespace {

Reducer aten_reducer(at::ScalarType dtype, RedOp op) {
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

// dst = inputs[0] + inputs[1] + ... in rank order, as the ATen reducer folds them (the same IEEE
// adds, so the same bits) without its dispatch, which dominates a small collective.
template <typename T>
void sum_in_rank_order(const char* const* inputs, int size, char* dst, size_t count) {
  auto* out = reinterpret_cast<T*>(dst);
  const auto* first = reinterpret_cast<const T*>(inputs[0]);
  const auto* second = reinterpret_cast<const T*>(inputs[1]);
  for (size_t i = 0; i < count; ++i) out[i] = first[i] + second[i];
  for (int q = 2; q < size; ++q) {
    const auto* in = reinterpret_cast<const T*>(inputs[q]);
    for (size_t i = 0; i < count; ++i) out[i] += in[i];
  }
}

}  // namespace

at::Tensor view(char* data, int64_t numel, at::ScalarType dtype) {
  return at::from_blob(data, {numel}, at::TensorOptions().dtype(dtype));
}

void pack(const at::Tensor& src, char* dst) {
  if (src.numel() == 0) return;
  view(dst, src.numel(), src.scalar_type()).copy_(src.reshape({-1}));
}

void unpack(const char* src, const at::Tensor& dst) {
  if (dst.numel() == 0) return;
  dst.copy_(view(const_cast<char*>(src), dst.numel(), dst.scalar_type()).view(dst.sizes()));
}

void cast_into(const at::Tensor& src, uint16_t* dst, const Plan& plan, const compress::Dither& dither,
               uint64_t first) {
  with_wide_data(src, [&](auto* x) {
    if (plan.stochastic) return compress::cast(x, dst, src.numel(), float(plan.pre_scale), plan.wire, dither, first);
    compress::cast(x, dst, src.numel(), float(plan.pre_scale), plan.wire);
  });
}

void restore_into(const uint16_t* src, const at::Tensor& dst, const Plan& plan) {
  at::Tensor out = dst.is_contiguous() ? dst : at::empty_like(dst, at::MemoryFormat::Contiguous);
  with_wide_data(out, [&](auto* y) { compress::restore(src, y, out.numel(), float(plan.post_scale), plan.wire); });
  if (!out.is_same(dst)) dst.copy_(out);
}

void pre_scale(char* data, int64_t numel, at::ScalarType dtype, const Plan& plan) {
  if (plan.pre_scale != 1.0) view(data, numel, dtype).mul_(plan.pre_scale);
}

void post_scale(char* data, int64_t numel, at::ScalarType dtype, const Plan& plan) {
  if (plan.post_divisor != 1) view(data, numel, dtype).div_(plan.post_divisor, "trunc");
}

Reducer reducer(const Plan& plan, at::ScalarType dtype) {
  if (!plan.compress) return aten_reducer(dtype, plan.inner_op);
  if (plan.inner_op != RedOp::SUM) return aten_reducer(frames::wire_dtype(plan.wire), plan.inner_op);
  return [wire = plan.wire](void* acc, const void* in, size_t n) {
    compress::add(static_cast<uint16_t*>(acc), static_cast<const uint16_t*>(in), n, wire);
  };
}

ChunkProduce chunk_producer(std::function<const char*(size_t index)> source, const Plan& plan, at::ScalarType dtype,
                        const compress::Dither& dither) {
  if (!plan.compress) {
    const size_t elem = at::elementSize(dtype);
    return [source, plan, dtype, elem](size_t offset, size_t count, char* dst) {
      copy_bytes(dst, source(offset), count * elem);
      pre_scale(dst, int64_t(count), dtype, plan);
    };
  }
  return [source, plan, dtype, dither](size_t offset, size_t count, char* dst) {
    with_wide_data(source(offset), dtype, [&](const auto* x) {
      auto* wire = reinterpret_cast<uint16_t*>(dst);
      if (plan.stochastic) return compress::cast(x, wire, count, float(plan.pre_scale), plan.wire, dither, offset);
      compress::cast(x, wire, count, float(plan.pre_scale), plan.wire);
    });
  };
}

ChunkConsume chunk_consumer(char* dst, const Plan& plan, at::ScalarType dtype) {
  const size_t elem = at::elementSize(dtype);
  if (!plan.compress) {
    return [dst, plan, dtype, elem](size_t offset, size_t count, const char* result) {
      copy_bytes(dst + offset * elem, result, count * elem);
      post_scale(dst + offset * elem, int64_t(count), dtype, plan);
    };
  }
  check_wide(dtype);
  return [dst, plan, dtype, elem](size_t offset, size_t count, const char* result) {
    const auto* wire = reinterpret_cast<const uint16_t*>(result);
    char* y = dst + offset * elem;
    if (dtype == at::kFloat) {
      return compress::restore(wire, reinterpret_cast<float*>(y), count, float(plan.post_scale), plan.wire);
    }
    compress::restore(wire, reinterpret_cast<double*>(y), count, float(plan.post_scale), plan.wire);
  };
}

RankSum rank_sum(const Plan& plan, at::ScalarType dtype, int size, const compress::Dither& dither) {
  if (plan.compress && plan.inner_op == RedOp::SUM) {
    return [plan, size, dither](const char* const* inputs, char* dst, size_t first, size_t count) {
      const auto* in = reinterpret_cast<const uint16_t* const*>(inputs);
      auto* out = reinterpret_cast<uint16_t*>(dst);
      if (plan.stochastic) return compress::sum(in, size_t(size), out, count, plan.wire, dither, first);
      compress::sum(in, size_t(size), out, count, plan.wire);
    };
  }
  if (!plan.compress && plan.inner_op == RedOp::SUM && size >= 2 && (dtype == at::kFloat || dtype == at::kDouble)) {
    return [double_sum = dtype == at::kDouble, size](const char* const* inputs, char* dst, size_t, size_t count) {
      if (double_sum) return sum_in_rank_order<double>(inputs, size, dst, count);
      sum_in_rank_order<float>(inputs, size, dst, count);
    };
  }
  const size_t elem = plan.compress ? 2 : at::elementSize(dtype);
  return [reduce = reducer(plan, dtype), elem, size](const char* const* inputs, char* dst, size_t, size_t count) {
    copy_bytes(dst, inputs[0], count * elem);
    for (int q = 1; q < size; ++q) reduce(dst, inputs[q], count);
  };
}

RankSum fp32_rank_sum(const Plan& plan, int size) {
  return [wire = plan.wire, size](const char* const* inputs, char* dst, size_t, size_t count) {
    compress::sum(reinterpret_cast<const uint16_t* const*>(inputs), size_t(size), reinterpret_cast<float*>(dst),
                  count, wire);
  };
}

void restore_sums_into(const float* sums, const at::Tensor& dst, const Plan& plan) {
  if (dst.numel() == 0) return;
  write_scaled_sums(view(reinterpret_cast<char*>(const_cast<float*>(sums)), dst.numel(), at::kFloat), dst,
                    plan.post_scale);
}

bool FusedCast::applies(const Plan& plan, at::ScalarType dtype) {
  return plan.compress && plan.inner_op == RedOp::SUM && dtype == at::kFloat;
}

Producer FusedCast::producer() const {
  return [c = *this](size_t offset, size_t count) {
    compress::cast(c.source(offset), c.wire + offset, count, c.scale, c.wire_dtype);
  };
}

Reducer FusedCast::reducer() const {
  return [c = *this](void* acc, const void* in, size_t n) {
    auto* out = static_cast<uint16_t*>(acc);
    compress::cast_add(c.source(size_t(out - c.wire)), static_cast<const uint16_t*>(in), out, n, c.scale,
                       c.wire_dtype);
  };
}

}  // namespace cnccl::host

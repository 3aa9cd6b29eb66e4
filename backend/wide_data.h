// The codec's kernels (compress/) widen to and narrow from fp32 or fp64: this is the one place
// that picks the pointer type from a tensor's dtype, for every device, and that widens fp32 sums.
#pragma once

#include <ATen/ATen.h>

namespace cnccl {

inline void check_wide(at::ScalarType dtype) {
  TORCH_CHECK(dtype == at::kFloat || dtype == at::kDouble, "cnccl: the codec takes fp32 or fp64 tensors, got ", dtype);
}

// Calls f(float*) or f(double*) with `t`'s data.
template <typename F>
void with_wide_data(const at::Tensor& t, F&& f) {
  check_wide(t.scalar_type());
  if (t.scalar_type() == at::kFloat) {
    f(t.mutable_data_ptr<float>());
  } else {
    f(t.mutable_data_ptr<double>());
  }
}

// Calls f(const float*) or f(const double*) with `data` read as `dtype`.
template <typename F>
void with_wide_data(const char* data, at::ScalarType dtype, F&& f) {
  check_wide(dtype);
  if (dtype == at::kFloat) {
    f(reinterpret_cast<const float*>(data));
  } else {
    f(reinterpret_cast<const double*>(data));
  }
}

// dst = fp32 `sums` (same element count) times `post_scale`, as the codec's restore treats a widened
// 16-bit value: multiplied in fp32 for an fp32 `dst`, widened and then multiplied in fp64 for fp64.
// The unrounded result of a reduce_scatter with fp32 sums (docs/design.md, "Numerics").
// In place: no temporary the size of dst (the composed path's memory, docs/design.md, "Numerics").
inline void write_scaled_sums(const at::Tensor& sums, const at::Tensor& dst, double post_scale) {
  const double scale = double(float(post_scale));
  if (!sums.is_same(dst)) dst.copy_(sums.view(dst.sizes()));
  if (scale != 1.0) dst.mul_(scale);
}

}  // namespace cnccl

// The codec's kernels (compress/) widen to and narrow from fp32 or fp64: this is the one place
// that picks the pointer type from a tensor's dtype, for every device.
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

}  // namespace cnccl

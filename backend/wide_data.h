// The codec's kernels (compress/) widen to and narrow from fp32 or fp64: this is the one place
// that picks the pointer type from a tensor's dtype, for every device.
#pragma once

#include <ATen/ATen.h>

namespace cnccl {

// Calls f(float*) or f(double*) with `t`'s data.
template <typename F>
void with_wide_data(const at::Tensor& t, F&& f) {
  TORCH_CHECK(t.scalar_type() == at::kFloat || t.scalar_type() == at::kDouble,
              "cnccl: the codec takes fp32 or fp64 tensors, got ", t.scalar_type());
  if (t.scalar_type() == at::kFloat) {
    f(t.mutable_data_ptr<float>());
  } else {
    f(t.mutable_data_ptr<double>());
  }
}

}  // namespace cnccl

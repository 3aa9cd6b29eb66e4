// Argument checks shared by every collective: each failure names the problem and the op.
#pragma once

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <vector>

namespace cnccl::checks {

// A strided, materialized tensor that the host path can handle (any strides; a copy is made).
inline void host_tensor(const at::Tensor& t, const char* op) {
  TORCH_CHECK_VALUE(t.defined(), "cnccl ", op, ": undefined tensor");
  TORCH_CHECK_VALUE(t.layout() == at::kStrided, "cnccl ", op, ": ", t.layout(),
                    " tensors are not supported; pass a dense (strided) tensor");
  TORCH_CHECK_VALUE(!t.is_meta(), "cnccl ", op, ": meta tensors have no data to communicate");
  TORCH_CHECK_VALUE(t.is_cpu(), "cnccl ", op, ": expected CPU tensors like the first one of this call, got one on ",
                    t.device(), " (one collective takes tensors of one device type)");
}

inline const at::Tensor& single(const std::vector<at::Tensor>& ts, const char* op) {
  TORCH_CHECK_VALUE(ts.size() == 1, "cnccl ", op, ": expects exactly one tensor, got ", ts.size());
  host_tensor(ts[0], op);
  return ts[0];
}

inline void same_kind(const at::Tensor& a, const at::Tensor& b, const char* op, const char* what) {
  TORCH_CHECK_TYPE(a.scalar_type() == b.scalar_type(), "cnccl ", op, ": ", what, " dtype ", b.scalar_type(),
                   " does not match ", a.scalar_type());
  TORCH_CHECK_VALUE(a.numel() == b.numel(), "cnccl ", op, ": ", what, " has ", b.numel(), " elements, expected ",
                    a.numel());
}

// A list of `n` tensors each matching `like` in dtype and element count.
inline void list_like(const std::vector<at::Tensor>& ts, size_t n, const at::Tensor& like, const char* op,
                      const char* what) {
  TORCH_CHECK_VALUE(ts.size() == n, "cnccl ", op, ": ", what, " list has ", ts.size(),
                    " tensors, expected one per rank (", n, ")");
  for (const auto& t : ts) {
    host_tensor(t, op);
    same_kind(like, t, op, what);
  }
}

// gather's outputs / scatter's inputs: one list of `n` tensors like `like` on the root, none elsewhere.
inline std::vector<at::Tensor> root_list(const std::vector<std::vector<at::Tensor>>& lists, bool is_root, size_t n,
                                         const at::Tensor& like, const char* op, const char* what) {
  if (!is_root) {
    TORCH_CHECK_VALUE(lists.empty() || lists[0].empty(), "cnccl ", op, ": only the root rank takes ", what, "s");
    return {};
  }
  TORCH_CHECK_VALUE(lists.size() == 1, "cnccl ", op, ": the root expects one ", what, " list, got ", lists.size());
  list_like(lists[0], n, like, op, what);
  return lists[0];
}

// A dense tensor on `like`'s device (the composed path's engines check the rest).
inline void on_device_of(const at::Tensor& t, const at::Tensor& like, const char* op) {
  TORCH_CHECK_VALUE(t.defined(), "cnccl ", op, ": undefined tensor");
  TORCH_CHECK_VALUE(t.layout() == at::kStrided, "cnccl ", op, ": ", t.layout(), " tensors are not supported");
  TORCH_CHECK_VALUE(t.device() == like.device(), "cnccl ", op, ": all tensors must be on ", like.device(),
                    ", got one on ", t.device());
}

// reduce_scatter_tensor's input: world size x the output, same dtype, same device.
inline void reduce_scatter_sizes(const at::Tensor& output, const at::Tensor& input, int size, const char* op) {
  on_device_of(output, input, op);
  TORCH_CHECK_TYPE(input.scalar_type() == output.scalar_type(), "cnccl ", op, ": input dtype ",
                   input.scalar_type(), " does not match output dtype ", output.scalar_type());
  TORCH_CHECK_VALUE(input.numel() == output.numel() * size, "cnccl ", op, ": input has ", input.numel(),
                    " elements, expected world size (", size, ") x output (", output.numel(), ")");
}

inline void root(int64_t root, int size, const char* op) {
  TORCH_CHECK_VALUE(root >= 0 && root < size, "cnccl ", op, ": root rank ", root, " is outside the group of ",
                    size);
}

}  // namespace cnccl::checks

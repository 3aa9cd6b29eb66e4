// The CUDA path as the rest of the backend sees it: an interface with no CUDA or NCCL types, so
// a build without CUDA compiles and links the same dispatching code (it never creates one).
#pragma once

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "backend/options.h"
#include "backend/stats.h"

namespace cnccl::cuda {

// What the outer group passes down when the CUDA path is first needed.
struct CudaPathArgs {
  c10::intrusive_ptr<c10d::Store> store;  // the group's store; the inner group uses a sub-prefix of it
  int rank = 0;
  int size = 1;
  const cnccl::Options* options = nullptr;
  const Config* config = nullptr;
  Stats* stats = nullptr;
  std::string group_uid;
  std::string group_desc;
  std::optional<at::Device> bound_device;
};

class CudaPath {
 public:
  virtual ~CudaPath() = default;

  // The inner ProcessGroupNCCL: every collective that is not compressed goes straight to it.
  virtual c10d::Backend& inner() = 0;

  virtual c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                                   const c10d::AllreduceOptions& opts) = 0;
  virtual c10::intrusive_ptr<c10d::Work> allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                             const c10d::AllreduceCoalescedOptions& opts) = 0;
  virtual c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                        std::vector<std::vector<at::Tensor>>& inputs,
                                                        const c10d::ReduceScatterOptions& opts) = 0;
  virtual c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor(at::Tensor& output, at::Tensor& input,
                                                               const c10d::ReduceScatterOptions& opts) = 0;
  virtual c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                         std::vector<at::Tensor>& inputs,
                                                                         const c10d::ReduceScatterOptions& opts) = 0;
};

// Defined by nccl_path.cpp, which only CUDA builds compile.
std::shared_ptr<CudaPath> make_nccl_path(const CudaPathArgs& args);
// The NCCL version this process loaded, as ncclGetVersion reports it (23007 for 2.30.7).
int loaded_nccl_version();

}  // namespace cnccl::cuda

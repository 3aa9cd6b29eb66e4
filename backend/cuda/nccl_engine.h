// The composed path's CUDA pieces: torch's ProcessGroupNCCL as the engine and the CUDA device
// (streams, events, the CUDA codec). No CUDA or NCCL types here, so a build without CUDA compiles
// the code that dispatches to them (it never calls them).
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <memory>
#include <optional>
#include <string>

#include "backend/composed/composition.h"

namespace cnccl::cuda {

struct NcclEngineArgs {
  c10::intrusive_ptr<c10d::Store> store;  // the group's store; the engine uses a sub-prefix of it
  int rank = 0;
  int size = 1;
  const cnccl::Options* options = nullptr;
  const Config* config = nullptr;
  std::string group_uid;
  std::string group_desc;
  std::optional<at::Device> bound_device;
};

// The legacy c10d::ProcessGroupNCCL (what torch 2.15 calls "nccl-legacy"; torch 2.11's "nccl").
composed::Engine make_nccl_engine(const NcclEngineArgs& args);
// `count_casts`: its kernels count what their casts meet (Device::cast_counts; telemetry not off).
// `host_waits`: its engine's works record their end events only once done (gloo's CUDA works), so
// waiting for one blocks the host first (Work::wait) and then orders the current stream after it.
std::shared_ptr<composed::Device> make_cuda_device(bool count_casts = false, bool host_waits = false);
// The NCCL version this process loaded, as ncclGetVersion reports it (23007 for 2.30.7).
int loaded_nccl_version();

}  // namespace cnccl::cuda

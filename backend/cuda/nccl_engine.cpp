#include "backend/cuda/nccl_engine.h"

#include <ATen/cuda/CUDAContext.h>
#include <nccl.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>

#include "backend/policy.h"

namespace cnccl::cuda {
namespace {

// The engine's keys live under this sub-prefix of the group's store.
constexpr const char* kStorePrefix = "cnccl/nccl";

}  // namespace

int loaded_nccl_version() {
  static const int version = [] {
    int v = 0;
    const ncclResult_t rc = ncclGetVersion(&v);
    TORCH_CHECK(rc == ncclSuccess, "cnccl: ncclGetVersion failed: ", ncclGetErrorString(rc));
    return v;
  }();
  return version;
}

composed::Engine make_nccl_engine(const NcclEngineArgs& args) {
  // torch's own message, raised before the constructor: ProcessGroupNCCL's constructor leaves
  // the heap corrupted when it throws this itself (seen with torch 2.15 on a machine without a GPU).
  TORCH_CHECK_VALUE(at::cuda::getNumGPUs() > 0, "ProcessGroupNCCL is only supported with GPUs, no GPUs found!");
  check_nccl_supports(*args.config, loaded_nccl_version());
  auto options = c10d::ProcessGroupNCCL::Options::create();
  options->timeout = args.options->timeout;
  options->group_name = args.options->group_name;
  options->global_ranks_in_group = args.options->global_ranks_in_group;
  auto store = c10::make_intrusive<c10d::PrefixStore>(kStorePrefix, args.store);
  auto nccl = c10::make_intrusive<c10d::ProcessGroupNCCL>(store, args.rank, args.size, options);
  if (!args.group_uid.empty()) nccl->setGroupUid(args.group_uid);
  nccl->setGroupDesc(args.group_desc);
  if (args.bound_device) nccl->setBoundDeviceId(args.bound_device);
  return {nccl, "nccl", /*reduces_avg_and_premul=*/true};
}

}  // namespace cnccl::cuda

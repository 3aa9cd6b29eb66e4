// Two (or more) processes allreduce a gradient-sized fp32 tensor through cnccl from plain C++.
// Usage: cpp_allreduce RANK WORLD_SIZE STORE_FILE
// Exits non-zero if the result is wrong.
#include <cnccl/cnccl.h>
#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <cstdlib>
#include <iostream>

int main(int argc, char** argv) {
  if (argc != 4) {
    std::cerr << "usage: " << argv[0] << " RANK WORLD_SIZE STORE_FILE\n";
    return 2;
  }
  const int rank = std::atoi(argv[1]), world = std::atoi(argv[2]);
  auto store = c10::make_intrusive<c10d::FileStore>(argv[3], world);

  auto options = c10::make_intrusive<cnccl::Options>();
  options->wire_dtype = "fp16";
  auto backend = c10::make_intrusive<cnccl::ProcessGroupCNCCL>(store, rank, world, options);
  auto pg = c10::make_intrusive<c10d::ProcessGroup>(store, rank, world);
  pg->setBackend(c10::DeviceType::CPU, c10d::ProcessGroup::BackendType::CUSTOM, backend);
  pg->setDefaultBackend(c10d::ProcessGroup::BackendType::CUSTOM);

  // 1M fp32 elements of value rank+1: above the size threshold, so they travel as fp16.
  std::vector<at::Tensor> tensors{at::full({1 << 20}, float(rank + 1))};
  pg->allreduce(tensors)->wait();
  const float expected = world * (world + 1) / 2.0f;
  const bool ok = tensors[0].eq(expected).all().item<bool>();
  const auto stats = backend->stats();
  std::cout << "rank " << rank << ": allreduce " << (ok ? "ok" : "WRONG") << " (" << tensors[0][0].item<float>()
            << ", expected " << expected << "), bytes sent " << stats.at("bytes_sent") << " of "
            << stats.at("bytes_uncompressed") << "\n";
  pg->barrier()->wait();
  return ok && stats.at("compressed_collectives") == 1 ? 0 : 1;
}

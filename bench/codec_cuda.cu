// The CUDA codec kernels' bandwidth beside a device-to-device copy that moves the same bytes, in
// one run (issue #4 goal: each kernel >= 0.85x the copy). Bytes count reads plus writes: a cast
// of n floats reads 4n and writes 2n, the same traffic as copying 3n bytes.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "compress/cuda/codec.h"

namespace {

void check(cudaError_t err, const char* what) {
  if (err != cudaSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(err));
    std::exit(1);
  }
}

template <typename F>
float median_ms(F&& run, cudaStream_t stream, int trials = 21, int reps = 10) {
  cudaEvent_t start, stop;
  check(cudaEventCreate(&start), "event");
  check(cudaEventCreate(&stop), "event");
  run();  // warm-up
  std::vector<float> ms;
  for (int t = 0; t < trials; ++t) {
    check(cudaEventRecord(start, stream), "record");
    for (int r = 0; r < reps; ++r) run();
    check(cudaEventRecord(stop, stream), "record");
    check(cudaEventSynchronize(stop), "sync");
    float m = 0;
    check(cudaEventElapsedTime(&m, start, stop), "elapsed");
    ms.push_back(m / reps);
  }
  std::sort(ms.begin(), ms.end());
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return ms[ms.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  using cnccl::compress::Wire;
  const size_t n = (argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 256) << 18;  // MiB of fp32
  float *wide, *copy_src, *copy_dst;
  uint16_t* narrow;
  check(cudaMalloc(&wide, n * 4), "malloc");
  check(cudaMalloc(&narrow, n * 2), "malloc");
  check(cudaMalloc(&copy_src, n * 3), "malloc");
  check(cudaMalloc(&copy_dst, n * 3), "malloc");
  check(cudaMemset(wide, 0x3c, n * 4), "memset");
  cudaStream_t stream;
  check(cudaStreamCreate(&stream), "stream");

  const double traffic = 6.0 * n;  // bytes read + written by one cast or restore
  std::printf("CUDA codec, %zu MiB of fp32 (median of 21 trials x 10), GB/s counting reads + writes\n", n >> 18);
  std::printf("%-16s %10s %10s %10s\n", "kernel", "GB/s", "copy GB/s", "vs copy");
  for (Wire wire : {Wire::kFp16, Wire::kBf16}) {
    for (int restore = 0; restore < 2; ++restore) {
      // Interleaved with the copy so both see the same clocks and neighbours.
      const float copy_ms = median_ms([&] { cudaMemcpyAsync(copy_dst, copy_src, n * 3, cudaMemcpyDeviceToDevice, stream); }, stream);
      const float ms = median_ms(
          [&] {
            if (restore) {
              cnccl::compress::cuda::restore(narrow, wide, n, 1.0f, wire, stream);
            } else {
              cnccl::compress::cuda::cast(wide, narrow, n, 0.5f, wire, stream);
            }
          },
          stream);
      char name[32];
      std::snprintf(name, sizeof(name), "%s %s", restore ? "restore" : "cast", cnccl::compress::wire_name(wire));
      std::printf("%-16s %10.0f %10.0f %9.2fx\n", name, traffic / ms / 1e6, traffic / copy_ms / 1e6, copy_ms / ms);
    }
  }
  return 0;
}

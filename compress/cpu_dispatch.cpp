// Runtime choice of the CPU kernels, and the public codec entry points.
#include <atomic>
#include <stdexcept>
#include <string>

#include "compress/cpu_kernels.h"

namespace cnccl::compress {
namespace {

bool processor_has_avx2_f16c() {
#if defined(__x86_64__)
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
#else
  return false;
#endif
}

const detail::CpuKernels& kernels_for(CpuPath path) {
  return path == CpuPath::kAvx2F16c ? *detail::avx2_f16c_kernels() : detail::scalar_kernels();
}

CpuPath best_path() {
  return cpu_path_supported(CpuPath::kAvx2F16c) ? CpuPath::kAvx2F16c : CpuPath::kScalar;
}

std::atomic<CpuPath>& active_path() {
  static std::atomic<CpuPath> path{best_path()};
  return path;
}

const detail::CpuKernels& active() { return kernels_for(active_path().load(std::memory_order_relaxed)); }

}  // namespace

const char* wire_name(Wire wire) {
  switch (wire) {
    case Wire::kFp16: return "fp16";
    case Wire::kBf16: return "bf16";
    case Wire::kE4m3: return "e4m3";
    case Wire::kE5m2: return "e5m2";
  }
  return "?";
}

const char* cpu_path_name(CpuPath path) { return path == CpuPath::kAvx2F16c ? "avx2+f16c" : "scalar"; }

bool cpu_path_supported(CpuPath path) {
  if (path == CpuPath::kScalar) return true;
  return detail::avx2_f16c_kernels() != nullptr && processor_has_avx2_f16c();
}

CpuPath cpu_path() { return active_path().load(std::memory_order_relaxed); }

void set_cpu_path(CpuPath path) {
  if (!cpu_path_supported(path)) {
    throw std::invalid_argument(std::string("cnccl codec: CPU path ") + cpu_path_name(path) +
                                " is not supported by this processor or build");
  }
  active_path().store(path, std::memory_order_relaxed);
}

void cast(const float* src, uint16_t* dst, size_t n, float scale, Wire wire) {
  active().cast_f32(src, dst, n, scale, wire);
}
void cast(const double* src, uint16_t* dst, size_t n, float scale, Wire wire) {
  active().cast_f64(src, dst, n, scale, wire);
}
void restore(const uint16_t* src, float* dst, size_t n, float scale, Wire wire) {
  active().restore_f32(src, dst, n, scale, wire);
}
void restore(const uint16_t* src, double* dst, size_t n, float scale, Wire wire) {
  active().restore_f64(src, dst, n, scale, wire);
}
void add(uint16_t* acc, const uint16_t* in, size_t n, Wire wire) { active().add(acc, in, n, wire); }
void cast_add(const float* src, const uint16_t* in, uint16_t* acc, size_t n, float scale, Wire wire) {
  active().cast_add_f32(src, in, acc, n, scale, wire);
}
void sum(const uint16_t* const* in, size_t k, uint16_t* dst, size_t n, Wire wire) {
  active().sum(in, k, dst, n, wire);
}
void sum(const uint16_t* const* in, size_t k, float* dst, size_t n, Wire wire) {
  active().sum_f32(in, k, dst, n, wire);
}
float amax(const float* src, size_t n) { return active().amax_f32(src, n); }
void cast(const float* src, uint8_t* dst, size_t n, float scale, Wire wire) {
  active().cast8_f32(src, dst, n, scale, wire);
}
void restore(const uint8_t* src, float* dst, size_t n, float scale, Wire wire) {
  active().restore8_f32(src, dst, n, scale, wire);
}

}  // namespace cnccl::compress

// Runtime choice of the CPU kernels, and the public codec entry points.
#include <atomic>
#include <cmath>
#include <stdexcept>
#include <string>

#include "compress/cpu/kernels.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace cnccl::compress {
namespace {

bool processor_has(CpuPath path) {
#if defined(__x86_64__)
  const bool avx2_f16c = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
  if (path == CpuPath::kAvx2F16c) return avx2_f16c;
  return avx2_f16c && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl");
#else
  (void)path;
  return false;
#endif
}

const detail::CpuKernels* compiled(CpuPath path) {
  switch (path) {
    case CpuPath::kAvx512: return detail::avx512_kernels();
    case CpuPath::kAvx2F16c: return detail::avx2_f16c_kernels();
    case CpuPath::kScalar: break;
  }
  return &detail::scalar_kernels();
}

const detail::CpuKernels& kernels_for(CpuPath path) { return *compiled(path); }

CpuPath best_path() {
  for (CpuPath path : {CpuPath::kAvx512, CpuPath::kAvx2F16c}) {
    if (cpu_path_supported(path)) return path;
  }
  return CpuPath::kScalar;
}

std::atomic<CpuPath>& active_path() {
  static std::atomic<CpuPath> path{best_path()};
  return path;
}

const detail::CpuKernels& active() { return kernels_for(active_path().load(std::memory_order_relaxed)); }

// Every stride-th value of a nearest-even 16-bit cast, its rounding computed again (cheaper than
// reading it back, and the same for cast_add, whose output is a sum).
template <typename T>
void sample_casts(const T* src, size_t n, float scale, Wire wire) {
  const detail::CensusSink& sink = detail::census_sink();
  if (!sink.census || !sink.stride) return;
  for (size_t i = 0; i < n; i += sink.stride) {
    const float v = static_cast<float>(src[i] * static_cast<T>(scale));
    detail::sample(v, detail::from_wire(detail::to_wire(v, wire), wire), *sink.census);
  }
}

template <typename T>
void count_values(const T* src, size_t n, float scale, Wire wire) {
  Census* census = detail::census_sink().census;
  if (!census) return;
  const float limit = detail::overflow_limit(wire);
  for (size_t i = 0; i < n; ++i) detail::tally(static_cast<float>(src[i] * static_cast<T>(scale)), limit, *census);
}

}  // namespace

#if defined(__x86_64__)
GradualUnderflow::GradualUnderflow() : saved_(_mm_getcsr()) { _mm_setcsr(saved_ & ~0x8040u); }
GradualUnderflow::~GradualUnderflow() { _mm_setcsr(saved_); }
#else
GradualUnderflow::GradualUnderflow() = default;
GradualUnderflow::~GradualUnderflow() = default;
#endif

namespace detail {

const CpuKernels& active_kernels() { return active(); }

CensusSink& census_sink() {
  thread_local CensusSink sink;
  return sink;
}

}  // namespace detail

CensusScope::CensusScope(Census* into, size_t sample_stride)
    : saved_census_(detail::census_sink().census), saved_stride_(detail::census_sink().stride) {
  detail::census_sink() = {into, into ? sample_stride : 0};
}

CensusScope::~CensusScope() { detail::census_sink() = {saved_census_, saved_stride_}; }

CensusSamplesPaused::CensusSamplesPaused() : saved_stride_(detail::census_sink().stride) {
  detail::census_sink().stride = 0;
}

CensusSamplesPaused::~CensusSamplesPaused() { detail::census_sink().stride = saved_stride_; }

void count_casts(const float* src, size_t n, float scale, Wire wire) { count_values(src, n, scale, wire); }
void count_casts(const double* src, size_t n, float scale, Wire wire) { count_values(src, n, scale, wire); }

const char* wire_name(Wire wire) {
  switch (wire) {
    case Wire::kFp16: return "fp16";
    case Wire::kBf16: return "bf16";
    case Wire::kE4m3: return "e4m3";
    case Wire::kE5m2: return "e5m2";
    case Wire::kMxfp8: return "mxfp8";
    case Wire::kMxfp8E5m2: return "mxfp8_e5m2";
    case Wire::kMxfp4: return "mxfp4";
    case Wire::kNvfp4: return "nvfp4";
  }
  return "?";
}

const char* cpu_path_name(CpuPath path) {
  switch (path) {
    case CpuPath::kAvx512: return "avx512";
    case CpuPath::kAvx2F16c: return "avx2+f16c";
    case CpuPath::kScalar: break;
  }
  return "scalar";
}

bool cpu_path_supported(CpuPath path) {
  if (path == CpuPath::kScalar) return true;
  // The processor first: a table's first use runs code compiled for its instruction set (the AVX-512
  // one copies the AVX2 table).
  return processor_has(path) && compiled(path) != nullptr;
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
  const GradualUnderflow exact;
  active().cast_f32(src, dst, n, scale, wire, detail::census_sink().census);
  sample_casts(src, n, scale, wire);
}
void cast(const double* src, uint16_t* dst, size_t n, float scale, Wire wire) {
  const GradualUnderflow exact;
  active().cast_f64(src, dst, n, scale, wire, detail::census_sink().census);
  sample_casts(src, n, scale, wire);
}
void restore(const uint16_t* src, float* dst, size_t n, float scale, Wire wire) {
  const GradualUnderflow exact;
  active().restore_f32(src, dst, n, scale, wire);
}
void restore(const uint16_t* src, double* dst, size_t n, float scale, Wire wire) {
  const GradualUnderflow exact;
  active().restore_f64(src, dst, n, scale, wire);
}
void add(uint16_t* acc, const uint16_t* in, size_t n, Wire wire) {
  const GradualUnderflow exact;
  active().add(acc, in, n, wire);
}
void cast_add(const float* src, const uint16_t* in, uint16_t* acc, size_t n, float scale, Wire wire) {
  const GradualUnderflow exact;
  active().cast_add_f32(src, in, acc, n, scale, wire, detail::census_sink().census);
  sample_casts(src, n, scale, wire);
}
void sum(const uint16_t* const* in, size_t k, uint16_t* dst, size_t n, Wire wire) {
  const GradualUnderflow exact;
  active().sum(in, k, dst, n, wire);
}
void sum(const uint16_t* const* in, size_t k, float* dst, size_t n, Wire wire) {
  const GradualUnderflow exact;
  active().sum_f32(in, k, dst, n, wire);
}
float amax(const float* src, size_t n) { return active().amax_f32(src, n); }
void cast(const float* src, uint8_t* dst, size_t n, float scale, Wire wire) {
  const GradualUnderflow exact;
  active().cast8_f32(src, dst, n, scale, wire);
  const detail::CensusSink& sink = detail::census_sink();
  if (!sink.census || !sink.stride) return;
  const float* value = detail::fp8_values(wire);
  for (size_t i = 0; i < n; i += sink.stride) detail::sample(src[i] * scale, value[dst[i]], *sink.census);
}
void restore(const uint8_t* src, float* dst, size_t n, float scale, Wire wire) {
  const GradualUnderflow exact;
  active().restore8_f32(src, dst, n, scale, wire);
}

}  // namespace cnccl::compress

// The stochastically rounded CPU codec (stochastic.h): scalar, for every processor. Element i of a
// call is element `first + i` of the tensor for its random bits.
#include <cmath>

#include "compress/cpu/kernels.h"
#include "compress/stochastic.h"

namespace cnccl::compress {

namespace {

// v: the fp32 value of element i, through fp32 first for fp64 sources, as the nearest-even cast.
template <typename T>
void cast_stochastically(const T* src, uint16_t* dst, size_t n, float scale, Wire wire, const Dither& dither,
                         uint64_t first) {
  const detail::CensusSink& sink = detail::census_sink();
  for (size_t i = 0; i < n; ++i) {
    const float v = static_cast<float>(src[i] * static_cast<T>(scale));
    dst[i] = detail::to_wire(stochastic_grid_value(v, random_bits(dither, first + i), wire), wire);
    if (!sink.census) continue;
    // Stochastic rounding may take any value past the largest to inf, or not: what counts is the result.
    const float w = detail::from_wire(dst[i], wire);
    if (!(std::fabs(v) <= 3.40282347e38f)) {
      ++sink.census->nonfinite;
    } else if (!(std::fabs(w) <= 3.40282347e38f)) {
      ++sink.census->saturated;
    }
    if (sink.stride && i % sink.stride == 0) detail::sample(v, w, *sink.census);
  }
}

}  // namespace

void cast(const float* src, uint16_t* dst, size_t n, float scale, Wire wire, const Dither& dither, uint64_t first) {
  const GradualUnderflow exact;
  cast_stochastically(src, dst, n, scale, wire, dither, first);
}

void cast(const double* src, uint16_t* dst, size_t n, float scale, Wire wire, const Dither& dither, uint64_t first) {
  const GradualUnderflow exact;
  cast_stochastically(src, dst, n, scale, wire, dither, first);
}

void sum(const uint16_t* const* in, size_t k, uint16_t* dst, size_t n, Wire wire, const Dither& dither,
         uint64_t first) {
  const GradualUnderflow exact;
  for (size_t i = 0; i < n; ++i) {
    float s = detail::from_wire(in[0][i], wire);
    for (size_t j = 1; j < k; ++j) s += detail::from_wire(in[j][i], wire);
    dst[i] = detail::to_wire(stochastic_grid_value(s, random_bits(dither, first + i), wire), wire);
  }
}

}  // namespace cnccl::compress

// The stochastically rounded CPU codec (stochastic.h): scalar, for every processor. Element i of a
// call is element `first + i` of the tensor for its random bits.
#include "compress/cpu_kernels.h"
#include "compress/stochastic.h"

namespace cnccl::compress {

void cast(const float* src, uint16_t* dst, size_t n, float scale, Wire wire, const Dither& dither, uint64_t first) {
  for (size_t i = 0; i < n; ++i) {
    dst[i] = detail::to_wire(stochastic_grid_value(src[i] * scale, random_bits(dither, first + i), wire), wire);
  }
}

void cast(const double* src, uint16_t* dst, size_t n, float scale, Wire wire, const Dither& dither, uint64_t first) {
  const double s = scale;
  for (size_t i = 0; i < n; ++i) {
    const float v = static_cast<float>(src[i] * s);  // through fp32 first, as the nearest-even cast
    dst[i] = detail::to_wire(stochastic_grid_value(v, random_bits(dither, first + i), wire), wire);
  }
}

void sum(const uint16_t* const* in, size_t k, uint16_t* dst, size_t n, Wire wire, const Dither& dither,
         uint64_t first) {
  for (size_t i = 0; i < n; ++i) {
    float s = detail::from_wire(in[0][i], wire);
    for (size_t j = 1; j < k; ++j) s += detail::from_wire(in[j][i], wire);
    dst[i] = detail::to_wire(stochastic_grid_value(s, random_bits(dither, first + i), wire), wire);
  }
}

}  // namespace cnccl::compress

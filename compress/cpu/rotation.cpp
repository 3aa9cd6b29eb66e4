// The block rotation on the CPU (codec.h, rotate): the scalar kernel, its butterflies in the order the
// definition gives, which defines it; fp32's whole blocks go to the dispatched kernel (vector forms in
// cpu/avx2.cpp and cpu/avx512.cpp, tested bit for bit against this one).
#include <algorithm>
#include <type_traits>

#include "compress/codec.h"
#include "compress/cpu/kernels.h"
#include "compress/stochastic.h"

namespace cnccl::compress {
namespace {

// x[0..16) = H · x, H the Sylvester Hadamard matrix: at each stride h = 1, 2, 4, 8, the pairs (j, j + h)
// become (a + b, a - b), each add rounded in T's precision.
template <typename T>
void butterflies(T* x) {
  for (size_t h = 1; h < kRotationBlock; h *= 2) {
    for (size_t i = 0; i < kRotationBlock; i += 2 * h) {
      for (size_t j = i; j < i + h; ++j) {
        const T a = x[j], b = x[j + h];
        x[j] = a + b;
        x[j + h] = a - b;
      }
    }
  }
}

// forward: dst = H · D · src / 4; else dst = D · H · src / 4, for `blocks` whole blocks. Negating and
// multiplying by 1/4 are exact.
template <typename T>
void rotate_whole(const T* src, T* dst, size_t blocks, uint16_t signs, bool forward) {
  T x[kRotationBlock];
  for (size_t b = 0; b < blocks * kRotationBlock; b += kRotationBlock) {
    for (size_t j = 0; j < kRotationBlock; ++j) x[j] = forward && (signs >> j & 1) ? -src[b + j] : src[b + j];
    butterflies(x);
    for (size_t j = 0; j < kRotationBlock; ++j) {
      const T y = x[j] * T(0.25);
      dst[b + j] = !forward && (signs >> j & 1) ? -y : y;
    }
  }
}

template <typename T>
void rotate_blocks(const T* src, T* dst, size_t n, uint16_t signs, bool forward) {
  const GradualUnderflow exact;
  const size_t blocks = n / kRotationBlock, whole = blocks * kRotationBlock;
  if constexpr (std::is_same_v<T, float>) {
    detail::active_kernels().rotate_f32(src, dst, blocks, signs, forward);
  } else {
    rotate_whole(src, dst, blocks, signs, forward);
  }
  if (dst != src) std::copy(src + whole, src + n, dst + whole);
}

}  // namespace

namespace detail {

void scalar_rotate_f32(const float* src, float* dst, size_t blocks, uint16_t signs, bool forward) {
  rotate_whole(src, dst, blocks, signs, forward);
}

}  // namespace detail

uint16_t rotation_signs(uint64_t seed) {
  // A counter no stochastic rounding's bits use (their phase is 0 or 1 below index 2^34, 2^36 on the block
  // wires).
  const Philox4 block = philox4x32_10(0xFFFFFFFFu, 0xFFFFFFFFu, 0xFFFFFFFFu, 0xFFFFFFFFu, static_cast<uint32_t>(seed),
                                      static_cast<uint32_t>(seed >> 32));
  return static_cast<uint16_t>(block.word[0]);
}

void rotate(const float* src, float* dst, size_t n, uint16_t signs) { rotate_blocks(src, dst, n, signs, true); }
void rotate(const double* src, double* dst, size_t n, uint16_t signs) { rotate_blocks(src, dst, n, signs, true); }
void unrotate(const float* src, float* dst, size_t n, uint16_t signs) { rotate_blocks(src, dst, n, signs, false); }
void unrotate(const double* src, double* dst, size_t n, uint16_t signs) { rotate_blocks(src, dst, n, signs, false); }

}  // namespace cnccl::compress

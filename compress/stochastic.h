// Stochastic rounding to the 16-bit wire (docs/design.md, "Numerics"), defined bit for bit so that
// the CPU kernels, the CUDA kernels and a test's emulation agree. Header-only: the host compiler and
// nvcc both compile it.
#pragma once

#include <cmath>
#include <cstdint>

#include "compress/codec.h"

namespace cnccl::compress {

// Whose random bits an element takes: Philox4x32-10 keyed by `seed` (low word first), at counter
// (index / 4 mod 2^32, seq, rank, phase + 2 * (index / 2^34)); a 16-bit wire's element `index` takes
// word index % 4 of that block (random_bits; a block wire's takes a byte: block_random_bits). The last
// word's high part keeps tensors past 2^34 elements from repeating bits.
// Nothing depends on how the elements are chunked or which device rounds them.
struct Dither {
  uint64_t seed = 0;
  uint32_t seq = 0;    // the collective's sequence number in its group's path
  uint32_t rank = 0;   // the sender of a contribution; kAnyOwner for a sum
  uint32_t phase = 0;  // kContribution or kResult
};
constexpr uint32_t kContribution = 0;
constexpr uint32_t kResult = 1;
// The rank word of a sum's rounding (kResult): the same whichever rank owns the element's part, so
// that the bits do not depend on how a path cuts the tensor into parts.
constexpr uint32_t kAnyOwner = 0xFFFFFFFFu;

// The roundings of one stochastic reduction, number `seq` of its group's path: `rank`'s contributions,
// and the owners' sums.
inline Dither contribution_dither(uint64_t seed, uint32_t seq, uint32_t rank) {
  return {seed, seq, rank, kContribution};
}
inline Dither sum_dither(uint64_t seed, uint32_t seq) { return {seed, seq, kAnyOwner, kResult}; }
// A wire per level's second-level contributions (each host's sums, sent across hosts by `rank`): a rank word
// of their own, so that they never take the bits of a first-level contribution (group ranks stay below 2^31).
constexpr uint32_t kSecondLevel = 0x80000000u;
inline Dither second_level_dither(uint64_t seed, uint32_t seq, uint32_t rank) {
  return {seed, seq, kSecondLevel | rank, kContribution};
}

struct Philox4 {
  uint32_t word[4];
};

CNCCL_HOST_DEVICE uint32_t mul_hi(uint32_t a, uint32_t b) {
  return static_cast<uint32_t>((static_cast<uint64_t>(a) * b) >> 32);
}

// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11).
CNCCL_HOST_DEVICE Philox4 philox4x32_10(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3, uint32_t k0,
                                        uint32_t k1) {
  for (int round = 0; round < 10; ++round) {
    const uint32_t hi0 = mul_hi(0xD2511F53u, c0), lo0 = 0xD2511F53u * c0;
    const uint32_t hi1 = mul_hi(0xCD9E8D57u, c2), lo1 = 0xCD9E8D57u * c2;
    c0 = hi1 ^ c1 ^ k0;
    c1 = lo1;
    c2 = hi0 ^ c3 ^ k1;
    c3 = lo0;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return {{c0, c1, c2, c3}};
}

CNCCL_HOST_DEVICE uint32_t random_bits(const Dither& d, uint64_t index) {
  const Philox4 block = philox4x32_10(static_cast<uint32_t>(index >> 2), d.seq, d.rank,
                                      d.phase + 2 * static_cast<uint32_t>(index >> 34),
                                      static_cast<uint32_t>(d.seed), static_cast<uint32_t>(d.seed >> 32));
  return block.word[index & 3];
}

// t >= 0, finite, moved onto the grid of a floating-point format with `mantissa_bits` bits past the
// leading one and `min_exponent` its smallest normal exponent: with s the spacing at t
// (2^(max(e, min_exponent) - mantissa_bits), e = floor(log2 t)), t = (m + f) * s with m an integer and
// 0 <= f < 1; the result is (m + 1) * s when u < f, else m * s, where u = (random >> 8) * 2^-24. Every
// step is exact in fp32, so E[result] = t up to u's resolution.
CNCCL_HOST_DEVICE float stochastic_on_grid(float t, uint32_t random, int min_exponent, int mantissa_bits) {
  if (t == 0.0f) return t;
  int e = 0;
  frexpf(t, &e);  // t = m * 2^e, m in [0.5, 1): floor(log2 t) = e - 1
  const int spacing = (e - 1 > min_exponent ? e - 1 : min_exponent) - mantissa_bits;
  const float q = ldexpf(t, -spacing);
  const float m = floorf(q);
  const float u = static_cast<float>(random >> 8) * 0x1p-24f;
  return ldexpf(m + (u < q - m ? 1.0f : 0.0f), spacing);
}

// v moved onto the 16-bit wire's grid by stochastic_on_grid (fp16: min_exponent -14, 10 bits; bf16:
// -126, 7), with v's sign. A result past the wire's largest value becomes inf when converted; NaN and
// inf pass through (and round as to_wire does).
CNCCL_HOST_DEVICE float stochastic_grid_value(float v, uint32_t random, Wire w) {
  const float t = fabsf(v);
  if (!(t < INFINITY)) return v;
  return copysignf(w == Wire::kFp16 ? stochastic_on_grid(t, random, -14, 10) : stochastic_on_grid(t, random, -126, 7),
                   v);
}

// The random bits of a block wire's element (the 4- and 8-bit block wires' stochastic rounding above): 8
// bits an element, as Blackwell's cvt.rs.satfinite.e2m1x4.f32 and .e4m3x4.f32 take them (32 random bits
// for four values), so that one Philox block serves sixteen elements, where the 16-bit wires' rounding
// takes a word each. Element `index` takes byte b = index % 16 of the Philox block at counter
// (index / 16 mod 2^32, seq, rank, phase + 2 * (index / 2^36)), its words' bytes in little-endian order,
// as u = (b + 1/2) * 2^-8: the middle of the byte's interval, so that the probability of rounding up
// differs from f by at most 2^-9 (E[result] within s / 512 of a, whatever a is).
CNCCL_HOST_DEVICE uint32_t rounding_bits_of_byte(uint32_t byte) { return byte << 24 | 0x800000u; }

// The Philox block that holds element `index`'s byte, and that byte's rounding bits.
CNCCL_HOST_DEVICE Philox4 block_philox(const Dither& d, uint64_t index) {
  return philox4x32_10(static_cast<uint32_t>(index >> 4), d.seq, d.rank,
                       d.phase + 2 * static_cast<uint32_t>(index >> 36), static_cast<uint32_t>(d.seed),
                       static_cast<uint32_t>(d.seed >> 32));
}
CNCCL_HOST_DEVICE uint32_t rounding_bits_in(const Philox4& block, uint64_t index) {
  return rounding_bits_of_byte(block.word[(index >> 2) & 3] >> (8 * (index & 3)) & 0xFF);
}

CNCCL_HOST_DEVICE uint32_t block_random_bits(const Dither& d, uint64_t index) {
  return rounding_bits_in(block_philox(d, index), index);
}

// A 4-bit element's magnitude a = min(|q|, 6) moved onto e2m1's grid (NVFP4 and MXFP4): with the grid's
// spacing s at a (0.5 below 2, 1 below 4, else 2), a = (m + f) * s with m an integer and 0 <= f < 1; the
// result is (m + 1) * s when u < f, else m * s, u = (random >> 8) * 2^-24 (random: block_random_bits).
// Every step is exact in fp32, so E[result] = a up to u's resolution; 6 stays 6.
CNCCL_HOST_DEVICE float stochastic_e2m1_value(float a, uint32_t random) {
  const float spacing = a < 2.0f ? 0.5f : a < 4.0f ? 1.0f : 2.0f;
  const float q = a * (1.0f / spacing);
  const float m = floorf(q);
  const float u = static_cast<float>(random >> 8) * 0x1p-24f;
  return (m + (u < q - m ? 1.0f : 0.0f)) * spacing;
}

// An MXFP8 element's magnitude a = min(|q|, L) moved onto its element type's grid by stochastic_on_grid
// (e4m3: min_exponent -6, 3 bits; e5m2: -14, 2 bits; random: block_random_bits). L is on the grid, so the
// result stays <= L.
CNCCL_HOST_DEVICE float stochastic_fp8_value(float a, uint32_t random, Wire element) {
  return element == Wire::kE4m3 ? stochastic_on_grid(a, random, -6, 3) : stochastic_on_grid(a, random, -14, 2);
}

// block_random_bits(dither, index) for indices in order: one Philox block serves the sixteen indices it
// holds.
class BlockRandomBits {
 public:
  CNCCL_HOST_DEVICE explicit BlockRandomBits(const Dither& dither) : dither_(dither) {}
  CNCCL_HOST_DEVICE uint32_t operator()(uint64_t index) {
    if (index >> 4 != block_index_) {
      block_index_ = index >> 4;
      block_ = block_philox(dither_, index);
    }
    return rounding_bits_in(block_, index);
  }

 private:
  const Dither& dither_;
  uint64_t block_index_ = UINT64_MAX;
  Philox4 block_{};
};

// Stochastically rounded CPU codec (cpu/stochastic.cpp): as cast() and sum() in codec.h, with the
// rounding above; `first` is the index (for Dither) of element 0 of these buffers.
void cast(const float* src, uint16_t* dst, size_t n, float scale, Wire wire, const Dither& dither, uint64_t first);
void cast(const double* src, uint16_t* dst, size_t n, float scale, Wire wire, const Dither& dither, uint64_t first);
void sum(const uint16_t* const* in, size_t k, uint16_t* dst, size_t n, Wire wire, const Dither& dither,
         uint64_t first);
// NVFP4 with stochastically rounded elements (cpu/nvfp4.cpp): as nv_encode() and nv_sum_encode() in
// codec.h, each element rounded by stochastic_e2m1_value with block_random_bits of element `first + i`;
// the block scales as before. The scalar kernel defines it; the AVX2 and AVX-512 ones give its bits.
void nv_encode(const float* src, size_t n, size_t count, float scale, float part, uint8_t* dst, const Dither& dither,
               uint64_t first);
void nv_encode(const double* src, size_t n, size_t count, float scale, float part, uint8_t* dst, const Dither& dither,
               uint64_t first);
float nv_sum_encode(const uint8_t* const* in, const float* parts, size_t k, size_t n, uint8_t* dst,
                    const Dither& dither, uint64_t first);
// MX blocks with stochastically rounded elements (cpu/mx.cpp): as mx_encode() and mx_sum_encode() in
// codec.h, each element's magnitude, saturated to L, rounded by stochastic_e2m1_value (MXFP4) or
// stochastic_fp8_value (MXFP8) with block_random_bits of element `first + i`; the block scales as before.
// The scalar kernels define it; the AVX2 and AVX-512 ones give its bits.
void mx_encode(const float* src, size_t n, size_t count, float scale, Wire wire, MxScale rule, uint8_t* dst,
               const Dither& dither, uint64_t first);
void mx_encode(const double* src, size_t n, size_t count, float scale, Wire wire, MxScale rule, uint8_t* dst,
               const Dither& dither, uint64_t first);
void mx_sum_encode(const uint8_t* const* in, size_t k, size_t n, Wire wire, MxScale rule, uint8_t* dst,
                   const Dither& dither, uint64_t first);

}  // namespace cnccl::compress

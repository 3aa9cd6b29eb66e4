// AVX-512 (F, BW, VL) kernels for the 8-bit wires' casts and the MX and NVFP4 blocks, where 16 lanes and
// mask registers halve the AVX2 kernels' operations an element (docs/benchmarks.md, "Every wire's
// kernels"). Every other entry of the table is the AVX2 + F16C kernel: those are bound by memory, not by
// their instructions. This
// file alone is compiled with -mavx512f -mavx512bw -mavx512vl; cpu/dispatch.cpp calls it only after
// checking the processor. Tails go to the AVX2 kernels, so any pointer and length is accepted.
#include "compress/cpu/kernels.h"

#if defined(__x86_64__)
#include <immintrin.h>

#include <optional>
#include <vector>

namespace cnccl::compress::detail {
namespace {

// Fp8Lanes (cpu/avx2.cpp) on 16 lanes, the same operations and the same choice between the normal and
// subnormal roundings; the sign is merged with one ternary-logic operation and e5m2's NaN with a mask.
class Fp8Lanes16 {
 public:
  explicit Fp8Lanes16(Wire w) : Fp8Lanes16(Fp8Rounding(w)) {}
  explicit Fp8Lanes16(const Fp8Rounding& r)
      : shift_(r.shift),
        nan_is_overflow_(r.nan_is_overflow),
        smallest_normal_code_(_mm512_set1_epi32(r.smallest_normal_code)),
        big_bits_(_mm512_set1_epi32(r.big_bits)),
        half_minus_one_(_mm512_set1_epi32(r.half_minus_one)),
        rebias_(_mm512_set1_epi32(r.rebias)),
        top_(_mm512_set1_epi32(r.top)) {}

  // The codes of 16 fp32 values, one in the low byte of each 32-bit lane.
  __m512i codes(__m512 v) const {
    const __m512i x = _mm512_castps_si512(v);
    const __m512i ax = _mm512_and_si512(x, _mm512_set1_epi32(0x7FFFFFFF));
    __m512i code = _mm512_max_epi32(_mm512_min_epi32(normal(ax), top_), subnormal(ax));
    if (!nan_is_overflow_) {
      code = _mm512_mask_mov_epi32(code, _mm512_cmpgt_epi32_mask(ax, _mm512_set1_epi32(0x7F800000)),
                                   _mm512_set1_epi32(0x7F));
    }
    return with_bit(code, x, 24, 0x80);
  }

  // codes() for finite values of at most the format's largest magnitude (an MX block's, scaled).
  __m512i codes_in_range(__m512 v) const {
    const __m512i x = _mm512_castps_si512(v);
    const __m512i ax = _mm512_and_si512(x, _mm512_set1_epi32(0x7FFFFFFF));
    return with_bit(_mm512_max_epi32(normal(ax), subnormal(ax)), x, 24, 0x80);
  }

  // code | ((x >> shift) & bit): x's sign moved to `bit`. 0xF8 is a | (b & c) as ternary logic.
  static __m512i with_bit(__m512i code, __m512i x, int shift, int bit) {
    return _mm512_ternarylogic_epi32(code, _mm512_srli_epi32(x, shift), _mm512_set1_epi32(bit), 0xF8);
  }

 private:
  __m512i subnormal(__m512i ax) const {
    const __m512i code = _mm512_sub_epi32(
        _mm512_castps_si512(_mm512_add_ps(_mm512_castsi512_ps(ax), _mm512_castsi512_ps(big_bits_))), big_bits_);
    return _mm512_min_epi32(code, smallest_normal_code_);
  }

  __m512i normal(__m512i ax) const {
    const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(ax, shift_), _mm512_set1_epi32(1));
    const __m512i rounded = _mm512_add_epi32(ax, _mm512_add_epi32(half_minus_one_, odd));
    return _mm512_sub_epi32(_mm512_srli_epi32(rounded, shift_), rebias_);
  }

  unsigned shift_;
  bool nan_is_overflow_;
  __m512i smallest_normal_code_, big_bits_, half_minus_one_, rebias_, top_;
};

// 64 codes, one in the low byte of each lane of c[0..4), as 64 bytes in order: the packs interleave
// the four vectors' 128-bit lanes, one permute puts them back.
inline __m512i bytes_of(const __m512i* c) {
  const __m512i b = _mm512_packus_epi16(_mm512_packus_epi32(c[0], c[1]), _mm512_packus_epi32(c[2], c[3]));
  return _mm512_permutexvar_epi32(_mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15), b);
}

// The input prefetched as the AVX2 kernels' (cpu/avx2.cpp, kPrefetchBytes).
constexpr size_t kPrefetchBytes = 2048;

void cast8_f32(const float* src, uint8_t* dst, size_t n, float scale, Wire w) {
  const Fp8Lanes16 fp8(w);
  const __m512 s = _mm512_set1_ps(scale);
  size_t i = 0;
  for (; i + 64 <= n; i += 64) {
    __m512i c[4];
    #pragma GCC unroll 4
    for (int k = 0; k < 4; ++k) {
      _mm_prefetch(reinterpret_cast<const char*>(src + i + 16 * k) + kPrefetchBytes, _MM_HINT_T0);
      c[k] = fp8.codes(_mm512_mul_ps(_mm512_loadu_ps(src + i + 16 * k), s));
    }
    _mm512_storeu_si512(dst + i, bytes_of(c));
  }
  if (i < n) avx2_f16c_kernels()->cast8_f32(src + i, dst + i, n - i, scale, w);
}

// The largest magnitude's bits of each of 16 blocks (the lanes of m[b], block b's lane-wise maxima),
// as lane b: the maxima of pairs, then of quads, of 128-bit lanes, of 256-bit halves, each step a
// transpose that halves the vectors.
inline __m512i lane_maxima(__m512i* m) {
  for (int b = 0; b < 16; b += 2) {
    m[b / 2] = _mm512_max_epu32(_mm512_unpacklo_epi32(m[b], m[b + 1]), _mm512_unpackhi_epi32(m[b], m[b + 1]));
  }
  // m[j] now holds blocks 2j, 2j+1 interleaved in 32-bit lane pairs of each 128-bit lane.
  for (int j = 0; j < 8; j += 2) {
    m[j / 2] = _mm512_max_epu32(_mm512_unpacklo_epi64(m[j], m[j + 1]), _mm512_unpackhi_epi64(m[j], m[j + 1]));
  }
  // m[q] lane 4l + t: block 4q + t's maximum over 128-bit lane l (partial).
  for (int q = 0; q < 4; q += 2) {
    const __m512i lo = _mm512_shuffle_i32x4(m[q], m[q + 1], 0x88);  // lanes 0, 2 of each
    const __m512i hi = _mm512_shuffle_i32x4(m[q], m[q + 1], 0xDD);  // lanes 1, 3 of each
    m[q / 2] = _mm512_max_epu32(lo, hi);
  }
  // m[h] 128-bit lane l: blocks 4(2h + l/2) .. +3 (partial over half of the lanes).
  const __m512i lo = _mm512_shuffle_i32x4(m[0], m[1], 0x88);
  const __m512i hi = _mm512_shuffle_i32x4(m[0], m[1], 0xDD);
  return _mm512_max_epu32(lo, hi);
}

// --- Stochastic rounding (stochastic.h) on 16 lanes.

// block_random_bits(dither, index + i) for i in [0, 256) (stochastic.h): Philox on 16 lanes, a block
// counter a lane, as cpu/avx2.cpp's BlockRandomBits128, in groups of 16 blocks (RandomByteGroups).
class BlockRandomBits256 {
 public:
  explicit BlockRandomBits256(const Dither& d)
      : seq_(_mm512_set1_epi32(int32_t(d.seq))), rank_(_mm512_set1_epi32(int32_t(d.rank))),
        phase_(_mm512_set1_epi32(int32_t(d.phase))) {
    uint32_t k0 = uint32_t(d.seed), k1 = uint32_t(d.seed >> 32);
    for (int round = 0; round < 10; ++round) {
      k0_[round] = _mm512_set1_epi32(int32_t(k0));
      k1_[round] = _mm512_set1_epi32(int32_t(k1));
      k0 += 0x9E3779B9u;
      k1 += 0xBB67AE85u;
    }
  }

  void operator()(uint64_t index, uint32_t* out) {
    const uint8_t* bytes = groups_.window(index, [this](uint64_t block, uint8_t* to) { group(block, to); });
    for (int c = 0; c < 16; ++c) {
      const __m512i b = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(bytes + 16 * c)));
      _mm512_storeu_si512(out + 16 * c, _mm512_or_si512(_mm512_slli_epi32(b, 24), _mm512_set1_epi32(0x800000)));
    }
  }

 private:
  // a * m as 64-bit products, their low and high words: two 32 x 32-bit multiplies where a separate
  // low product (vpmulld) would take two more.
  static void multiply(__m512i a, __m512i m, __m512i& lo, __m512i& hi) {
    const __m512i even = _mm512_mul_epu32(a, m), odd = _mm512_mul_epu32(_mm512_srli_epi64(a, 32), m);
    hi = _mm512_mask_shuffle_epi32(odd, 0x5555, even, _MM_PERM_CDAB);
    lo = _mm512_mask_shuffle_epi32(even, 0xAAAA, odd, _MM_PERM_CDAB);
  }

  // The 16 bytes each of the 16 blocks from block index `base` (a multiple of 16, so that no lane's
  // counter wraps into the high word the phase holds) on, in order, to `to`.
  void group(uint64_t base, uint8_t* to) const {
    const __m512i low = _mm512_set1_epi32(int32_t(uint32_t(base)));
    __m512i c0 = _mm512_add_epi32(low, _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
    __m512i c1 = seq_, c2 = rank_, c3 = _mm512_add_epi32(phase_, _mm512_set1_epi32(int32_t(2 * uint32_t(base >> 32))));
    const __m512i m0 = _mm512_set1_epi32(int32_t(0xD2511F53u)), m1 = _mm512_set1_epi32(int32_t(0xCD9E8D57u));
    #pragma GCC unroll 10
    for (int round = 0; round < 10; ++round) {
      __m512i hi0, lo0, hi1, lo1;
      multiply(c0, m0, lo0, hi0);
      multiply(c2, m1, lo1, hi1);
      c0 = _mm512_ternarylogic_epi32(hi1, c1, k0_[round], 0x96);  // a ^ b ^ c
      c1 = lo1;
      c2 = _mm512_ternarylogic_epi32(hi0, c3, k1_[round], 0x96);
      c3 = lo0;
    }
    // Lane l holds block l's four words as word k of c_k: within each 128-bit lane into block order
    // (128-bit lane l of u_t: block 4l + t), then the 128-bit lanes transposed.
    const __m512i t0 = _mm512_unpacklo_epi32(c0, c1), t1 = _mm512_unpacklo_epi32(c2, c3);
    const __m512i t2 = _mm512_unpackhi_epi32(c0, c1), t3 = _mm512_unpackhi_epi32(c2, c3);
    const __m512i u0 = _mm512_unpacklo_epi64(t0, t1), u1 = _mm512_unpackhi_epi64(t0, t1);
    const __m512i u2 = _mm512_unpacklo_epi64(t2, t3), u3 = _mm512_unpackhi_epi64(t2, t3);
    const __m512i a = _mm512_shuffle_i32x4(u0, u1, 0x44), b = _mm512_shuffle_i32x4(u2, u3, 0x44);  // 0 4 1 5, 2 6 3 7
    const __m512i c = _mm512_shuffle_i32x4(u0, u1, 0xEE), d = _mm512_shuffle_i32x4(u2, u3, 0xEE);  // 8 12 9 13, ...
    _mm512_storeu_si512(to, _mm512_shuffle_i32x4(a, b, 0x88));
    _mm512_storeu_si512(to + 64, _mm512_shuffle_i32x4(a, b, 0xDD));
    _mm512_storeu_si512(to + 128, _mm512_shuffle_i32x4(c, d, 0x88));
    _mm512_storeu_si512(to + 192, _mm512_shuffle_i32x4(c, d, 0xDD));
  }

  __m512i seq_, rank_, phase_;
  __m512i k0_[10], k1_[10];
  RandomByteGroups<256> groups_;
};

// stochastic_e2m1_value (stochastic.h) on 16 lanes: the same operations, each exact.
inline __m512 stochastic_e2m1(__m512 a, __m512i random) {
  const __mmask16 below2 = _mm512_cmp_ps_mask(a, _mm512_set1_ps(2.0f), _CMP_LT_OQ);
  const __mmask16 below4 = _mm512_cmp_ps_mask(a, _mm512_set1_ps(4.0f), _CMP_LT_OQ);
  const __m512 spacing = _mm512_mask_blend_ps(below2, _mm512_mask_blend_ps(below4, _mm512_set1_ps(2.0f), _mm512_set1_ps(1.0f)),
                                              _mm512_set1_ps(0.5f));
  const __m512 inverse = _mm512_mask_blend_ps(below2, _mm512_mask_blend_ps(below4, _mm512_set1_ps(0.5f), _mm512_set1_ps(1.0f)),
                                              _mm512_set1_ps(2.0f));
  const __m512 q = _mm512_mul_ps(a, inverse);
  const __m512 m = _mm512_roundscale_ps(q, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
  const __m512 u = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_srli_epi32(random, 8)), _mm512_set1_ps(0x1p-24f));
  const __mmask16 up = _mm512_cmp_ps_mask(u, _mm512_sub_ps(q, m), _CMP_LT_OQ);
  return _mm512_mul_ps(_mm512_mask_add_ps(m, up, m, _mm512_set1_ps(1.0f)), spacing);
}

// stochastic_on_grid (stochastic.h) on 16 lanes, as cpu/avx2.cpp's.
inline __m512 stochastic_on_grid(__m512 t, __m512i random, int min_exponent, int mantissa_bits) {
  const __m512i e = _mm512_sub_epi32(
      _mm512_max_epi32(_mm512_sub_epi32(_mm512_srli_epi32(_mm512_castps_si512(t), 23), _mm512_set1_epi32(127)),
                       _mm512_set1_epi32(min_exponent)),
      _mm512_set1_epi32(mantissa_bits));
  const __m512 down = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_sub_epi32(_mm512_set1_epi32(127), e), 23));
  const __m512 up = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(_mm512_set1_epi32(127), e), 23));
  const __m512 q = _mm512_mul_ps(t, down);
  const __m512 m = _mm512_roundscale_ps(q, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
  const __m512 u = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_srli_epi32(random, 8)), _mm512_set1_ps(0x1p-24f));
  const __mmask16 step = _mm512_cmp_ps_mask(u, _mm512_sub_ps(q, m), _CMP_LT_OQ);
  return _mm512_mul_ps(_mm512_mask_add_ps(m, step, m, _mm512_set1_ps(1.0f)), up);
}

// --- MX blocks.

// One block's 32 values (v[0..2), scaled) times inverse = 2^-X as its elements at `out`: 32 bytes, 16
// for e2m1 (element 2j in byte j's low nibble). As encode_elements in cpu/avx2.cpp: where
// kCountSaturated, the values past the largest magnitude are counted and clamped; with `random`, rounded
// stochastically.
template <bool kE2m1, bool kCountSaturated>
inline void encode_elements(const __m512* v, __m512 inverse, const Fp8Lanes16& fp8, __m512 largest,
                            uint64_t& saturated, uint8_t* out, const uint32_t* random = nullptr,
                            const Fp8Grid* grid = nullptr) {
  __m512i c[2];
  #pragma GCC unroll 2
  for (int k = 0; k < 2; ++k) {
    __m512 q = _mm512_mul_ps(v[k], inverse);
    if constexpr (kCountSaturated) {
      saturated += __builtin_popcount(_mm512_cmp_ps_mask(_mm512_abs_ps(q), largest, _CMP_GT_OQ));
      q = _mm512_min_ps(_mm512_max_ps(q, _mm512_sub_ps(_mm512_setzero_ps(), largest)), largest);
    }
    const __m512i bits = random ? _mm512_loadu_si512(random + 16 * k) : _mm512_setzero_si512();
    if constexpr (kE2m1) {
      const __m512i x = _mm512_castps_si512(q);
      __m512 a = _mm512_abs_ps(q);
      if (random) a = stochastic_e2m1(a, bits);
      c[k] = Fp8Lanes16::with_bit(fp8.codes_in_range(a), x, 28, 0x8);
    } else {
      if (random) {
        const __m512 a = stochastic_on_grid(_mm512_abs_ps(q), bits, grid->min_exponent, grid->mantissa_bits);
        // q's sign, -0 included: 0xF8 is a | (b & c) as ternary logic.
        q = _mm512_castsi512_ps(_mm512_ternarylogic_epi32(_mm512_castps_si512(a), _mm512_castps_si512(q),
                                                          _mm512_set1_epi32(INT32_MIN), 0xF8));
      }
      c[k] = fp8.codes_in_range(q);
    }
  }
  if constexpr (kE2m1) {
    // Odd elements' codes shifted beside the even ones' in each 64-bit lane, then one byte a lane.
    const __m128i lo = _mm512_cvtepi64_epi8(_mm512_or_si512(c[0], _mm512_srli_epi64(c[0], 28)));
    const __m128i hi = _mm512_cvtepi64_epi8(_mm512_or_si512(c[1], _mm512_srli_epi64(c[1], 28)));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out), _mm_unpacklo_epi64(lo, hi));
  } else {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out), _mm512_cvtepi32_epi8(c[0]));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 16), _mm512_cvtepi32_epi8(c[1]));
  }
}

// Whole blocks, sixteen at a time (mx_encode_blocks in cpu/avx2.cpp, eight there): their maxima and
// scales as the lanes of one vector, then each block's elements; the rest go to the AVX2 kernel.
template <bool kE2m1, bool kFloor>
size_t mx_encode_blocks(const float* src, size_t count, float scale, const MxBlockFormat& f, uint8_t* scales,
                        uint8_t* elements, Census* census, const Dither* dither, uint64_t first) {
  constexpr size_t kBlockBytes = kE2m1 ? kMxBlock / 2 : kMxBlock;
  const Fp8Lanes16 fp8(f.element);
  const Fp8Grid grid(f.element);
  std::optional<BlockRandomBits256> philox;
  if (dither) philox.emplace(*dither);
  const __m512 s = _mm512_set1_ps(scale), largest = _mm512_set1_ps(f.max);
  const __m512i magnitude = _mm512_set1_epi32(0x7FFFFFFF), finite_top = _mm512_set1_epi32(0x7F7FFFFF);
  uint64_t saturated = 0, nonfinite = 0;
  auto load = [&](size_t b, __m512* v) {
    v[0] = _mm512_mul_ps(_mm512_loadu_ps(src + b * kMxBlock), s);
    v[1] = _mm512_mul_ps(_mm512_loadu_ps(src + b * kMxBlock + 16), s);
    return _mm512_max_epu32(_mm512_and_si512(_mm512_castps_si512(v[0]), magnitude),
                            _mm512_and_si512(_mm512_castps_si512(v[1]), magnitude));
  };
  size_t b = 0;
  for (; b + 16 <= count; b += 16) {
    __m512i m[16];
    __m512 v[2];
    // The input prefetched as the casts' is: 16 blocks are 32 cache lines.
    for (int line = 0; line < 32; ++line) {
      _mm_prefetch(reinterpret_cast<const char*>(src + b * kMxBlock + 16 * line) + kPrefetchBytes, _MM_HINT_T0);
    }
    #pragma GCC unroll 16
    for (int j = 0; j < 16; ++j) m[j] = load(b + j, v);
    const __m512i amax = lane_maxima(m);
    __m512i x = _mm512_sub_epi32(_mm512_srli_epi32(amax, 23), _mm512_set1_epi32(127 + f.emax));
    if constexpr (!kFloor) {
      const __mmask16 up = _mm512_cmpgt_epi32_mask(_mm512_and_si512(amax, _mm512_set1_epi32(0x7FFFFF)),
                                                   _mm512_set1_epi32(int(f.fraction)));
      x = _mm512_mask_add_epi32(x, up, x, _mm512_set1_epi32(1));
    }
    x = _mm512_min_epi32(_mm512_max_epi32(x, _mm512_set1_epi32(-127)), _mm512_set1_epi32(127));
    alignas(64) float inverse[16];
    _mm512_store_si512(inverse, _mm512_slli_epi32(_mm512_sub_epi32(_mm512_set1_epi32(127), x), 23));
    const __mmask16 bad = _mm512_cmpgt_epu32_mask(amax, finite_top);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(scales + b), _mm512_cvtepi32_epi8(_mm512_add_epi32(x, _mm512_set1_epi32(127))));
    alignas(64) uint32_t random[16 * kMxBlock];
    if (philox) {
      (*philox)(first + b * kMxBlock, random);
      (*philox)(first + b * kMxBlock + 256, random + 256);
    }
    for (int j = 0; j < 16; ++j) {
      load(b + j, v);  // again, from L1
      uint8_t* out = elements + (b + j) * kBlockBytes;
      if (bad >> j & 1) {
        for (int k = 0; k < 2; ++k) {
          nonfinite += __builtin_popcount(_mm512_cmpgt_epu32_mask(
              _mm512_and_si512(_mm512_castps_si512(v[k]), magnitude), finite_top));
        }
        __builtin_memset(out, 0, kBlockBytes);
        scales[b + j] = 0xFF;
        continue;
      }
      encode_elements<kE2m1, kFloor>(v, _mm512_set1_ps(inverse[j]), fp8, largest, saturated, out,
                                     philox ? random + j * kMxBlock : nullptr, &grid);
    }
  }
  if (census) {
    census->nonfinite += nonfinite;
    census->saturated += saturated;
  }
  return b;
}

void mx_encode_f32(const float* src, size_t count, float scale, const MxBlockFormat& f, MxScale rule, uint8_t* scales,
                   uint8_t* elements, Census* census, const Dither* dither, uint64_t first) {
  const bool e2m1 = f.element == Wire::kMxfp4, floor = rule == MxScale::kFloor;
  size_t done = 0;
  if (e2m1 && floor) done = mx_encode_blocks<true, true>(src, count, scale, f, scales, elements, census, dither, first);
  if (e2m1 && !floor) done = mx_encode_blocks<true, false>(src, count, scale, f, scales, elements, census, dither, first);
  if (!e2m1 && floor) done = mx_encode_blocks<false, true>(src, count, scale, f, scales, elements, census, dither, first);
  if (!e2m1 && !floor) done = mx_encode_blocks<false, false>(src, count, scale, f, scales, elements, census, dither, first);
  if (done < count) {
    avx2_f16c_kernels()->mx_encode_f32(src + done * kMxBlock, count - done, scale, f, rule, scales + done,
                                       elements + done * (e2m1 ? kMxBlock / 2 : kMxBlock), census, dither,
                                       first + done * kMxBlock);
  }
}


// Fp8Widen (cpu/avx2.cpp) on 32 codes: the same fp16 forms, widened 16 at a time. vcvtph2ps reads fp16
// subnormals whatever the thread's DAZ setting, as F16C's form does (tested on every path).
class Fp8Widen32 {
 public:
  explicit Fp8Widen32(Wire w) : e4m3_(w == Wire::kE4m3) {}

  // The values of codes[0..32): lo holds the first 16, hi the next 16.
  void values(__m256i codes, __m512& lo, __m512& hi) const {
    const __m512i c = _mm512_cvtepu8_epi16(codes);
    const __m512i magnitude = _mm512_slli_epi16(_mm512_and_si512(c, _mm512_set1_epi16(0x7F)), e4m3_ ? 7 : 8);
    const __mmask32 nan = _mm512_cmpgt_epi16_mask(magnitude, _mm512_set1_epi16(e4m3_ ? 0x3F00 : 0x7C00));
    // (the magnitude, or fp16's NaN) | (c << 8 & 0x8000): 0xF8 is a | (b & c) as ternary logic.
    const __m512i h = _mm512_ternarylogic_epi32(_mm512_mask_mov_epi16(magnitude, nan, _mm512_set1_epi16(0x7E00)),
                                                _mm512_slli_epi16(c, 8), _mm512_set1_epi16(int16_t(0x8000)), 0xF8);
    lo = _mm512_cvtph_ps(_mm512_castsi512_si256(h));
    hi = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(h, 1));
    if (e4m3_) {
      lo = _mm512_mul_ps(lo, _mm512_set1_ps(256.0f));
      hi = _mm512_mul_ps(hi, _mm512_set1_ps(256.0f));
    }
  }

 private:
  bool e4m3_;
};

// The 32 values of a block as MxBlockValues (cpu/avx2.cpp) forms them, in v[0..2): e2m1's 16 codes
// index kE2m1Values directly (sign included), where 8 lanes needed the sign apart.
class MxBlockValues16 {
 public:
  explicit MxBlockValues16(Wire wire)
      : e2m1_(wire == Wire::kMxfp4),
        fp8_(wire == Wire::kMxfp8 ? Wire::kE4m3 : Wire::kE5m2),
        table_(_mm512_loadu_ps(kE2m1Values)) {}

  size_t block_bytes() const { return e2m1_ ? kMxBlock / 2 : kMxBlock; }

  void operator()(uint8_t code, const uint8_t* elements, __m512* v) const {
    // scale_of (cpu/mx.cpp): 0xFF is NaN, 0 the subnormal 2^-127.
    const __m512 s = code == 0xFF ? _mm512_set1_ps(__builtin_nanf(""))
                                  : _mm512_set1_ps(code ? __builtin_bit_cast(float, uint32_t(code) << 23) : 0x1p-127f);
    if (e2m1_) {
      const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(elements));
      const __m128i low = _mm_and_si128(bytes, _mm_set1_epi8(0x0F));
      const __m128i high = _mm_and_si128(_mm_srli_epi16(bytes, 4), _mm_set1_epi8(0x0F));
      v[0] = _mm512_mul_ps(_mm512_permutexvar_ps(_mm512_cvtepu8_epi32(_mm_unpacklo_epi8(low, high)), table_), s);
      v[1] = _mm512_mul_ps(_mm512_permutexvar_ps(_mm512_cvtepu8_epi32(_mm_unpackhi_epi8(low, high)), table_), s);
      return;
    }
    fp8_.values(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(elements)), v[0], v[1]);
    v[0] = _mm512_mul_ps(v[0], s);
    v[1] = _mm512_mul_ps(v[1], s);
  }

 private:
  bool e2m1_;
  Fp8Widen32 fp8_;
  __m512 table_;
};

template <MxDecodeOp kOp>
void mx_decode_blocks(const uint8_t* scales, const uint8_t* elements, size_t count, Wire wire, float* out, float post) {
  const __m512 p = _mm512_set1_ps(post);
  const MxBlockValues16 values(wire);
  for (size_t b = 0; b < count; ++b) {
    __m512 v[2];
    values(scales[b], elements + b * values.block_bytes(), v);
    #pragma GCC unroll 2
    for (int k = 0; k < 2; ++k) {
      float* o = out + b * kMxBlock + 16 * k;
      if constexpr (kOp == MxDecodeOp::kScale) {
        _mm512_storeu_ps(o, _mm512_mul_ps(v[k], p));
      } else {
        _mm512_storeu_ps(o, v[k]);
      }
    }
  }
}

void mx_decode(const uint8_t* scales, const uint8_t* elements, size_t count, Wire wire, float* out, MxDecodeOp op,
               float post) {
  switch (op) {
    case MxDecodeOp::kStore: return mx_decode_blocks<MxDecodeOp::kStore>(scales, elements, count, wire, out, post);
    case MxDecodeOp::kScale: return mx_decode_blocks<MxDecodeOp::kScale>(scales, elements, count, wire, out, post);
  }
}

// As mx_sum in cpu/avx2.cpp: every rank's block added in registers in rank order, the sum written once.
void mx_sum(const uint8_t* const* scales, const uint8_t* const* elements, size_t k, size_t count, Wire wire,
            float* out) {
  if (k == 0) return;
  const MxBlockValues16 values(wire);
  for (size_t b = 0; b < count; ++b) {
    __m512 sum[2], v[2];
    values(scales[0][b], elements[0] + b * values.block_bytes(), sum);
    for (size_t r = 1; r < k; ++r) {
      values(scales[r][b], elements[r] + b * values.block_bytes(), v);
      sum[0] = _mm512_add_ps(sum[0], v[0]);
      sum[1] = _mm512_add_ps(sum[1], v[1]);
    }
    _mm512_storeu_ps(out + b * kMxBlock, sum[0]);
    _mm512_storeu_ps(out + b * kMxBlock + 16, sum[1]);
  }
}

// The frames' owner sum (scaled_sum in cpu/frames.cpp) as cpu/avx2.cpp's, 32 elements a step; the
// rest to the AVX2 kernel.
void scaled_sum_f32(const void* const* in, const float* scales, size_t k, float* dst, size_t n, Wire w) {
  if (k == 0) return;
  size_t i = 0;
  const Fp8Widen32 fp8(w);
  for (; i + 32 <= n; i += 32) {
    __m512 sum_lo, sum_hi;
    for (size_t r = 0; r < k; ++r) {
      __m512 lo, hi;
      if (wire_bytes(w) == 1) {
        fp8.values(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(static_cast<const uint8_t*>(in[r]) + i)), lo,
                   hi);
      } else {
        const uint16_t* x = static_cast<const uint16_t*>(in[r]) + i;
        const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x));
        const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + 16));
        if (w == Wire::kFp16) {
          lo = _mm512_cvtph_ps(a);
          hi = _mm512_cvtph_ps(b);
        } else {
          lo = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(a), 16));
          hi = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(b), 16));
        }
      }
      const __m512 s = _mm512_set1_ps(scales[r]);
      lo = _mm512_mul_ps(lo, s);
      hi = _mm512_mul_ps(hi, s);
      sum_lo = r ? _mm512_add_ps(sum_lo, lo) : lo;
      sum_hi = r ? _mm512_add_ps(sum_hi, hi) : hi;
    }
    _mm512_storeu_ps(dst + i, sum_lo);
    _mm512_storeu_ps(dst + i + 16, sum_hi);
  }
  if (i == n) return;
  std::vector<const void*> rest(k);
  for (size_t r = 0; r < k; ++r) rest[r] = static_cast<const uint8_t*>(in[r]) + i * wire_bytes(w);
  avx2_f16c_kernels()->scaled_sum_f32(rest.data(), scales, k, dst + i, n - i, w);
}

// --- NVFP4 blocks (codec.h, "NVFP4 blocks"): the scalar block kernels of cpu/nvfp4.cpp with a block a vector.

// Whole blocks, sixteen at a time: their maxima, scale codes and reciprocals fl(fl(1 / P) / S) as the lanes
// of one vector (nv_scales in cpu/avx2.cpp), then each block's elements; a block that is not finite gets
// e4m3's NaN and zero elements; the rest (fewer than sixteen) go to the AVX2 kernel.
void nv_encode_f32(const float* src, size_t count, float scale, float part, float inverse, uint8_t* scales,
                   uint8_t* elements, Census* census, const Dither* dither, uint64_t first) {
  constexpr size_t kBlockBytes = kNvBlock / 2;
  const Fp8Lanes16 e4m3(Wire::kE4m3), e2m1(Wire::kMxfp4);
  const __m512 s = _mm512_set1_ps(scale);
  const __m512i magnitude = _mm512_set1_epi32(0x7FFFFFFF), finite_top = _mm512_set1_epi32(0x7F7FFFFF);
  uint64_t saturated = 0, nonfinite = 0;
  std::optional<BlockRandomBits256> philox;
  if (dither) philox.emplace(*dither);
  auto load = [&](size_t b) { return _mm512_mul_ps(_mm512_loadu_ps(src + b * kNvBlock), s); };
  size_t b = 0;
  for (; b + 16 <= count; b += 16) {
    __m512i m[16];
    for (int line = 0; line < 16; ++line) {
      _mm_prefetch(reinterpret_cast<const char*>(src + (b + line) * kNvBlock) + kPrefetchBytes, _MM_HINT_T0);
    }
    #pragma GCC unroll 16
    for (int j = 0; j < 16; ++j) m[j] = _mm512_and_si512(_mm512_castps_si512(load(b + j)), magnitude);
    const __m512i amax = lane_maxima(m);
    const __m512 block_scale = _mm512_min_ps(
        _mm512_max_ps(_mm512_div_ps(_mm512_div_ps(_mm512_castsi512_ps(amax), _mm512_set1_ps(6.0f)), _mm512_set1_ps(part)),
                      _mm512_set1_ps(0x1p-6f)),
        _mm512_set1_ps(448.0f));
    const __m512i codes = e4m3.codes_in_range(block_scale);
    // A normal e4m3 value's bits are its code's shifted into place, rebiased.
    const __m512 decoded = _mm512_castsi512_ps(_mm512_add_epi32(_mm512_slli_epi32(codes, 20), _mm512_set1_epi32(120 << 23)));
    alignas(64) float reciprocals[16];
    _mm512_store_ps(reciprocals, _mm512_div_ps(_mm512_set1_ps(inverse), decoded));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(scales + b), _mm512_cvtepi32_epi8(codes));
    const __mmask16 bad = _mm512_cmpgt_epu32_mask(amax, finite_top);
    alignas(64) uint32_t random[16 * kNvBlock];
    if (philox) (*philox)(first + b * kNvBlock, random);
    for (int j = 0; j < 16; ++j) {
      const __m512 v = load(b + j);  // again, from L1
      uint8_t* out = elements + (b + j) * kBlockBytes;
      if (bad >> j & 1) {
        nonfinite += __builtin_popcount(_mm512_cmpgt_epu32_mask(_mm512_and_si512(_mm512_castps_si512(v), magnitude),
                                                                finite_top));
        __builtin_memset(out, 0, kBlockBytes);
        scales[b + j] = 0x7F;
        continue;
      }
      const __m512 q = _mm512_mul_ps(v, _mm512_set1_ps(reciprocals[j]));
      const __m512 a = _mm512_abs_ps(q);
      // Only a census reads the count: counting without one cost 8% of the encode's time.
      if (census) saturated += __builtin_popcount(_mm512_cmp_ps_mask(a, _mm512_set1_ps(7.0f), _CMP_GE_OQ));
      __m512 clamped = _mm512_min_ps(a, _mm512_set1_ps(6.0f));
      if (philox) clamped = stochastic_e2m1(clamped, _mm512_load_si512(random + j * kNvBlock));
      const __m512i c = Fp8Lanes16::with_bit(e2m1.codes_in_range(clamped), _mm512_castps_si512(q), 28, 0x8);
      // Odd elements' codes shifted beside the even ones' in each 64-bit lane, then one byte a lane.
      _mm_storel_epi64(reinterpret_cast<__m128i*>(out), _mm512_cvtepi64_epi8(_mm512_or_si512(c, _mm512_srli_epi64(c, 28))));
    }
  }
  if (census) {
    census->nonfinite += nonfinite;
    census->saturated += saturated;
  }
  if (b < count) {
    avx2_f16c_kernels()->nv_encode_f32(src + b * kNvBlock, count - b, scale, part, inverse, scales + b,
                                       elements + b * kBlockBytes, census, dither, first + b * kNvBlock);
  }
}

// The 16 values of a block under the scale fl(P * S) (decode_block in cpu/nvfp4.cpp): its codes index
// kE2m1Values directly, sign included.
inline __m512 nv_block_values(uint8_t code, const uint8_t* elements, float part, const float* e4m3, __m512 table) {
  const __m128i bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(elements));
  const __m128i low = _mm_and_si128(bytes, _mm_set1_epi8(0x0F));
  const __m128i high = _mm_and_si128(_mm_srli_epi16(bytes, 4), _mm_set1_epi8(0x0F));
  const __m512 value = _mm512_permutexvar_ps(_mm512_cvtepu8_epi32(_mm_unpacklo_epi8(low, high)), table);
  return _mm512_mul_ps(value, _mm512_set1_ps(part * e4m3[code]));
}

void nv_decode(const uint8_t* scales, const uint8_t* elements, size_t count, float part, float* out, MxDecodeOp op,
               float post) {
  const __m512 table = _mm512_loadu_ps(kE2m1Values), p = _mm512_set1_ps(post);
  const float* e4m3 = fp8_values(Wire::kE4m3);
  for (size_t b = 0; b < count; ++b) {
    const __m512 v = nv_block_values(scales[b], elements + b * (kNvBlock / 2), part, e4m3, table);
    _mm512_storeu_ps(out + b * kNvBlock, op == MxDecodeOp::kScale ? _mm512_mul_ps(v, p) : v);
  }
}

// As nv_sum in cpu/avx2.cpp: every rank's block added in registers in rank order, the sum written once,
// and the sums' largest finite magnitude kept as lanes of bits.
float nv_sum(const uint8_t* const* scales, const uint8_t* const* elements, const float* parts, size_t k, size_t count,
             float* out) {
  if (k == 0) return 0.0f;
  const __m512 table = _mm512_loadu_ps(kE2m1Values);
  const float* e4m3 = fp8_values(Wire::kE4m3);
  const __m512i magnitude = _mm512_set1_epi32(0x7FFFFFFF), finite_top = _mm512_set1_epi32(0x7F7FFFFF);
  __m512i amax = _mm512_setzero_si512();
  for (size_t b = 0; b < count; ++b) {
    __m512 sum = nv_block_values(scales[0][b], elements[0] + b * (kNvBlock / 2), parts[0], e4m3, table);
    for (size_t r = 1; r < k; ++r) {
      sum = _mm512_add_ps(sum, nv_block_values(scales[r][b], elements[r] + b * (kNvBlock / 2), parts[r], e4m3, table));
    }
    _mm512_storeu_ps(out + b * kNvBlock, sum);
    const __m512i a = _mm512_and_si512(_mm512_castps_si512(sum), magnitude);
    amax = _mm512_mask_max_epu32(amax, _mm512_cmple_epu32_mask(a, finite_top), amax, a);
  }
  // A builtin, not kernels.h's inline float_of: an out-of-line copy compiled here could be the one the linker
  // keeps for every path.
  return __builtin_bit_cast(float, _mm512_reduce_max_epu32(amax));
}

// --- The block rotation (codec.h, rotate): cpu/rotation.cpp's butterflies with a block a vector. Each stage's
// p holds each lane's partner (lane j ^ h); the pair's lower lane gets v + p = a + b, its upper p - v = a - b.

void rotate_f32(const float* src, float* dst, size_t blocks, uint16_t signs, bool forward) {
  // D's signs as sign bits (an integer xor: a float one needs AVX-512 DQ).
  const __m512i d = _mm512_maskz_mov_epi32(signs, _mm512_set1_epi32(INT32_MIN));
  auto negate = [&](__m512 v) { return _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(v), d)); };
  const __m512 quarter = _mm512_set1_ps(0.25f);
  auto butterfly = [](__m512 v, __m512 p, __mmask16 upper) {
    return _mm512_mask_sub_ps(_mm512_add_ps(v, p), upper, p, v);
  };
  for (size_t b = 0; b < blocks; ++b) {
    __m512 v = _mm512_loadu_ps(src + b * kRotationBlock);
    if (forward) v = negate(v);
    v = butterfly(v, _mm512_permute_ps(v, 0xB1), 0xAAAA);           // h = 1
    v = butterfly(v, _mm512_permute_ps(v, 0x4E), 0xCCCC);           // h = 2
    v = butterfly(v, _mm512_shuffle_f32x4(v, v, 0xB1), 0xF0F0);     // h = 4: 128-bit lanes swapped in pairs
    v = butterfly(v, _mm512_shuffle_f32x4(v, v, 0x4E), 0xFF00);     // h = 8: the halves swapped
    v = _mm512_mul_ps(v, quarter);
    _mm512_storeu_ps(dst + b * kRotationBlock, forward ? v : negate(v));
  }
}

}  // namespace

const CpuKernels* avx512_kernels() {
  static const CpuKernels kernels = [] {
    CpuKernels k = *avx2_f16c_kernels();
    k.cast8_f32 = cast8_f32;
    k.mx_encode_f32 = mx_encode_f32;
    k.mx_decode = mx_decode;
    k.mx_sum = mx_sum;
    k.scaled_sum_f32 = scaled_sum_f32;
    k.nv_encode_f32 = nv_encode_f32;
    k.nv_decode = nv_decode;
    k.nv_sum = nv_sum;
    k.rotate_f32 = rotate_f32;
    return k;
  }();
  return &kernels;
}

}  // namespace cnccl::compress::detail

#else

namespace cnccl::compress::detail {
const CpuKernels* avx512_kernels() { return nullptr; }
}  // namespace cnccl::compress::detail

#endif

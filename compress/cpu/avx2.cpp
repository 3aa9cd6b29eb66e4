// AVX2 + F16C kernels. This file alone is compiled with -mavx2 -mf16c; cpu/dispatch.cpp calls
// it only after checking the processor. Loads and stores are unaligned, tails go to the scalar
// conversions, so any pointer and length is accepted.
#include "compress/cpu/kernels.h"

#if defined(__x86_64__)
#include <immintrin.h>

#include <algorithm>
#include <optional>
#include <vector>

namespace cnccl::compress::detail {
namespace {

// bf16 round-to-nearest-even on 8 lanes, NaN -> 0x7FC0 (torch's rule); result in the low 16 bits.
inline __m256i bf16_round(__m256 v) {
  const __m256i x = _mm256_castps_si256(v);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(1));
  __m256i r = _mm256_srli_epi32(_mm256_add_epi32(x, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7FFF))), 16);
  const __m256i is_nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
  return _mm256_blendv_epi8(r, _mm256_set1_epi32(0x7FC0), is_nan);
}

// Packs two vectors of 8 rounded bf16 values (low halves of 32-bit lanes) into 16 in order.
inline __m256i pack16(__m256i lo, __m256i hi) {
  return _mm256_permute4x64_epi64(_mm256_packus_epi32(lo, hi), 0xD8);
}

inline __m256 bf16_widen(__m128i h) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

// Outputs larger than this bypass the cache with streaming stores: they would be evicted before
// use anyway, and skipping the read-for-ownership saves a third of the memory traffic. At 4 MiB
// regular stores still won (bench/allreduce, 2 ranks: fp16 4 MiB 1.5x -> 1.8x cnccl-none).
constexpr size_t kStreamingBytes = size_t(8) << 20;
// Software prefetch distance for the streaming input: the hardware prefetcher alone leaves the
// single-threaded cast short of the memory bandwidth a copy reaches.
constexpr size_t kPrefetchBytes = 2048;

inline __m128i load8(const uint16_t* p) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)); }

template <bool kStream>
inline void store8(uint16_t* p, __m128i v) {
  if constexpr (kStream) {
    _mm_stream_si128(reinterpret_cast<__m128i*>(p), v);
  } else {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), v);
  }
}

template <bool kStream>
inline void store256(void* p, __m256i v) {
  if constexpr (kStream) {
    _mm256_stream_si256(reinterpret_cast<__m256i*>(p), v);
  } else {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), v);
  }
}

// Elements to handle with scalar code so that `dst + head` is 32-byte aligned (streaming stores need it).
template <typename T>
inline size_t head_to_align(const T* dst, size_t n) {
  const size_t misaligned = reinterpret_cast<uintptr_t>(dst) % 32;
  if (misaligned % sizeof(T)) return n;  // never reaches alignment: stay on the scalar path
  return std::min(n, misaligned ? (32 - misaligned) / sizeof(T) : 0);
}

constexpr int kRound = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;

inline __m256 widen8(const uint16_t* p, Wire w) {
  return w == Wire::kFp16 ? _mm256_cvtph_ps(load8(p)) : bf16_widen(load8(p));
}

// Stores 16 wide values, already scaled, as 16-bit.
template <bool kStream = false>
inline void narrow16(__m256 a, __m256 b, uint16_t* dst, Wire w) {
  if (w == Wire::kFp16) {
    store256<kStream>(dst, _mm256_set_m128i(_mm256_cvtps_ph(b, kRound), _mm256_cvtps_ph(a, kRound)));
  } else {
    store256<kStream>(dst, pack16(bf16_round(a), bf16_round(b)));
  }
}

// A census on 8 lanes (Census): counters of 32 bits a lane, added into the Census after each call.
struct Tally {
  __m256i nonfinite = _mm256_setzero_si256();
  __m256i saturated = _mm256_setzero_si256();
  __m256 limit;

  explicit Tally(Wire w) : limit(_mm256_set1_ps(overflow_limit(w))) {}

  // v: 8 values about to be cast. A compare's true lane is -1: subtracting it counts.
  void add(__m256 v) {
    const __m256i a = _mm256_castps_si256(_mm256_andnot_ps(_mm256_set1_ps(-0.0f), v));
    const __m256i not_finite = _mm256_cmpgt_epi32(a, _mm256_set1_epi32(0x7F7FFFFF));
    const __m256i past = _mm256_castps_si256(_mm256_cmp_ps(_mm256_castsi256_ps(a), limit, _CMP_GE_OQ));
    nonfinite = _mm256_sub_epi32(nonfinite, not_finite);
    saturated = _mm256_sub_epi32(saturated, _mm256_andnot_si256(not_finite, past));
  }

  void into(Census& c) const {
    alignas(32) uint32_t lanes[16];
    _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), nonfinite);
    _mm256_store_si256(reinterpret_cast<__m256i*>(lanes + 8), saturated);
    for (int j = 0; j < 8; ++j) {
      c.nonfinite += lanes[j];
      c.saturated += lanes[8 + j];
    }
  }
};

// Calls longer than this are counted in pieces: a lane's 32-bit counter then never wraps.
constexpr size_t kTallyPiece = size_t(1) << 32;

template <bool kStream, bool kCount>
size_t cast_f32_body(const float* src, uint16_t* dst, size_t n, __m256 s, Wire w, Tally& tally) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    _mm_prefetch(reinterpret_cast<const char*>(src + i) + kPrefetchBytes, _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(src + i + 8) + kPrefetchBytes, _MM_HINT_T0);
    const __m256 a = _mm256_mul_ps(_mm256_loadu_ps(src + i), s), b = _mm256_mul_ps(_mm256_loadu_ps(src + i + 8), s);
    if constexpr (kCount) {
      tally.add(a);
      tally.add(b);
    }
    narrow16<kStream>(a, b, dst + i, w);
  }
  return i;
}

template <bool kCount>
size_t cast_f32_vectors(const float* src, uint16_t* dst, size_t n, float scale, Wire w, Census* census) {
  const __m256 s = _mm256_set1_ps(scale);
  Tally tally(w);
  size_t i = 0;
  if (n * sizeof(uint16_t) >= kStreamingBytes && (i = head_to_align(dst, n)) < n) {
    scalar_kernels().cast_f32(src, dst, i, scale, w, census);
    i += cast_f32_body<true, kCount>(src + i, dst + i, n - i, s, w, tally);
    _mm_sfence();
  } else {
    i = cast_f32_body<false, kCount>(src, dst, n, s, w, tally);
  }
  if constexpr (kCount) tally.into(*census);
  return i;
}

void cast_f32(const float* src, uint16_t* dst, size_t n, float scale, Wire w, Census* census) {
  if (census) {
    for (size_t done = 0; done < n;) {
      const size_t m = std::min(n - done, kTallyPiece);
      const size_t i = cast_f32_vectors<true>(src + done, dst + done, m, scale, w, census);
      scalar_kernels().cast_f32(src + done + i, dst + done + i, m - i, scale, w, census);
      done += m;
    }
    return;
  }
  const size_t i = cast_f32_vectors<false>(src, dst, n, scale, w, nullptr);
  scalar_kernels().cast_f32(src + i, dst + i, n - i, scale, w, nullptr);
}

inline __m256 f64x8_scaled(const double* p, __m256d s) {
  const __m128 lo = _mm256_cvtpd_ps(_mm256_mul_pd(_mm256_loadu_pd(p), s));
  const __m128 hi = _mm256_cvtpd_ps(_mm256_mul_pd(_mm256_loadu_pd(p + 4), s));
  return _mm256_set_m128(hi, lo);
}

void cast_f64(const double* src, uint16_t* dst, size_t n, float scale, Wire w, Census* census) {
  const __m256d s = _mm256_set1_pd(scale);
  for (size_t done = 0; done < n;) {
    const size_t m = std::min(n - done, kTallyPiece);
    const double* x = src + done;
    uint16_t* y = dst + done;
    Tally tally(w);
    size_t i = 0;
    for (; i + 16 <= m; i += 16) {
      const __m256 a = f64x8_scaled(x + i, s), b = f64x8_scaled(x + i + 8, s);
      if (census) {
        tally.add(a);
        tally.add(b);
      }
      narrow16(a, b, y + i, w);
    }
    if (census) tally.into(*census);
    scalar_kernels().cast_f64(x + i, y + i, m - i, scale, w, census);
    done += m;
  }
}

template <bool kStream>
size_t restore_f32_body(const uint16_t* src, float* dst, size_t n, __m256 s, Wire w) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) store256<kStream>(dst + i, _mm256_castps_si256(_mm256_mul_ps(widen8(src + i, w), s)));
  return i;
}

void restore_f32(const uint16_t* src, float* dst, size_t n, float scale, Wire w) {
  const __m256 s = _mm256_set1_ps(scale);
  size_t i = 0;
  if (n * sizeof(float) >= kStreamingBytes && (i = head_to_align(dst, n)) < n) {
    scalar_kernels().restore_f32(src, dst, i, scale, w);
    i += restore_f32_body<true>(src + i, dst + i, n - i, s, w);
    _mm_sfence();
  } else {
    i = restore_f32_body<false>(src, dst, n, s, w);
  }
  scalar_kernels().restore_f32(src + i, dst + i, n - i, scale, w);
}

void restore_f64(const uint16_t* src, double* dst, size_t n, float scale, Wire w) {
  const __m256d s = _mm256_set1_pd(scale);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 v = widen8(src + i, w);
    _mm256_storeu_pd(dst + i, _mm256_mul_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(v)), s));
    _mm256_storeu_pd(dst + i + 4, _mm256_mul_pd(_mm256_cvtps_pd(_mm256_extractf128_ps(v, 1)), s));
  }
  scalar_kernels().restore_f64(src + i, dst + i, n - i, scale, w);
}

void add(uint16_t* acc, const uint16_t* in, size_t n, Wire w) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256 a = _mm256_add_ps(widen8(acc + i, w), widen8(in + i, w));
    const __m256 b = _mm256_add_ps(widen8(acc + i + 8, w), widen8(in + i + 8, w));
    narrow16(a, b, acc + i, w);
  }
  scalar_kernels().add(acc + i, in + i, n - i, w);
}

// The cast's 16-bit rounding, widened back to fp32 (what add() would read from memory).
inline __m256 rounded(__m256 v, Wire w) {
  if (w == Wire::kFp16) return _mm256_cvtph_ps(_mm256_cvtps_ph(v, kRound));
  return _mm256_castsi256_ps(_mm256_slli_epi32(bf16_round(v), 16));
}

void cast_add_f32(const float* src, const uint16_t* in, uint16_t* acc, size_t n, float scale, Wire w,
                  Census* census) {
  const __m256 s = _mm256_set1_ps(scale);
  for (size_t done = 0; done < n;) {
    const size_t m = std::min(n - done, kTallyPiece);
    const float* x = src + done;
    const uint16_t* y = in + done;
    uint16_t* z = acc + done;
    Tally tally(w);
    size_t i = 0;
    for (; i + 16 <= m; i += 16) {
      _mm_prefetch(reinterpret_cast<const char*>(x + i) + kPrefetchBytes, _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(x + i + 8) + kPrefetchBytes, _MM_HINT_T0);
      const __m256 va = _mm256_mul_ps(_mm256_loadu_ps(x + i), s), vb = _mm256_mul_ps(_mm256_loadu_ps(x + i + 8), s);
      if (census) {
        tally.add(va);
        tally.add(vb);
      }
      narrow16(_mm256_add_ps(rounded(va, w), widen8(y + i, w)), _mm256_add_ps(rounded(vb, w), widen8(y + i + 8, w)),
               z + i, w);
    }
    if (census) tally.into(*census);
    scalar_kernels().cast_add_f32(x + i, y + i, z + i, m - i, scale, w, census);
    done += m;
  }
}

void sum(const uint16_t* const* in, size_t k, uint16_t* dst, size_t n, Wire w) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m256 a = widen8(in[0] + i, w), b = widen8(in[0] + i + 8, w);
    for (size_t j = 1; j < k; ++j) {
      a = _mm256_add_ps(a, widen8(in[j] + i, w));
      b = _mm256_add_ps(b, widen8(in[j] + i + 8, w));
    }
    narrow16(a, b, dst + i, w);
  }
  for (; i < n; ++i) {
    float s = from_wire(in[0][i], w);
    for (size_t j = 1; j < k; ++j) s += from_wire(in[j][i], w);
    dst[i] = to_wire(s, w);
  }
}

void sum_f32(const uint16_t* const* in, size_t k, float* dst, size_t n, Wire w) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 a = widen8(in[0] + i, w);
    for (size_t j = 1; j < k; ++j) a = _mm256_add_ps(a, widen8(in[j] + i, w));
    _mm256_storeu_ps(dst + i, a);
  }
  for (; i < n; ++i) {
    float s = from_wire(in[0][i], w);
    for (size_t j = 1; j < k; ++j) s += from_wire(in[j][i], w);
    dst[i] = s;
  }
}

// Largest |x|: the sign bits cleared, the largest bit pattern is the largest magnitude (NaN's exceed
// infinity's).
float amax_f32(const float* src, size_t n) {
  const __m256i magnitude = _mm256_set1_epi32(0x7FFFFFFF);
  __m256i m = _mm256_setzero_si256();
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm_prefetch(reinterpret_cast<const char*>(src + i) + kPrefetchBytes, _MM_HINT_T0);
    const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i));
    m = _mm256_max_epu32(m, _mm256_and_si256(x, magnitude));
  }
  alignas(32) uint32_t lanes[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), m);
  uint32_t bits = *std::max_element(lanes, lanes + 8);
  for (; i < n; ++i) {
    uint32_t x;
    __builtin_memcpy(&x, src + i, sizeof x);
    bits = std::max(bits, x & 0x7FFFFFFFu);
  }
  return amax_of_bits(bits);
}

// to_fp8 (cpu/frames.cpp) on 8 lanes: the normal and subnormal roundings both computed, then chosen.
// e2m1 (mantissa 1 bit, bias 1) is the same kind of format: its codes_in_range() of a magnitude are
// e2m1_code's (cpu/mx.cpp), ties to the even code included.
//
// The choice takes no compare: below the smallest normal (code 2^m) the subnormal rounding's code is
// at most 2^m and at least the normal rounding's (which is below 2^m, or negative below the binade
// under it); from the smallest normal up, the normal rounding's is at least 2^m and the subnormal
// rounding's, capped at 2^m, no more. So max(normal, min(subnormal, 2^m)) is the right one everywhere.
// e4m3's overflow code is its NaN, so a NaN's normal rounding, capped there, is already right.
class Fp8Lanes {
 public:
  explicit Fp8Lanes(Wire w) : Fp8Lanes(Fp8Rounding(w)) {}
  explicit Fp8Lanes(const Fp8Rounding& r)
      : shift_(r.shift),
        nan_is_overflow_(r.nan_is_overflow),
        smallest_normal_code_(_mm256_set1_epi32(r.smallest_normal_code)),
        big_bits_(_mm256_set1_epi32(r.big_bits)),
        half_minus_one_(_mm256_set1_epi32(r.half_minus_one)),
        rebias_(_mm256_set1_epi32(r.rebias)),
        top_(_mm256_set1_epi32(r.top)) {}

  // The codes of 8 fp32 values, one in the low byte of each 32-bit lane.
  __m256i codes(__m256 v) const {
    const __m256i x = _mm256_castps_si256(v);
    const __m256i ax = _mm256_and_si256(x, _mm256_set1_epi32(0x7FFFFFFF));
    __m256i code = _mm256_max_epi32(_mm256_min_epi32(normal(ax), top_), subnormal(ax));
    if (!nan_is_overflow_) {
      code = _mm256_blendv_epi8(code, _mm256_set1_epi32(0x7F), _mm256_cmpgt_epi32(ax, _mm256_set1_epi32(0x7F800000)));
    }
    return _mm256_or_si256(code, sign(x));
  }

  // codes() for values known to be finite and at most the format's largest magnitude (an MX block's,
  // after its scale): no NaN and no overflow to handle.
  __m256i codes_in_range(__m256 v) const {
    const __m256i x = _mm256_castps_si256(v);
    const __m256i ax = _mm256_and_si256(x, _mm256_set1_epi32(0x7FFFFFFF));
    return _mm256_or_si256(_mm256_max_epi32(normal(ax), subnormal(ax)), sign(x));
  }

 private:
  static __m256i sign(__m256i x) { return _mm256_and_si256(_mm256_srli_epi32(x, 24), _mm256_set1_epi32(0x80)); }

  // Rounded to the format's subnormal step (the fp32 adder rounds to nearest even there), capped at
  // the smallest normal's code.
  __m256i subnormal(__m256i ax) const {
    const __m256i code = _mm256_sub_epi32(
        _mm256_castps_si256(_mm256_add_ps(_mm256_castsi256_ps(ax), _mm256_castsi256_ps(big_bits_))), big_bits_);
    return _mm256_min_epi32(code, smallest_normal_code_);
  }

  // Rounded to nearest even at the format's mantissa, rebiased (negative for magnitudes two binades
  // and more below the smallest normal).
  __m256i normal(__m256i ax) const {
    const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(ax, shift_), _mm256_set1_epi32(1));
    const __m256i rounded = _mm256_add_epi32(ax, _mm256_add_epi32(half_minus_one_, odd));
    return _mm256_sub_epi32(_mm256_srli_epi32(rounded, shift_), rebias_);
  }

  int shift_;
  bool nan_is_overflow_;
  __m256i smallest_normal_code_, big_bits_, half_minus_one_, rebias_, top_;
};

void cast8_f32(const float* src, uint8_t* dst, size_t n, float scale, Wire w) {
  const Fp8Lanes fp8(w);
  const __m256 s = _mm256_set1_ps(scale);
  // 32 codes a step, packed in lane order and put back in element order with one permute: one 32-byte
  // store instead of four 8-byte ones. The input is prefetched as the fp16 cast's: without it this
  // cast ran at 0.4x the fp16 cast's speed from DRAM (bench/codec).
  const __m256i element_order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    _mm_prefetch(reinterpret_cast<const char*>(src + i) + kPrefetchBytes, _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(src + i + 16) + kPrefetchBytes, _MM_HINT_T0);
    const __m256i c0 = fp8.codes(_mm256_mul_ps(_mm256_loadu_ps(src + i), s));
    const __m256i c1 = fp8.codes(_mm256_mul_ps(_mm256_loadu_ps(src + i + 8), s));
    const __m256i c2 = fp8.codes(_mm256_mul_ps(_mm256_loadu_ps(src + i + 16), s));
    const __m256i c3 = fp8.codes(_mm256_mul_ps(_mm256_loadu_ps(src + i + 24), s));
    const __m256i bytes = _mm256_packus_epi16(_mm256_packus_epi32(c0, c1), _mm256_packus_epi32(c2, c3));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), _mm256_permutevar8x32_epi32(bytes, element_order));
  }
  for (; i + 8 <= n; i += 8) {
    const __m256i code = fp8.codes(_mm256_mul_ps(_mm256_loadu_ps(src + i), s));
    const __m128i words = _mm_packus_epi32(_mm256_castsi256_si128(code), _mm256_extracti128_si256(code, 1));
    _mm_storel_epi64(reinterpret_cast<__m128i*>(dst + i), _mm_packus_epi16(words, words));
  }
  for (; i < n; ++i) dst[i] = to_fp8(src[i] * scale, w);
}

// fp8_values (cpu/frames.cpp) of 16 codes, exactly, through F16C: e5m2 is fp16's upper byte, and
// e4m3's magnitude shifted under fp16's exponent is its value times 2^-8 (e4m3's smallest normal 2^-6
// lands on fp16's 2^-14, so its subnormals land on fp16's); the product by 2^8 is exact. NaN codes
// become fp16's quiet NaN first, which widens to the table's NaN (0x7FC00000, signed). F16C reads
// fp16 subnormals whatever the thread's DAZ setting (tested). Half the instructions of forming each
// value in 32-bit lanes.
class Fp8Widen {
 public:
  explicit Fp8Widen(Wire w) : e4m3_(w == Wire::kE4m3) {}

  // The values of codes[0..16): lo holds the first 8, hi the next 8.
  void values(__m128i codes, __m256& lo, __m256& hi) const {
    const __m256i c = _mm256_cvtepu8_epi16(codes);
    const __m256i magnitude = e4m3_ ? _mm256_slli_epi16(_mm256_and_si256(c, _mm256_set1_epi16(0x7F)), 7)
                                    : _mm256_slli_epi16(_mm256_and_si256(c, _mm256_set1_epi16(0x7F)), 8);
    const __m256i nan = _mm256_cmpgt_epi16(magnitude, _mm256_set1_epi16(e4m3_ ? 0x3F00 : 0x7C00));
    const __m256i sign = _mm256_slli_epi16(_mm256_and_si256(c, _mm256_set1_epi16(0x80)), 8);
    const __m256i h = _mm256_or_si256(_mm256_blendv_epi8(magnitude, _mm256_set1_epi16(0x7E00), nan), sign);
    lo = _mm256_cvtph_ps(_mm256_castsi256_si128(h));
    hi = _mm256_cvtph_ps(_mm256_extracti128_si256(h, 1));
    if (e4m3_) {
      lo = _mm256_mul_ps(lo, _mm256_set1_ps(256.0f));
      hi = _mm256_mul_ps(hi, _mm256_set1_ps(256.0f));
    }
  }

 private:
  bool e4m3_;
};

template <bool kStream>
size_t restore8_f32_body(const uint8_t* src, float* dst, size_t n, __m256 s, const Fp8Widen& fp8) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m256 lo, hi;
    fp8.values(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i)), lo, hi);
    store256<kStream>(dst + i, _mm256_castps_si256(_mm256_mul_ps(lo, s)));
    store256<kStream>(dst + i + 8, _mm256_castps_si256(_mm256_mul_ps(hi, s)));
  }
  return i;
}

// Large outputs with streaming stores, as restore_f32's.
void restore8_f32(const uint8_t* src, float* dst, size_t n, float scale, Wire w) {
  const Fp8Widen fp8(w);
  const __m256 s = _mm256_set1_ps(scale);
  const float* values = fp8_values(w);
  size_t i = 0;
  if (n * sizeof(float) >= kStreamingBytes && (i = head_to_align(dst, n)) < n) {
    for (size_t k = 0; k < i; ++k) dst[k] = values[src[k]] * scale;
    i += restore8_f32_body<true>(src + i, dst + i, n - i, s, fp8);
    _mm_sfence();
  } else {
    i = restore8_f32_body<false>(src, dst, n, s, fp8);
  }
  for (; i < n; ++i) dst[i] = values[src[i]] * scale;
}

// --- Stochastic rounding (stochastic.h) on 8 lanes.

// a * m as 64-bit products, their low and high words: two 32 x 32-bit multiplies (AVX2 multiplies only
// the even lanes to 64 bits) where a separate low product (vpmulld) would take two more.
inline void multiply(__m256i a, __m256i m, __m256i& lo, __m256i& hi) {
  const __m256i even = _mm256_mul_epu32(a, m), odd = _mm256_mul_epu32(_mm256_srli_epi64(a, 32), m);
  hi = _mm256_blend_epi32(_mm256_srli_epi64(even, 32), odd, 0xAA);
  lo = _mm256_blend_epi32(even, _mm256_slli_epi64(odd, 32), 0xAA);
}

// block_random_bits(dither, index + i) for i in [0, 128) (stochastic.h): Philox4x32-10 on 8 lanes, a block
// counter a lane, the round keys broadcast once for every call, in groups of 8 blocks (RandomByteGroups).
class BlockRandomBits128 {
 public:
  explicit BlockRandomBits128(const Dither& d)
      : seq_(_mm256_set1_epi32(int32_t(d.seq))), rank_(_mm256_set1_epi32(int32_t(d.rank))),
        phase_(_mm256_set1_epi32(int32_t(d.phase))) {
    uint32_t k0 = uint32_t(d.seed), k1 = uint32_t(d.seed >> 32);
    for (int round = 0; round < 10; ++round) {
      k0_[round] = _mm256_set1_epi32(int32_t(k0));
      k1_[round] = _mm256_set1_epi32(int32_t(k1));
      k0 += 0x9E3779B9u;
      k1 += 0xBB67AE85u;
    }
  }

  void operator()(uint64_t index, uint32_t* out) {
    const uint8_t* bytes = groups_.window(index, [this](uint64_t block, uint8_t* to) { group(block, to); });
    for (int c = 0; c < 16; ++c) {
      const __m256i b = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(bytes + 8 * c)));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 8 * c),
                          _mm256_or_si256(_mm256_slli_epi32(b, 24), _mm256_set1_epi32(0x800000)));
    }
  }

 private:
  // The 16 bytes each of the 8 blocks from block index `base` (a multiple of 8, so that no lane's
  // counter wraps into the high word the phase holds) on, in order, to `to`.
  void group(uint64_t base, uint8_t* to) const {
    __m256i c0 = _mm256_add_epi32(_mm256_set1_epi32(int32_t(uint32_t(base))),
                                  _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    __m256i c1 = seq_, c2 = rank_, c3 = _mm256_add_epi32(phase_, _mm256_set1_epi32(int32_t(2 * uint32_t(base >> 32))));
    const __m256i m0 = _mm256_set1_epi32(int32_t(0xD2511F53u)), m1 = _mm256_set1_epi32(int32_t(0xCD9E8D57u));
    #pragma GCC unroll 10
    for (int round = 0; round < 10; ++round) {
      __m256i hi0, lo0, hi1, lo1;
      multiply(c0, m0, lo0, hi0);
      multiply(c2, m1, lo1, hi1);
      c0 = _mm256_xor_si256(_mm256_xor_si256(hi1, c1), k0_[round]);
      c1 = lo1;
      c2 = _mm256_xor_si256(_mm256_xor_si256(hi0, c3), k1_[round]);
      c3 = lo0;
    }
    // Lane l holds block l's four words as word k of c_k: transposed in registers into block order,
    // blocks (0, 1), (2, 3), (4, 5), (6, 7) a vector.
    const __m256i t0 = _mm256_unpacklo_epi32(c0, c1), t1 = _mm256_unpacklo_epi32(c2, c3);
    const __m256i t2 = _mm256_unpackhi_epi32(c0, c1), t3 = _mm256_unpackhi_epi32(c2, c3);
    const __m256i u0 = _mm256_unpacklo_epi64(t0, t1), u1 = _mm256_unpackhi_epi64(t0, t1);
    const __m256i u2 = _mm256_unpacklo_epi64(t2, t3), u3 = _mm256_unpackhi_epi64(t2, t3);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(to), _mm256_permute2x128_si256(u0, u1, 0x20));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(to + 32), _mm256_permute2x128_si256(u2, u3, 0x20));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(to + 64), _mm256_permute2x128_si256(u0, u1, 0x31));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(to + 96), _mm256_permute2x128_si256(u2, u3, 0x31));
  }

  __m256i seq_, rank_, phase_;
  __m256i k0_[10], k1_[10];
  RandomByteGroups<128> groups_;
};

// stochastic_e2m1_value (stochastic.h) on 8 lanes: the same operations, each exact.
inline __m256 stochastic_e2m1(__m256 a, __m256i random) {
  const __m256 below2 = _mm256_cmp_ps(a, _mm256_set1_ps(2.0f), _CMP_LT_OQ);
  const __m256 below4 = _mm256_cmp_ps(a, _mm256_set1_ps(4.0f), _CMP_LT_OQ);
  const __m256 spacing = _mm256_blendv_ps(_mm256_blendv_ps(_mm256_set1_ps(2.0f), _mm256_set1_ps(1.0f), below4),
                                          _mm256_set1_ps(0.5f), below2);
  const __m256 inverse = _mm256_blendv_ps(_mm256_blendv_ps(_mm256_set1_ps(0.5f), _mm256_set1_ps(1.0f), below4),
                                          _mm256_set1_ps(2.0f), below2);
  const __m256 q = _mm256_mul_ps(a, inverse);
  const __m256 m = _mm256_floor_ps(q);
  const __m256 u = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(random, 8)), _mm256_set1_ps(0x1p-24f));
  const __m256 up = _mm256_and_ps(_mm256_cmp_ps(u, _mm256_sub_ps(q, m), _CMP_LT_OQ), _mm256_set1_ps(1.0f));
  return _mm256_mul_ps(_mm256_add_ps(m, up), spacing);
}

// stochastic_on_grid (stochastic.h) on 8 lanes for t >= 0 at most an 8-bit format's largest value: the
// spacing's exponent from t's exponent bits (an fp32 subnormal's -127 is below any min_exponent, as frexp's
// is), and the same exact operations.
inline __m256 stochastic_on_grid(__m256 t, __m256i random, int min_exponent, int mantissa_bits) {
  const __m256i e = _mm256_sub_epi32(
      _mm256_max_epi32(_mm256_sub_epi32(_mm256_srli_epi32(_mm256_castps_si256(t), 23), _mm256_set1_epi32(127)),
                       _mm256_set1_epi32(min_exponent)),
      _mm256_set1_epi32(mantissa_bits));
  const __m256 down = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_sub_epi32(_mm256_set1_epi32(127), e), 23));
  const __m256 up = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_set1_epi32(127), e), 23));
  const __m256 q = _mm256_mul_ps(t, down);
  const __m256 m = _mm256_floor_ps(q);
  const __m256 u = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(random, 8)), _mm256_set1_ps(0x1p-24f));
  const __m256 step = _mm256_and_ps(_mm256_cmp_ps(u, _mm256_sub_ps(q, m), _CMP_LT_OQ), _mm256_set1_ps(1.0f));
  return _mm256_mul_ps(_mm256_add_ps(m, step), up);
}

// --- MX blocks (codec.h, "MX blocks"): the scalar block kernels of cpu/mx.cpp on 8 lanes, four
// vectors a block.

inline int popcount_lanes(__m256i mask) { return __builtin_popcount(_mm256_movemask_ps(_mm256_castsi256_ps(mask))); }

// 32 codes, one in the low byte of each lane of c[0..3], as 32 bytes in order.
inline __m256i bytes_of(const __m256i* c) {
  const __m256i b = _mm256_packus_epi16(_mm256_packus_epi32(c[0], c[1]), _mm256_packus_epi32(c[2], c[3]));
  return _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

// One block's 32 values, scaled, as its elements at `out` (32 bytes, 16 for e2m1), `inverse` = 2^-X.
// Counts the values that pass the largest magnitude into `saturated` (lanes of -1 per value) where
// kCountSaturated: under RCEIL none does (X makes amax * 2^-X at most the largest), and the clamp is
// then the identity too. With `random` (32 words, element order) each magnitude is rounded
// stochastically onto the element type's grid first (`grid` for e4m3 and e5m2), as encode_block's.
template <bool kE2m1, bool kCountSaturated>
inline void encode_elements(const __m256* v, __m256 inverse, const Fp8Lanes& fp8, __m256 largest, __m256i& saturated,
                            uint8_t* out, const uint32_t* random = nullptr, const Fp8Grid* grid = nullptr) {
  const __m256 magnitude = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  __m256i c[4];
  #pragma GCC unroll 4
  for (int k = 0; k < 4; ++k) {
    __m256 q = _mm256_mul_ps(v[k], inverse);
    if constexpr (kCountSaturated) {
      const __m256 a = _mm256_and_ps(q, magnitude);
      saturated = _mm256_add_epi32(saturated, _mm256_castps_si256(_mm256_cmp_ps(a, largest, _CMP_GT_OQ)));
      // The scalar kernel's clamp (std::clamp, or for e2m1 the magnitude's min): the same values.
      q = _mm256_min_ps(_mm256_max_ps(q, _mm256_xor_ps(largest, _mm256_set1_ps(-0.0f))), largest);
    }
    const __m256i bits = random ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(random + 8 * k))
                                : _mm256_setzero_si256();
    if constexpr (kE2m1) {
      const __m256i sign = _mm256_slli_epi32(_mm256_srli_epi32(_mm256_castps_si256(q), 31), 3);
      __m256 a = _mm256_and_ps(q, magnitude);
      if (random) a = stochastic_e2m1(a, bits);
      c[k] = _mm256_or_si256(fp8.codes_in_range(a), sign);
    } else {
      if (random) {
        const __m256 a = stochastic_on_grid(_mm256_and_ps(q, magnitude), bits, grid->min_exponent, grid->mantissa_bits);
        q = _mm256_or_ps(a, _mm256_andnot_ps(magnitude, q));  // q's sign, -0 included
      }
      c[k] = fp8.codes_in_range(q);
    }
  }
  const __m256i bytes = bytes_of(c);
  if constexpr (kE2m1) {
    // Element 2j in the low nibble of byte j, 2j + 1 in its high nibble.
    const __m256i pairs = _mm256_or_si256(_mm256_and_si256(bytes, _mm256_set1_epi16(0x000F)),
                                          _mm256_and_si256(_mm256_srli_epi16(bytes, 4), _mm256_set1_epi16(0x00F0)));
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi16(pairs, pairs), 0x08);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out), _mm256_castsi256_si128(packed));
  } else {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), bytes);
  }
}

// The largest magnitude's bits of each of 8 blocks (lanes of m[b], the lane-wise maxima of block b),
// as lane b.
inline __m256i lane_maxima(const __m256i* m) {
  auto pairs = [](__m256i x, __m256i y) { return _mm256_max_epu32(_mm256_unpacklo_epi32(x, y), _mm256_unpackhi_epi32(x, y)); };
  auto quads = [](__m256i x, __m256i y) { return _mm256_max_epu32(_mm256_unpacklo_epi64(x, y), _mm256_unpackhi_epi64(x, y)); };
  const __m256i low = quads(pairs(m[0], m[1]), pairs(m[2], m[3]));   // blocks 0-3, per 128-bit half
  const __m256i high = quads(pairs(m[4], m[5]), pairs(m[6], m[7]));  // blocks 4-7
  return _mm256_max_epu32(_mm256_permute2x128_si256(low, high, 0x20), _mm256_permute2x128_si256(low, high, 0x31));
}

// Whole blocks, eight at a time: their maxima and scales as lanes of one vector (no block waits on a
// scalar chain from its own amax), then each block's elements; the rest one at a time, or with a dither
// by the scalar kernel. Returns the blocks done here.
template <bool kE2m1, bool kFloor>
size_t mx_encode_blocks(const float* src, size_t count, float scale, const MxBlockFormat& f, uint8_t* scales,
                        uint8_t* elements, Census* census, const Dither* dither, uint64_t first) {
  constexpr size_t kBlockBytes = kE2m1 ? kMxBlock / 2 : kMxBlock;
  const Fp8Lanes fp8(f.element);
  const Fp8Grid grid(f.element);
  std::optional<BlockRandomBits128> philox;
  if (dither) philox.emplace(*dither);
  const __m256 s = _mm256_set1_ps(scale), largest = _mm256_set1_ps(f.max);
  const __m256i magnitude = _mm256_set1_epi32(0x7FFFFFFF), finite_top = _mm256_set1_epi32(0x7F7FFFFF);
  __m256i saturated = _mm256_setzero_si256();
  uint64_t nonfinite = 0;
  // Block b's values (scaled) and its lane-wise maximum magnitude.
  auto load = [&](size_t b, __m256* v) {
    __m256i m = _mm256_setzero_si256();
    #pragma GCC unroll 4
    for (int k = 0; k < 4; ++k) {
      v[k] = _mm256_mul_ps(_mm256_loadu_ps(src + b * kMxBlock + 8 * k), s);
      m = _mm256_max_epu32(m, _mm256_and_si256(_mm256_castps_si256(v[k]), magnitude));
    }
    return m;
  };
  auto not_finite = [&](size_t b, const __m256* v) {
    for (int k = 0; k < 4; ++k) {
      nonfinite += uint64_t(popcount_lanes(_mm256_cmpgt_epi32(
          _mm256_and_si256(_mm256_castps_si256(v[k]), magnitude), finite_top)));
    }
    __builtin_memset(elements + b * kBlockBytes, 0, kBlockBytes);
    scales[b] = 0xFF;
  };
  // X (clamped) of each lane's amax bits.
  auto exponents = [&](__m256i amax) {
    __m256i x = _mm256_sub_epi32(_mm256_srli_epi32(amax, 23), _mm256_set1_epi32(127 + f.emax));
    if constexpr (!kFloor) {
      const __m256i fraction = _mm256_and_si256(amax, _mm256_set1_epi32(0x7FFFFF));
      x = _mm256_sub_epi32(x, _mm256_cmpgt_epi32(fraction, _mm256_set1_epi32(int(f.fraction))));
    }
    return _mm256_min_epi32(_mm256_max_epi32(x, _mm256_set1_epi32(-127)), _mm256_set1_epi32(127));
  };
  size_t b = 0;
  for (; b + 8 <= count; b += 8) {
    __m256i m[8];
    __m256 v[4];
    #pragma GCC unroll 8
    for (int j = 0; j < 8; ++j) m[j] = load(b + j, v);
    const __m256i amax = lane_maxima(m);
    const __m256i x = exponents(amax);
    const __m256i inverse = _mm256_slli_epi32(_mm256_sub_epi32(_mm256_set1_epi32(127), x), 23);
    const int bad = _mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpgt_epi32(amax, finite_top)));
    const __m256i codes = _mm256_add_epi32(x, _mm256_set1_epi32(127));
    const __m128i words = _mm_packus_epi32(_mm256_castsi256_si128(codes), _mm256_extracti128_si256(codes, 1));
    _mm_storel_epi64(reinterpret_cast<__m128i*>(scales + b), _mm_packus_epi16(words, words));
    alignas(32) uint32_t random[8 * kMxBlock];
    if (philox) {
      (*philox)(first + b * kMxBlock, random);
      (*philox)(first + b * kMxBlock + 128, random + 128);
    }
    for (int j = 0; j < 8; ++j) {
      load(b + j, v);  // again, from L1
      if (bad >> j & 1) {
        not_finite(b + j, v);
        continue;
      }
      const __m256 lane = _mm256_castsi256_ps(_mm256_permutevar8x32_epi32(inverse, _mm256_set1_epi32(j)));
      encode_elements<kE2m1, kFloor>(v, lane, fp8, largest, saturated, elements + (b + j) * kBlockBytes,
                                     philox ? random + j * kMxBlock : nullptr, &grid);
    }
  }
  for (; b < count && !dither; ++b) {
    __m256 v[4];
    __m256i m = load(b, v);
    m = _mm256_max_epu32(m, _mm256_permute2x128_si256(m, m, 1));
    m = _mm256_max_epu32(m, _mm256_shuffle_epi32(m, 0x4E));
    m = _mm256_max_epu32(m, _mm256_shuffle_epi32(m, 0xB1));
    if (uint32_t(_mm256_cvtsi256_si32(m)) > 0x7F7FFFFFu) {
      not_finite(b, v);
      continue;
    }
    const __m256i x = exponents(m);
    const __m256 inverse = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_sub_epi32(_mm256_set1_epi32(127), x), 23));
    encode_elements<kE2m1, kFloor>(v, inverse, fp8, largest, saturated, elements + b * kBlockBytes);
    scales[b] = uint8_t(_mm256_cvtsi256_si32(x) + 127);
  }
  if (census) {
    alignas(32) int32_t lanes[8];
    _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), saturated);
    uint64_t total = 0;
    for (int32_t lane : lanes) total += uint64_t(uint32_t(-lane));
    census->nonfinite += nonfinite;
    census->saturated += total;
  }
  return b;
}

void mx_encode_f32(const float* src, size_t count, float scale, const MxBlockFormat& f, MxScale rule, uint8_t* scales,
                   uint8_t* elements, Census* census, const Dither* dither, uint64_t first) {
  // The per-lane saturation counters hold 2^31 - 1 each: pieces of at most 2^26 blocks.
  constexpr size_t kPiece = size_t(1) << 26;
  const bool e2m1 = f.element == Wire::kMxfp4, floor = rule == MxScale::kFloor;
  const size_t block_bytes = e2m1 ? kMxBlock / 2 : kMxBlock;
  for (size_t piece = 0; piece < count; piece += kPiece) {
    const size_t blocks = std::min(kPiece, count - piece);
    const float* x = src + piece * kMxBlock;
    uint8_t* e = elements + piece * block_bytes;
    const uint64_t index = first + piece * kMxBlock;
    size_t done = 0;
    if (e2m1 && floor) done = mx_encode_blocks<true, true>(x, blocks, scale, f, scales + piece, e, census, dither, index);
    if (e2m1 && !floor) done = mx_encode_blocks<true, false>(x, blocks, scale, f, scales + piece, e, census, dither, index);
    if (!e2m1 && floor) done = mx_encode_blocks<false, true>(x, blocks, scale, f, scales + piece, e, census, dither, index);
    if (!e2m1 && !floor) done = mx_encode_blocks<false, false>(x, blocks, scale, f, scales + piece, e, census, dither, index);
    if (done < blocks) {
      scalar_kernels().mx_encode_f32(x + done * kMxBlock, blocks - done, scale, f, rule, scales + piece + done,
                                     e + done * block_bytes, census, dither, index + done * kMxBlock);
    }
  }
}

// The scale 2^X of a code as 8 lanes: 0xFF is NaN, 0 the subnormal 2^-127 (scale_of in cpu/mx.cpp).
inline __m256 scale_lanes(uint8_t code) {
  if (code == 0xFF) return _mm256_set1_ps(__builtin_nanf(""));
  return _mm256_set1_ps(code ? __builtin_bit_cast(float, uint32_t(code) << 23) : 0x1p-127f);
}

template <MxDecodeOp kOp>
inline void put(float* out, __m256 v, __m256 post) {
  if constexpr (kOp == MxDecodeOp::kScale) {
    _mm256_storeu_ps(out, _mm256_mul_ps(v, post));
  } else {
    _mm256_storeu_ps(out, v);
  }
}

// The 32 values of a block (its scale code and elements), element times scale rounded as
// decode_block's (cpu/mx.cpp), into v[0..4).
class MxBlockValues {
 public:
  explicit MxBlockValues(Wire wire)
      : e2m1_(wire == Wire::kMxfp4),
        fp8_(wire == Wire::kMxfp8 ? Wire::kE4m3 : Wire::kE5m2),
        magnitudes_(_mm256_loadu_ps(kE2m1Values)) {}

  size_t block_bytes() const { return e2m1_ ? kMxBlock / 2 : kMxBlock; }

  void operator()(uint8_t code, const uint8_t* elements, __m256* v) const {
    const __m256 s = scale_lanes(code);
    if (e2m1_) {
      // The eight magnitudes by index, the sign from bit 3 (kE2m1Values' order).
      const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(elements));
      const __m128i low = _mm_and_si128(bytes, _mm_set1_epi8(0x0F));
      const __m128i high = _mm_and_si128(_mm_srli_epi16(bytes, 4), _mm_set1_epi8(0x0F));
      const __m128i codes[2] = {_mm_unpacklo_epi8(low, high), _mm_unpackhi_epi8(low, high)};
      #pragma GCC unroll 4
      for (int k = 0; k < 4; ++k) {
        const __m256i c = _mm256_cvtepu8_epi32(k % 2 ? _mm_srli_si128(codes[k / 2], 8) : codes[k / 2]);
        const __m256 magnitude = _mm256_permutevar8x32_ps(magnitudes_, c);
        const __m256 value = _mm256_or_ps(magnitude, _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_srli_epi32(c, 3), 31)));
        v[k] = _mm256_mul_ps(value, s);
      }
      return;
    }
    #pragma GCC unroll 2
    for (int k = 0; k < 4; k += 2) {
      fp8_.values(_mm_loadu_si128(reinterpret_cast<const __m128i*>(elements + 8 * k)), v[k], v[k + 1]);
      v[k] = _mm256_mul_ps(v[k], s);
      v[k + 1] = _mm256_mul_ps(v[k + 1], s);
    }
  }

 private:
  bool e2m1_;
  Fp8Widen fp8_;
  __m256 magnitudes_;
};

template <MxDecodeOp kOp>
void mx_decode_blocks(const uint8_t* scales, const uint8_t* elements, size_t count, Wire wire, float* out, float post) {
  const __m256 p = _mm256_set1_ps(post);
  const MxBlockValues values(wire);
  for (size_t b = 0; b < count; ++b) {
    __m256 v[4];
    values(scales[b], elements + b * values.block_bytes(), v);
    #pragma GCC unroll 4
    for (int k = 0; k < 4; ++k) put<kOp>(out + b * kMxBlock + 8 * k, v[k], p);
  }
}

void mx_decode(const uint8_t* scales, const uint8_t* elements, size_t count, Wire wire, float* out, MxDecodeOp op,
               float post) {
  switch (op) {
    case MxDecodeOp::kStore: return mx_decode_blocks<MxDecodeOp::kStore>(scales, elements, count, wire, out, post);
    case MxDecodeOp::kScale: return mx_decode_blocks<MxDecodeOp::kScale>(scales, elements, count, wire, out, post);
  }
}

// Every rank's block decoded and added in registers: the sum is written once, where decoding rank by
// rank into it wrote and read it back k times.
void mx_sum(const uint8_t* const* scales, const uint8_t* const* elements, size_t k, size_t count, Wire wire,
            float* out) {
  if (k == 0) return;
  const MxBlockValues values(wire);
  for (size_t b = 0; b < count; ++b) {
    __m256 sum[4], v[4];
    values(scales[0][b], elements[0] + b * values.block_bytes(), sum);
    for (size_t r = 1; r < k; ++r) {
      values(scales[r][b], elements[r] + b * values.block_bytes(), v);
      #pragma GCC unroll 4
      for (int j = 0; j < 4; ++j) sum[j] = _mm256_add_ps(sum[j], v[j]);
    }
    #pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) _mm256_storeu_ps(out + b * kMxBlock + 8 * j, sum[j]);
  }
}

// The frames' owner sum (scaled_sum in cpu/frames.cpp) with every rank's values widened, scaled and
// added in registers, 16 elements a step.
void scaled_sum_f32(const void* const* in, const float* scales, size_t k, float* dst, size_t n, Wire w) {
  if (k == 0) return;
  size_t i = 0;
  if (wire_bytes(w) == 1) {
    const Fp8Widen fp8(w);
    for (; i + 16 <= n; i += 16) {
      __m256 lo, hi, sum_lo, sum_hi;
      for (size_t r = 0; r < k; ++r) {
        fp8.values(_mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint8_t*>(in[r]) + i)), lo, hi);
        const __m256 s = _mm256_set1_ps(scales[r]);
        lo = _mm256_mul_ps(lo, s);
        hi = _mm256_mul_ps(hi, s);
        sum_lo = r ? _mm256_add_ps(sum_lo, lo) : lo;
        sum_hi = r ? _mm256_add_ps(sum_hi, hi) : hi;
      }
      _mm256_storeu_ps(dst + i, sum_lo);
      _mm256_storeu_ps(dst + i + 8, sum_hi);
    }
  } else {
    for (; i + 16 <= n; i += 16) {
      __m256 sum_lo, sum_hi;
      for (size_t r = 0; r < k; ++r) {
        const uint16_t* x = static_cast<const uint16_t*>(in[r]) + i;
        const __m256 s = _mm256_set1_ps(scales[r]);
        const __m256 lo = _mm256_mul_ps(widen8(x, w), s), hi = _mm256_mul_ps(widen8(x + 8, w), s);
        sum_lo = r ? _mm256_add_ps(sum_lo, lo) : lo;
        sum_hi = r ? _mm256_add_ps(sum_hi, hi) : hi;
      }
      _mm256_storeu_ps(dst + i, sum_lo);
      _mm256_storeu_ps(dst + i + 8, sum_hi);
    }
  }
  if (i == n) return;
  std::vector<const void*> rest(k);
  for (size_t r = 0; r < k; ++r) rest[r] = static_cast<const uint8_t*>(in[r]) + i * wire_bytes(w);
  scalar_kernels().scaled_sum_f32(rest.data(), scales, k, dst + i, n - i, w);
}

// --- NVFP4 blocks (codec.h, "NVFP4 blocks"): the scalar block kernels of cpu/nvfp4.cpp on 8 lanes, two
// vectors a block.

// Eight blocks' scale codes and reciprocals fl(fl(1 / P) / S) at once, from their amaxes' bits (lanes):
// S = e4m3(clamp(fl(fl(amax / 6) / P), 2^-6, 448)), a normal e4m3 value, so that its bits are the code's
// shifted into place, rebiased.
struct NvScales {
  __m256i codes;
  __m256 reciprocals;
};
inline NvScales nv_scales(__m256i amax, __m256 part, __m256 inverse, const Fp8Lanes& e4m3) {
  const __m256 s = _mm256_min_ps(
      _mm256_max_ps(_mm256_div_ps(_mm256_div_ps(_mm256_castsi256_ps(amax), _mm256_set1_ps(6.0f)), part),
                    _mm256_set1_ps(0x1p-6f)),
      _mm256_set1_ps(448.0f));
  const __m256i codes = e4m3.codes_in_range(s);
  const __m256 scale = _mm256_castsi256_ps(_mm256_add_epi32(_mm256_slli_epi32(codes, 20), _mm256_set1_epi32(120 << 23)));
  return {codes, _mm256_div_ps(inverse, scale)};
}

// Two blocks' 32 values, scaled (v[0..2) the first's, v[2..4) the second's), as their 16 element bytes at
// `out` under their reciprocals r0 and r1, rounded stochastically with `random` (32 words, element order)
// where it is given; counts the values past 7 into `*saturated` (lanes of -1 each) where it is given (only a
// census reads the count).
inline void nv_encode_pair(const __m256* v, __m256 r0, __m256 r1, const Fp8Lanes& e2m1, __m256i* saturated,
                           uint8_t* out, const uint32_t* random = nullptr) {
  const __m256 magnitude = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  __m256i c[4];
  #pragma GCC unroll 4
  for (int k = 0; k < 4; ++k) {
    const __m256 q = _mm256_mul_ps(v[k], k < 2 ? r0 : r1);
    const __m256 a = _mm256_and_ps(q, magnitude);
    if (saturated) {
      *saturated = _mm256_add_epi32(*saturated, _mm256_castps_si256(_mm256_cmp_ps(a, _mm256_set1_ps(7.0f), _CMP_GE_OQ)));
    }
    const __m256i sign = _mm256_slli_epi32(_mm256_srli_epi32(_mm256_castps_si256(q), 31), 3);
    __m256 clamped = _mm256_min_ps(a, _mm256_set1_ps(6.0f));
    if (random) {
      clamped = stochastic_e2m1(clamped, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(random + 8 * k)));
    }
    c[k] = _mm256_or_si256(e2m1.codes_in_range(clamped), sign);
  }
  const __m256i bytes = bytes_of(c);
  // Element 2j in the low nibble of byte j, 2j + 1 in its high nibble.
  const __m256i pairs = _mm256_or_si256(_mm256_and_si256(bytes, _mm256_set1_epi16(0x000F)),
                                        _mm256_and_si256(_mm256_srli_epi16(bytes, 4), _mm256_set1_epi16(0x00F0)));
  const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi16(pairs, pairs), 0x08);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(out), _mm256_castsi256_si128(packed));
}

// Whole blocks, eight at a time: their maxima, scale codes and reciprocals as lanes of one vector, then
// the elements two blocks a store; a block that is not finite is written over after; the rest (fewer than
// eight) by the scalar kernel.
void nv_encode_f32(const float* src, size_t count, float scale, float part, float inverse, uint8_t* scales,
                   uint8_t* elements, Census* census, const Dither* dither, uint64_t first) {
  constexpr size_t kBlockBytes = kNvBlock / 2;
  const Fp8Lanes e4m3(Wire::kE4m3), e2m1(Wire::kMxfp4);
  const __m256 s = _mm256_set1_ps(scale), p = _mm256_set1_ps(part), inv = _mm256_set1_ps(inverse);
  const __m256i magnitude = _mm256_set1_epi32(0x7FFFFFFF), finite_top = _mm256_set1_epi32(0x7F7FFFFF);
  __m256i saturated = _mm256_setzero_si256();
  uint64_t nonfinite = 0;
  size_t b = 0;
  std::optional<BlockRandomBits128> philox;
  if (dither) philox.emplace(*dither);
  // The per-lane saturation counters hold 2^31 - 1 each: at most 2^26 blocks between their sums.
  auto drain = [&] {
    alignas(32) int32_t lanes[8];
    _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), saturated);
    for (int32_t lane : lanes) census->saturated += uint64_t(uint32_t(-lane));
    saturated = _mm256_setzero_si256();
  };
  // Block b + j's values, scaled, into v[0..2).
  auto load = [&](size_t block, __m256* v) {
    v[0] = _mm256_mul_ps(_mm256_loadu_ps(src + block * kNvBlock), s);
    v[1] = _mm256_mul_ps(_mm256_loadu_ps(src + block * kNvBlock + 8), s);
  };
  for (; b + 8 <= count; b += 8) {
    __m256 v[4];
    __m256i m[8];
    #pragma GCC unroll 8
    for (int j = 0; j < 8; ++j) {
      load(b + j, v);
      m[j] = _mm256_max_epu32(_mm256_and_si256(_mm256_castps_si256(v[0]), magnitude),
                              _mm256_and_si256(_mm256_castps_si256(v[1]), magnitude));
    }
    const __m256i amax = lane_maxima(m);
    const NvScales lanes = nv_scales(amax, p, inv, e4m3);
    const __m128i words = _mm_packus_epi32(_mm256_castsi256_si128(lanes.codes), _mm256_extracti128_si256(lanes.codes, 1));
    _mm_storel_epi64(reinterpret_cast<__m128i*>(scales + b), _mm_packus_epi16(words, words));
    alignas(32) uint32_t random[8 * kNvBlock];
    if (philox) (*philox)(first + b * kNvBlock, random);
    #pragma GCC unroll 4
    for (int j = 0; j < 8; j += 2) {
      load(b + j, v);  // again, from L1
      load(b + j + 1, v + 2);
      const __m256 r0 = _mm256_permutevar8x32_ps(lanes.reciprocals, _mm256_set1_epi32(j));
      const __m256 r1 = _mm256_permutevar8x32_ps(lanes.reciprocals, _mm256_set1_epi32(j + 1));
      nv_encode_pair(v, r0, r1, e2m1, census ? &saturated : nullptr, elements + (b + j) * kBlockBytes,
                     dither ? random + j * kNvBlock : nullptr);
    }
    const int bad = _mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpgt_epi32(amax, finite_top)));
    for (int j = 0; bad >> j; ++j) {
      if (!(bad >> j & 1)) continue;
      load(b + j, v);
      for (int k = 0; k < 2; ++k) {
        const __m256i a = _mm256_and_si256(_mm256_castps_si256(v[k]), magnitude);
        nonfinite += uint64_t(popcount_lanes(_mm256_cmpgt_epi32(a, finite_top)));
        // What nv_encode_pair counted of this block as saturated is taken back: the scalar kernel counts
        // only its values that are not finite.
        const __m256 q = _mm256_mul_ps(v[k], _mm256_permutevar8x32_ps(lanes.reciprocals, _mm256_set1_epi32(j)));
        saturated = _mm256_sub_epi32(saturated, _mm256_castps_si256(_mm256_cmp_ps(
            _mm256_and_ps(q, _mm256_castsi256_ps(magnitude)), _mm256_set1_ps(7.0f), _CMP_GE_OQ)));
      }
      __builtin_memset(elements + (b + j) * kBlockBytes, 0, kBlockBytes);
      scales[b + j] = 0x7F;
    }
    if (census && (b / 8 + 1) % (size_t(1) << 23) == 0) drain();
  }
  if (census) {
    drain();
    census->nonfinite += nonfinite;
  }
  scalar_kernels().nv_encode_f32(src + b * kNvBlock, count - b, scale, part, inverse, scales + b,
                                 elements + b * kBlockBytes, census, dither, first + b * kNvBlock);
}

// The 16 values of a block under the scale fl(P * S) (decode_block in cpu/nvfp4.cpp), into v[0..2); `e4m3`
// the scale codes' values (fp8_values).
inline void nv_block_values(uint8_t code, const uint8_t* elements, float part, const float* e4m3, __m256 magnitudes,
                            __m256* v) {
  const __m256 s = _mm256_set1_ps(part * e4m3[code]);
  const __m128i bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(elements));
  const __m128i low = _mm_and_si128(bytes, _mm_set1_epi8(0x0F));
  const __m128i high = _mm_and_si128(_mm_srli_epi16(bytes, 4), _mm_set1_epi8(0x0F));
  const __m128i codes = _mm_unpacklo_epi8(low, high);
  #pragma GCC unroll 2
  for (int k = 0; k < 2; ++k) {
    const __m256i c = _mm256_cvtepu8_epi32(k ? _mm_srli_si128(codes, 8) : codes);
    const __m256 magnitude = _mm256_permutevar8x32_ps(magnitudes, c);
    const __m256 value = _mm256_or_ps(magnitude, _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_srli_epi32(c, 3), 31)));
    v[k] = _mm256_mul_ps(value, s);
  }
}

void nv_decode(const uint8_t* scales, const uint8_t* elements, size_t count, float part, float* out, MxDecodeOp op,
               float post) {
  const __m256 magnitudes = _mm256_loadu_ps(kE2m1Values), p = _mm256_set1_ps(post);
  const float* e4m3 = fp8_values(Wire::kE4m3);
  for (size_t b = 0; b < count; ++b) {
    __m256 v[2];
    nv_block_values(scales[b], elements + b * (kNvBlock / 2), part, e4m3, magnitudes, v);
    for (int k = 0; k < 2; ++k) {
      if (op == MxDecodeOp::kScale) v[k] = _mm256_mul_ps(v[k], p);
      _mm256_storeu_ps(out + b * kNvBlock + 8 * k, v[k]);
    }
  }
}

// Every rank's block decoded and added in registers, as mx_sum, and the sums' largest finite magnitude
// kept as lanes of bits (a value that is not finite counts as 0).
float nv_sum(const uint8_t* const* scales, const uint8_t* const* elements, const float* parts, size_t k, size_t count,
             float* out) {
  if (k == 0) return 0.0f;
  const __m256 magnitudes = _mm256_loadu_ps(kE2m1Values);
  const float* e4m3 = fp8_values(Wire::kE4m3);
  const __m256i magnitude = _mm256_set1_epi32(0x7FFFFFFF), finite_top = _mm256_set1_epi32(0x7F7FFFFF);
  __m256i amax = _mm256_setzero_si256();
  for (size_t b = 0; b < count; ++b) {
    __m256 sum[2], v[2];
    nv_block_values(scales[0][b], elements[0] + b * (kNvBlock / 2), parts[0], e4m3, magnitudes, sum);
    for (size_t r = 1; r < k; ++r) {
      nv_block_values(scales[r][b], elements[r] + b * (kNvBlock / 2), parts[r], e4m3, magnitudes, v);
      sum[0] = _mm256_add_ps(sum[0], v[0]);
      sum[1] = _mm256_add_ps(sum[1], v[1]);
    }
    for (int j = 0; j < 2; ++j) {
      _mm256_storeu_ps(out + b * kNvBlock + 8 * j, sum[j]);
      const __m256i a = _mm256_and_si256(_mm256_castps_si256(sum[j]), magnitude);
      amax = _mm256_max_epu32(amax, _mm256_andnot_si256(_mm256_cmpgt_epi32(a, finite_top), a));
    }
  }
  amax = _mm256_max_epu32(amax, _mm256_permute2x128_si256(amax, amax, 1));
  amax = _mm256_max_epu32(amax, _mm256_shuffle_epi32(amax, 0x4E));
  amax = _mm256_max_epu32(amax, _mm256_shuffle_epi32(amax, 0xB1));
  // A builtin, not kernels.h's inline float_of (as in cpu/avx512.cpp's nv_sum).
  return __builtin_bit_cast(float, uint32_t(_mm256_cvtsi256_si32(amax)));
}

// --- The block rotation (codec.h, rotate): cpu/rotation.cpp's butterflies on 8 lanes, a block two vectors.

// One butterfly stage at a stride h < 8 inside a vector: p holds each lane's partner (lane j ^ h); the
// lower lane of a pair gets v + p = a + b, the upper p - v = a - b, the adds of the scalar kernel.
template <int kBlend>
inline __m256 butterfly(__m256 v, __m256 p) {
  return _mm256_blend_ps(_mm256_add_ps(v, p), _mm256_sub_ps(p, v), kBlend);
}

void rotate_f32(const float* src, float* dst, size_t blocks, uint16_t signs, bool forward) {
  alignas(32) uint32_t bits[kRotationBlock];
  for (size_t j = 0; j < kRotationBlock; ++j) bits[j] = signs >> j & 1 ? 0x80000000u : 0u;
  const __m256 d0 = _mm256_load_ps(reinterpret_cast<const float*>(bits));
  const __m256 d1 = _mm256_load_ps(reinterpret_cast<const float*>(bits + 8));
  const __m256 quarter = _mm256_set1_ps(0.25f);
  for (size_t b = 0; b < blocks; ++b) {
    __m256 x[2] = {_mm256_loadu_ps(src + b * kRotationBlock), _mm256_loadu_ps(src + b * kRotationBlock + 8)};
    if (forward) x[0] = _mm256_xor_ps(x[0], d0), x[1] = _mm256_xor_ps(x[1], d1);
    for (__m256& v : x) {
      v = butterfly<0xAA>(v, _mm256_permute_ps(v, 0xB1));            // h = 1
      v = butterfly<0xCC>(v, _mm256_permute_ps(v, 0x4E));            // h = 2
      v = butterfly<0xF0>(v, _mm256_permute2f128_ps(v, v, 0x01));    // h = 4
    }
    const __m256 low = _mm256_mul_ps(_mm256_add_ps(x[0], x[1]), quarter);  // h = 8
    const __m256 high = _mm256_mul_ps(_mm256_sub_ps(x[0], x[1]), quarter);
    _mm256_storeu_ps(dst + b * kRotationBlock, forward ? low : _mm256_xor_ps(low, d0));
    _mm256_storeu_ps(dst + b * kRotationBlock + 8, forward ? high : _mm256_xor_ps(high, d1));
  }
}

}  // namespace

const CpuKernels* avx2_f16c_kernels() {
  static const CpuKernels kernels{cast_f32, cast_f64, restore_f32, restore_f64, add,
                                  cast_add_f32, sum, sum_f32, amax_f32, cast8_f32, restore8_f32,
                                  scaled_sum_f32, mx_encode_f32, mx_decode, mx_sum, nv_encode_f32, nv_decode,
                                  nv_sum, rotate_f32};
  return &kernels;
}

}  // namespace cnccl::compress::detail

#else

namespace cnccl::compress::detail {
const CpuKernels* avx2_f16c_kernels() { return nullptr; }
}  // namespace cnccl::compress::detail

#endif

// AVX2 + F16C kernels. This file alone is compiled with -mavx2 -mf16c; cpu_dispatch.cpp calls
// it only after checking the processor. Loads and stores are unaligned, tails go to the scalar
// conversions, so any pointer and length is accepted.
#include "compress/cpu_kernels.h"

#if defined(__x86_64__)
#include <immintrin.h>

#include <algorithm>

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

// to_fp8 (cpu_frames.cpp) on 8 lanes: the normal and subnormal roundings both computed, then chosen.
void cast8_f32(const float* src, uint8_t* dst, size_t n, float scale, Wire w) {
  const int m = w == Wire::kE4m3 ? 3 : 2, bias = w == Wire::kE4m3 ? 7 : 15;
  const int overflow = w == Wire::kE4m3 ? 0x7F : 0x7C, shift = 23 - m;
  const __m256 s = _mm256_set1_ps(scale);
  const __m256i magnitude = _mm256_set1_epi32(0x7FFFFFFF), inf = _mm256_set1_epi32(0x7F800000);
  const __m256i min_normal = _mm256_set1_epi32((128 - bias) << 23);
  const __m256i big_bits = _mm256_set1_epi32((128 - bias - m + 23) << 23);
  const __m256i half_minus_one = _mm256_set1_epi32((1 << (shift - 1)) - 1), one = _mm256_set1_epi32(1);
  const __m256i rebias = _mm256_set1_epi32((127 - bias) << m), top = _mm256_set1_epi32(overflow);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i x = _mm256_castps_si256(_mm256_mul_ps(_mm256_loadu_ps(src + i), s));
    const __m256i sign = _mm256_and_si256(_mm256_srli_epi32(x, 24), _mm256_set1_epi32(0x80));
    const __m256i ax = _mm256_and_si256(x, magnitude);
    const __m256i subnormal = _mm256_sub_epi32(
        _mm256_castps_si256(_mm256_add_ps(_mm256_castsi256_ps(ax), _mm256_castsi256_ps(big_bits))), big_bits);
    const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(ax, shift), one);
    const __m256i rounded = _mm256_add_epi32(ax, _mm256_add_epi32(half_minus_one, odd));
    const __m256i normal = _mm256_min_epi32(_mm256_sub_epi32(_mm256_srli_epi32(rounded, shift), rebias), top);
    __m256i code = _mm256_blendv_epi8(normal, subnormal, _mm256_cmpgt_epi32(min_normal, ax));
    code = _mm256_blendv_epi8(code, _mm256_set1_epi32(0x7F), _mm256_cmpgt_epi32(ax, inf));
    code = _mm256_or_si256(code, sign);
    const __m128i words = _mm_packus_epi32(_mm256_castsi256_si128(code), _mm256_extracti128_si256(code, 1));
    _mm_storel_epi64(reinterpret_cast<__m128i*>(dst + i), _mm_packus_epi16(words, words));
  }
  for (; i < n; ++i) dst[i] = to_fp8(src[i] * scale, w);
}

// Each byte's value looked up in the format's table of 256, eight at a time.
void restore8_f32(const uint8_t* src, float* dst, size_t n, float scale, Wire w) {
  const float* values = fp8_values(w);
  const __m256 s = _mm256_set1_ps(scale);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i codes = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(src + i)));
    _mm256_storeu_ps(dst + i, _mm256_mul_ps(_mm256_i32gather_ps(values, codes, 4), s));
  }
  for (; i < n; ++i) dst[i] = values[src[i]] * scale;
}

}  // namespace

const CpuKernels* avx2_f16c_kernels() {
  static const CpuKernels kernels{cast_f32, cast_f64, restore_f32, restore_f64, add,
                                  cast_add_f32, sum, sum_f32, amax_f32, cast8_f32, restore8_f32};
  return &kernels;
}

}  // namespace cnccl::compress::detail

#else

namespace cnccl::compress::detail {
const CpuKernels* avx2_f16c_kernels() { return nullptr; }
}  // namespace cnccl::compress::detail

#endif

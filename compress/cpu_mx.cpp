// The CPU kernels of MX blocks (codec.h, mx_encode): scalar loops over one block of 32 at a time. The
// encoding's largest cost is the two passes over a block (its amax, then its elements), both in L1.
#include <algorithm>
#include <cmath>

#if defined(__x86_64__)
#include <xmmintrin.h>
#endif

#include "compress/cpu_kernels.h"

namespace cnccl::compress {
namespace {

using detail::bits_of;
using detail::float_of;

struct MxFormat {
  int emax;           // the exponent of the element type's largest binade
  float max;          // its largest magnitude
  uint32_t fraction;  // the significand bits of max past its leading one
  Wire element;       // the 8-bit format of the elements (kMxfp4: e2m1, coded here)
};

MxFormat format(Wire wire) {
  return {mx_emax(wire), mx_largest(wire), mx_largest_fraction(wire),
          wire == Wire::kMxfp8 ? Wire::kE4m3 : wire == Wire::kMxfp8E5m2 ? Wire::kE5m2 : Wire::kMxfp4};
}

size_t blocks(size_t n) { return (n + kMxBlock - 1) / kMxBlock; }

// Blocks scaled by 2^-127 decode through an fp32 subnormal, and encode fp32 subnormals: neither may
// flush to zero. A group's threads take its creator's floating-point settings, which may flush
// (torch.set_flush_denormal): the kernels clear FTZ and DAZ for their call.
class GradualUnderflow {
 public:
#if defined(__x86_64__)
  GradualUnderflow() : saved_(_mm_getcsr()) { _mm_setcsr(saved_ & ~0x8040u); }
  ~GradualUnderflow() { _mm_setcsr(saved_); }

 private:
  unsigned saved_;
#else
  GradualUnderflow() {}
#endif
};

size_t element_bytes(size_t n, Wire wire) { return wire == Wire::kMxfp4 ? (n + 1) / 2 : n; }

// The scale 2^X of a block's code X + 127: 0xFF is NaN (a non-finite block), 0 the subnormal 2^-127.
float scale_of(uint8_t code) {
  if (code == 0xFF) return NAN;
  return code ? float_of(uint32_t(code) << 23) : 0x1p-127f;
}

// e2m1's codes of the magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6, rounding a in [0, 6] to nearest even:
// a tie goes to the even code (0.25 to 0, 0.75 to 1, 1.25 to 1, 1.75 to 2, 2.5 to 2, 3.5 to 4, 5 to 4).
uint8_t e2m1_code(float a) {
  return uint8_t((a > 0.25f) + (a >= 0.75f) + (a > 1.25f) + (a >= 1.75f) + (a > 2.5f) + (a >= 3.5f) + (a > 5.0f));
}

const float kE2m1Values[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                               -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

// One block's m <= 32 values v, already scaled: its scale code, and its elements written at `out`
// (for MXFP4, m / 2 bytes and a low nibble for an odd m).
uint8_t encode_block(const float* v, size_t m, const MxFormat& f, MxScale rule, uint8_t* out, Census* census) {
  uint32_t amax = 0;
  size_t nonfinite = 0;
  for (size_t j = 0; j < m; ++j) {
    const uint32_t a = bits_of(v[j]) & 0x7FFFFFFFu;
    amax = std::max(amax, a);
    nonfinite += a >= 0x7F800000u;
  }
  const size_t bytes = f.element == Wire::kMxfp4 ? (m + 1) / 2 : m;
  if (nonfinite) {
    std::fill(out, out + bytes, uint8_t(0));
    if (census) census->nonfinite += nonfinite;
    return 0xFF;
  }
  // floor(log2(amax)) is amax's exponent field less the bias; a subnormal or zero amax gives -127,
  // which the clamp keeps where the true floor (below -127) would have gone. RCEIL's increment comes
  // before the clamp: below it, the clamp's -127 already holds L * 2^X >= amax.
  const int rceil = rule == MxScale::kRceil && (amax & 0x7FFFFFu) > f.fraction;
  const int x = std::clamp(int(amax >> 23) - 127 - f.emax + rceil, -127, 127);
  const float inverse = float_of(uint32_t(127 - x) << 23);  // 2^-X: X <= 128 - emax keeps it normal
  size_t saturated = 0;
  if (f.element == Wire::kMxfp4) {
    std::fill(out, out + bytes, uint8_t(0));
    for (size_t j = 0; j < m; ++j) {
      const float q = v[j] * inverse;
      const float a = std::fabs(q);
      saturated += a > f.max;
      const uint8_t code = uint8_t((std::signbit(q) ? 8 : 0) | e2m1_code(std::min(a, f.max)));
      out[j / 2] |= uint8_t(j % 2 ? code << 4 : code);
    }
  } else {
    for (size_t j = 0; j < m; ++j) {
      const float q = v[j] * inverse;
      saturated += std::fabs(q) > f.max;
      out[j] = detail::to_fp8(std::clamp(q, -f.max, f.max), f.element);
    }
  }
  if (census) census->saturated += saturated;
  return uint8_t(x + 127);
}

// The value element j of a block decodes to: its code's value times the block's scale.
float element_value(const uint8_t* elements, size_t j, float scale, Wire wire) {
  if (wire == Wire::kMxfp4) return kE2m1Values[(elements[j / 2] >> (j % 2 * 4)) & 0xF] * scale;
  return detail::fp8_values(format(wire).element)[elements[j]] * scale;
}

// Counts into this thread's census, and samples its stride (set only with a census).
template <typename T>
void encode(const T* src, size_t n, size_t count, float scale, Wire wire, MxScale rule, uint8_t* dst,
            const detail::CensusSink& sink) {
  const MxFormat f = format(wire);
  uint8_t* scales = dst;
  uint8_t* elements = dst + blocks(count);
  float v[kMxBlock];
  for (size_t b = 0, first = 0; first < count; ++b, first += kMxBlock) {
    const size_t m = std::min(kMxBlock, count - first), given = first < n ? std::min(m, n - first) : 0;
    // The product formed as cast() forms it: in the source's precision, then to fp32.
    for (size_t j = 0; j < given; ++j) v[j] = static_cast<float>(src[first + j] * static_cast<T>(scale));
    std::fill(v + given, v + m, 0.0f);
    uint8_t* out = elements + element_bytes(first, wire);
    scales[b] = encode_block(v, m, f, rule, out, sink.census);
    if (!sink.stride) continue;
    for (size_t i = (first + sink.stride - 1) / sink.stride * sink.stride; i < first + given; i += sink.stride) {
      detail::sample(v[i - first], element_value(out, i - first, scale_of(scales[b]), wire), *sink.census);
    }
  }
}

// out[0..m) = the first m decoded values of block b of the run at `in` (n elements).
void decode_block(const uint8_t* in, size_t n, size_t b, size_t m, Wire wire, float* out) {
  const float s = scale_of(in[b]);
  const uint8_t* elements = in + blocks(n);
  const size_t first = b * kMxBlock;
  if (wire == Wire::kMxfp4) {
    const uint8_t* bytes = elements + first / 2;
    for (size_t j = 0; j < m; ++j) out[j] = kE2m1Values[(bytes[j / 2] >> (j % 2 * 4)) & 0xF] * s;
    return;
  }
  const float* value = detail::fp8_values(format(wire).element);
  for (size_t j = 0; j < m; ++j) out[j] = value[elements[first + j]] * s;
}

template <typename T>
void restore(const uint8_t* src, size_t count, T* dst, size_t n, float post, Wire wire) {
  float v[kMxBlock];
  const T p = static_cast<T>(post);
  for (size_t b = 0, first = 0; first < n; ++b, first += kMxBlock) {
    const size_t m = std::min(kMxBlock, n - first);
    decode_block(src, count, b, m, wire, v);
    for (size_t j = 0; j < m; ++j) dst[first + j] = static_cast<T>(v[j]) * p;
  }
}

}  // namespace

size_t mx_bytes(size_t n, Wire wire) { return blocks(n) + element_bytes(n, wire); }

const char* mx_scale_name(MxScale rule) { return rule == MxScale::kFloor ? "floor" : "rceil"; }

void mx_encode(const float* src, size_t n, size_t count, float scale, Wire wire, MxScale rule, uint8_t* dst) {
  const GradualUnderflow exact;
  encode(src, n, count, scale, wire, rule, dst, detail::census_sink());
}
void mx_encode(const double* src, size_t n, size_t count, float scale, Wire wire, MxScale rule, uint8_t* dst) {
  const GradualUnderflow exact;
  encode(src, n, count, scale, wire, rule, dst, detail::census_sink());
}

void mx_sum(const uint8_t* const* in, size_t k, float* dst, size_t n, Wire wire) {
  const GradualUnderflow exact;
  float v[kMxBlock];
  for (size_t b = 0, first = 0; first < n; ++b, first += kMxBlock) {
    const size_t m = std::min(kMxBlock, n - first);
    float* acc = dst + first;
    decode_block(in[0], n, b, m, wire, acc);
    for (size_t r = 1; r < k; ++r) {
      decode_block(in[r], n, b, m, wire, v);
      for (size_t j = 0; j < m; ++j) acc[j] += v[j];
    }
  }
}

void mx_restore(const uint8_t* src, size_t count, float* dst, size_t n, float post, Wire wire) {
  const GradualUnderflow exact;
  restore(src, count, dst, n, post, wire);
}
void mx_restore(const uint8_t* src, size_t count, double* dst, size_t n, float post, Wire wire) {
  const GradualUnderflow exact;
  restore(src, count, dst, n, post, wire);
}

}  // namespace cnccl::compress

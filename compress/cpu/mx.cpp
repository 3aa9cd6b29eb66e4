// The CPU kernels of MX blocks (codec.h, mx_encode). Runs of whole blocks go to the dispatched block
// kernels (the scalar ones here, which define the encoding; vector forms in cpu/avx2.cpp, tested bit
// for bit against them); a run's short or zero-padded last block, fp64 sources' scaling and the census's
// samples are handled here, one block at a time.
#include <algorithm>
#include <cmath>
#include <optional>
#include <vector>

#include "compress/cpu/kernels.h"
#include "compress/formats.h"
#include "compress/stochastic.h"

namespace cnccl::compress {
namespace detail {

const float kE2m1Values[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                               -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

MxBlockFormat mx_block_format(Wire wire) {
  return {mx_emax(wire), mx_largest(wire), mx_largest_fraction(wire),
          wire == Wire::kMxfp8 ? Wire::kE4m3 : wire == Wire::kMxfp8E5m2 ? Wire::kE5m2 : Wire::kMxfp4};
}

}  // namespace detail

namespace {

using detail::bits_of;
using detail::float_of;
using detail::MxBlockFormat;
using detail::MxDecodeOp;
using detail::Rounding;
using formats::mx_blocks;
using formats::mx_element_bytes;

float scale_of(uint8_t code) { return formats::mx_scale_value(code); }

// One block's m <= 32 values v, already scaled: its scale code, and its elements written at `out`
// (for MXFP4, m / 2 bytes and a low nibble for an odd m). With a dither, element j takes the random
// bits of index `index + j`.
uint8_t encode_block(const float* v, size_t m, const MxBlockFormat& f, MxScale rule, uint8_t* out, Census* census,
                     const Dither* dither = nullptr, uint64_t index = 0) {
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
  const int x = formats::mx_exponent(amax, f.emax, f.fraction, rule);
  const float inverse = float_of(uint32_t(127 - x) << 23);  // 2^-X: X <= 128 - emax keeps it normal
  size_t saturated = 0;
  std::optional<BlockRandomBits> random;
  if (dither) random.emplace(*dither);
  if (f.element == Wire::kMxfp4) {
    std::fill(out, out + bytes, uint8_t(0));
    for (size_t j = 0; j < m; ++j) {
      const float q = v[j] * inverse;
      const float a = std::fabs(q);
      saturated += a > f.max;
      const float clamped = std::min(a, f.max);
      const float on_grid = random ? stochastic_e2m1_value(clamped, (*random)(index + j)) : clamped;
      const uint8_t code = uint8_t((std::signbit(q) ? 8 : 0) | formats::e2m1_code(on_grid));
      out[j / 2] |= uint8_t(j % 2 ? code << 4 : code);
    }
  } else {
    for (size_t j = 0; j < m; ++j) {
      const float q = v[j] * inverse;
      saturated += std::fabs(q) > f.max;
      const float clamped = std::clamp(q, -f.max, f.max);
      // On the grid already, the conversion is exact: its rounding to nearest does nothing.
      out[j] = detail::to_fp8(
          random ? std::copysign(stochastic_fp8_value(std::fabs(clamped), (*random)(index + j), f.element), q)
                 : clamped,
          f.element);
    }
  }
  if (census) census->saturated += saturated;
  return uint8_t(x + 127);
}

// The value of element j of a block at `elements` (its first byte) with the scale s.
float element_value(const uint8_t* elements, size_t j, float s, Wire wire) {
  if (wire == Wire::kMxfp4) return detail::kE2m1Values[(elements[j / 2] >> (j % 2 * 4)) & 0xF] * s;
  return detail::fp8_values(detail::mx_block_format(wire).element)[elements[j]] * s;
}

// out[0..m) = the first m values of the block with scale code `code` and elements at `elements`,
// times `post` where op is kScale.
void decode_block(uint8_t code, const uint8_t* elements, size_t m, Wire wire, float* out, MxDecodeOp op,
                  float post) {
  const float s = scale_of(code);
  for (size_t j = 0; j < m; ++j) {
    const float v = element_value(elements, j, s, wire);
    out[j] = op == MxDecodeOp::kScale ? v * post : v;
  }
}

template <typename Byte>
Byte* block_elements(Byte* elements, size_t b, Wire wire) {
  return elements + mx_element_bytes(b * kMxBlock, wire);
}

// out[0..m) = the sum in rank order of the first m values of block b of k ranks' runs (rank r's scales
// and elements at scales[r], elements[r]).
void sum_block(const uint8_t* const* scales, const uint8_t* const* elements, size_t k, size_t b, size_t m, Wire wire,
               float* out) {
  for (size_t r = 0; r < k; ++r) {
    const float s = scale_of(scales[r][b]);
    const uint8_t* e = block_elements(elements[r], b, wire);
    for (size_t j = 0; j < m; ++j) {
      const float v = element_value(e, j, s, wire);
      out[j] = r ? out[j] + v : v;
    }
  }
}

// Counts into this thread's census, and samples its stride (set only with a census).
// The run's scales and elements may lie apart (a piece of a longer run: mx_sum_encode).
template <typename T>
void encode(const T* src, size_t n, size_t count, float scale, Wire wire, MxScale rule, uint8_t* scales,
            uint8_t* elements, const detail::CensusSink& sink, const Rounding& rounding = {}) {
  const MxBlockFormat f = detail::mx_block_format(wire);
  const detail::CpuKernels& kernels = detail::active_kernels();
  size_t b = 0;
  if constexpr (std::is_same_v<T, float>) {
    // The whole blocks of given values go to the block kernel at once.
    b = std::min(n, count) / kMxBlock;
    kernels.mx_encode_f32(src, b, scale, f, rule, scales, elements, sink.census, rounding.dither, rounding.first);
  }
  float v[kMxBlock];
  for (; b * kMxBlock < count; ++b) {
    const size_t first = b * kMxBlock;
    const size_t m = std::min(kMxBlock, count - first), given = first < n ? std::min(m, n - first) : 0;
    // The product formed as cast() forms it: in the source's precision, then to fp32.
    for (size_t j = 0; j < given; ++j) v[j] = static_cast<float>(src[first + j] * static_cast<T>(scale));
    std::fill(v + given, v + m, 0.0f);
    if (rounding.dither) {
      scales[b] = encode_block(v, m, f, rule, block_elements(elements, b, wire), sink.census, rounding.dither,
                               rounding.first + first);
    } else if (m == kMxBlock) {
      kernels.mx_encode_f32(v, 1, 1.0f, f, rule, scales + b, block_elements(elements, b, wire), sink.census, nullptr, 0);
    } else {
      scales[b] = encode_block(v, m, f, rule, block_elements(elements, b, wire), sink.census);
    }
  }
  if (!sink.stride) return;
  for (size_t i = 0; i < std::min(n, count); i += sink.stride) {
    const size_t block = i / kMxBlock;
    detail::sample(static_cast<float>(src[i] * static_cast<T>(scale)),
                   element_value(block_elements(elements, block, wire), i % kMxBlock, scale_of(scales[block]), wire),
                   *sink.census);
  }
}

// out[0..n) (op) the first n values of the run of `count` at `in`: whole blocks through the block
// kernel, a short last one here.
void decode(const uint8_t* in, size_t count, size_t n, Wire wire, float* out, MxDecodeOp op, float post) {
  const uint8_t* scales = in;
  const uint8_t* elements = in + mx_blocks(count);
  const size_t whole = n / kMxBlock;
  detail::active_kernels().mx_decode(scales, elements, whole, wire, out, op, post);
  if (whole * kMxBlock < n) {
    decode_block(scales[whole], block_elements(elements, whole, wire), n - whole * kMxBlock, wire,
                 out + whole * kMxBlock, op, post);
  }
}

}  // namespace

namespace detail {

void scalar_mx_encode_f32(const float* src, size_t count, float scale, const MxBlockFormat& f, MxScale rule,
                          uint8_t* scales, uint8_t* elements, Census* census, const Dither* dither, uint64_t first) {
  float v[kMxBlock];
  const size_t block_bytes = f.element == Wire::kMxfp4 ? kMxBlock / 2 : kMxBlock;
  for (size_t b = 0; b < count; ++b) {
    for (size_t j = 0; j < kMxBlock; ++j) v[j] = src[b * kMxBlock + j] * scale;
    scales[b] = encode_block(v, kMxBlock, f, rule, elements + b * block_bytes, census, dither, first + b * kMxBlock);
  }
}

void scalar_mx_decode(const uint8_t* scales, const uint8_t* elements, size_t count, Wire wire, float* out,
                      MxDecodeOp op, float post) {
  for (size_t b = 0; b < count; ++b) {
    decode_block(scales[b], block_elements(elements, b, wire), kMxBlock, wire, out + b * kMxBlock, op, post);
  }
}

void scalar_mx_sum(const uint8_t* const* scales, const uint8_t* const* elements, size_t k, size_t count, Wire wire,
                   float* out) {
  for (size_t b = 0; b < count; ++b) sum_block(scales, elements, k, b, kMxBlock, wire, out + b * kMxBlock);
}

}  // namespace detail

const char* mx_scale_name(MxScale rule) { return rule == MxScale::kFloor ? "floor" : "rceil"; }

size_t mx_bytes(size_t n, Wire wire) { return mx_blocks(n) + mx_element_bytes(n, wire); }

void mx_encode(const float* src, size_t n, size_t count, float scale, Wire wire, MxScale rule, uint8_t* dst) {
  const GradualUnderflow exact;
  encode(src, n, count, scale, wire, rule, dst, dst + mx_blocks(count), detail::census_sink());
}
void mx_encode(const double* src, size_t n, size_t count, float scale, Wire wire, MxScale rule, uint8_t* dst) {
  const GradualUnderflow exact;
  encode(src, n, count, scale, wire, rule, dst, dst + mx_blocks(count), detail::census_sink());
}

void mx_sum(const uint8_t* const* in, size_t k, float* dst, size_t n, Wire wire) {
  const GradualUnderflow exact;
  std::vector<const uint8_t*> scales(k), elements(k);
  for (size_t r = 0; r < k; ++r) {
    scales[r] = in[r];
    elements[r] = in[r] + mx_blocks(n);
  }
  const size_t whole = n / kMxBlock;
  detail::active_kernels().mx_sum(scales.data(), elements.data(), k, whole, wire, dst);
  if (whole * kMxBlock < n) {
    sum_block(scales.data(), elements.data(), k, whole, n - whole * kMxBlock, wire, dst + whole * kMxBlock);
  }
}

namespace {

void sum_encode(const uint8_t* const* in, size_t k, size_t n, Wire wire, MxScale rule, uint8_t* dst,
                const Rounding& rounding) {
  const GradualUnderflow exact;
  // A piece at a time through a sum that stays in L1; the census counts, but takes no samples: the
  // sums are not a rank's contribution.
  constexpr size_t kPiece = 64 * kMxBlock;
  float sums[kPiece];
  const detail::CensusSink counts{detail::census_sink().census, 0};
  std::vector<const uint8_t*> scales(k), elements(k);
  for (size_t first = 0; first < n; first += kPiece) {
    const size_t m = std::min(kPiece, n - first), b = first / kMxBlock;
    for (size_t r = 0; r < k; ++r) {
      scales[r] = in[r] + b;
      elements[r] = in[r] + mx_blocks(n) + mx_element_bytes(first, wire);
    }
    const size_t whole = m / kMxBlock;
    detail::active_kernels().mx_sum(scales.data(), elements.data(), k, whole, wire, sums);
    if (whole * kMxBlock < m) {
      sum_block(scales.data(), elements.data(), k, whole, m - whole * kMxBlock, wire, sums + whole * kMxBlock);
    }
    encode(sums, m, m, 1.0f, wire, rule, dst + b, dst + mx_blocks(n) + mx_element_bytes(first, wire), counts,
           Rounding{rounding.dither, rounding.first + first});
  }
}

}  // namespace

void mx_sum_encode(const uint8_t* const* in, size_t k, size_t n, Wire wire, MxScale rule, uint8_t* dst) {
  sum_encode(in, k, n, wire, rule, dst, Rounding{});
}
void mx_sum_encode(const uint8_t* const* in, size_t k, size_t n, Wire wire, MxScale rule, uint8_t* dst,
                   const Dither& dither, uint64_t first) {
  sum_encode(in, k, n, wire, rule, dst, Rounding{&dither, first});
}

void mx_encode(const float* src, size_t n, size_t count, float scale, Wire wire, MxScale rule, uint8_t* dst,
               const Dither& dither, uint64_t first) {
  const GradualUnderflow exact;
  encode(src, n, count, scale, wire, rule, dst, dst + mx_blocks(count), detail::census_sink(),
         Rounding{&dither, first});
}
void mx_encode(const double* src, size_t n, size_t count, float scale, Wire wire, MxScale rule, uint8_t* dst,
               const Dither& dither, uint64_t first) {
  const GradualUnderflow exact;
  encode(src, n, count, scale, wire, rule, dst, dst + mx_blocks(count), detail::census_sink(),
         Rounding{&dither, first});
}

void mx_restore(const uint8_t* src, size_t count, float* dst, size_t n, float post, Wire wire) {
  const GradualUnderflow exact;
  decode(src, count, n, wire, dst, MxDecodeOp::kScale, post);
}
void mx_restore(const uint8_t* src, size_t count, double* dst, size_t n, float post, Wire wire) {
  const GradualUnderflow exact;
  // Decoded in pieces to fp32 (exact), then T(v) * T(post) in fp64.
  constexpr size_t kPiece = 64 * kMxBlock;
  float v[kPiece];
  const double p = post;
  for (size_t first = 0; first < n; first += kPiece) {
    const size_t m = std::min(kPiece, n - first);
    const size_t b = first / kMxBlock;
    const uint8_t* scales = src + b;
    const uint8_t* elements = src + mx_blocks(count) + mx_element_bytes(first, wire);
    const size_t whole = m / kMxBlock;
    detail::active_kernels().mx_decode(scales, elements, whole, wire, v, MxDecodeOp::kStore, 0.0f);
    if (whole * kMxBlock < m) {
      decode_block(scales[whole], block_elements(elements, whole, wire), m - whole * kMxBlock, wire,
                   v + whole * kMxBlock, MxDecodeOp::kStore, 0.0f);
    }
    for (size_t j = 0; j < m; ++j) dst[first + j] = static_cast<double>(v[j]) * p;
  }
}

}  // namespace cnccl::compress

// The CPU kernels of NVFP4 blocks (codec.h, nv_encode). Runs of whole blocks go to the dispatched block
// kernels (the scalar ones here, which define the encoding; vector forms in cpu/avx2.cpp, tested bit for
// bit against them); a run's short last block, fp64 sources' scaling and the census's samples are handled
// here, one block at a time. The operations are torchao's nvfp4_quantize with a per-tensor scale, in its
// order, each an fp32 operation rounded to nearest (built with -ffp-contract=off: a fused multiply-add
// would round once where torchao rounds twice).
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "compress/cpu/kernels.h"
#include "compress/formats.h"
#include "compress/stochastic.h"

namespace cnccl::compress {
namespace {

using detail::MxDecodeOp;
using detail::Rounding;
using formats::nv_block_scale;
using formats::nv_blocks;
using formats::nv_element_bytes;

constexpr size_t kBlockBytes = kNvBlock / 2;

// One block, as formats::nv_encode_block (which the CUDA kernels share) encodes it, counted into `census`.
uint8_t encode_block(const float* v, size_t m, float part, float inverse, uint8_t* out, Census* census,
                     const Dither* dither = nullptr, uint64_t index = 0) {
  size_t nonfinite = 0, saturated = 0;
  const uint8_t code = formats::nv_encode_block(v, m, part, inverse, out, dither, index, nonfinite, saturated);
  if (census) {
    census->nonfinite += nonfinite;
    census->saturated += saturated;
  }
  return code;
}

float element_value(const uint8_t* elements, size_t j, float s) {
  return detail::kE2m1Values[(elements[j / 2] >> (j % 2 * 4)) & 0xF] * s;
}

// out[0..m) = the first m values of block b of a run (scales, elements) under the part scale `part`,
// times `post` where op is kScale.
void decode_block(const uint8_t* scales, const uint8_t* elements, size_t b, size_t m, float part, float* out,
                  MxDecodeOp op = MxDecodeOp::kStore, float post = 1.0f) {
  const float s = nv_block_scale(scales[b], part);
  const uint8_t* e = elements + b * kBlockBytes;
  for (size_t j = 0; j < m; ++j) {
    const float v = element_value(e, j, s);
    out[j] = op == MxDecodeOp::kScale ? v * post : v;
  }
}

// out[0..m) = the sums in rank order of block b's first m values of k runs (rank r's scales and elements
// at scales[r], elements[r], under parts[r]).
void sum_block(const uint8_t* const* scales, const uint8_t* const* elements, const float* parts, size_t k, size_t b,
               size_t m, float* out) {
  float v[kNvBlock];
  for (size_t r = 0; r < k; ++r) {
    decode_block(scales[r], elements[r], b, m, parts[r], v);
    for (size_t j = 0; j < m; ++j) out[j] = r ? out[j] + v[j] : v[j];
  }
}

// The largest of `amax` and the finite |v[i]|.
float finite_amax(const float* v, size_t n, float amax) {
  for (size_t i = 0; i < n; ++i) {
    const float a = std::fabs(v[i]);
    if (a <= std::numeric_limits<float>::max()) amax = std::max(amax, a);
  }
  return amax;
}

// out[0..m) = the sums in rank order of the m values from block b on of k runs (rank r's scale codes and
// elements at scales[r] + b, elements[r] + 8 b): whole blocks through the block kernel, a short last one here.
// Returns their largest finite |sum| (0 for none).
float sum_run(const uint8_t* const* scales, const uint8_t* const* elements, const float* parts, size_t k, size_t m,
              float* out) {
  const size_t whole = m / kNvBlock;
  const float amax = detail::active_kernels().nv_sum(scales, elements, parts, k, whole, out);
  if (whole * kNvBlock == m) return amax;
  float* last = out + whole * kNvBlock;
  sum_block(scales, elements, parts, k, whole, m - whole * kNvBlock, last);
  return finite_amax(last, m - whole * kNvBlock, amax);
}

template <typename T>
float part_scale_of(const T* src, size_t n, float scale) {
  if constexpr (std::is_same_v<T, float>) {
    // Multiplying by |scale| keeps the order of magnitudes: the largest product is the largest value's,
    // through the vector kernel, unless some value or product is not finite.
    const float a = detail::active_kernels().amax_f32(src, n) * std::fabs(scale);
    if (a <= std::numeric_limits<float>::max()) return nv_part_scale(a);
  }
  float amax = 0.0f;
  for (size_t i = 0; i < n; ++i) {
    const float a = std::fabs(static_cast<float>(src[i] * static_cast<T>(scale)));
    if (a <= std::numeric_limits<float>::max()) amax = std::max(amax, a);
  }
  return nv_part_scale(amax);
}

// Counts into the sink's census, and samples its stride (set only with a census). The run's scales and
// elements may lie apart (a piece of a longer run: nv_sum_encode).
template <typename T>
void encode(const T* src, size_t n, size_t count, float scale, float part, uint8_t* scales, uint8_t* elements,
            const detail::CensusSink& sink, const Rounding& rounding = {}) {
  const float inverse = 1.0f / part;
  size_t b = 0;
  if constexpr (std::is_same_v<T, float>) {
    // The whole blocks of given values go to the block kernel at once.
    b = std::min(n, count) / kNvBlock;
    detail::active_kernels().nv_encode_f32(src, b, scale, part, inverse, scales, elements, sink.census,
                                           rounding.dither, rounding.first);
  }
  float v[kNvBlock];
  for (; b * kNvBlock < count; ++b) {
    const size_t first = b * kNvBlock;
    const size_t m = std::min(kNvBlock, count - first), given = first < n ? std::min(m, n - first) : 0;
    // The product formed as cast() forms it: in the source's precision, then to fp32.
    for (size_t j = 0; j < given; ++j) v[j] = static_cast<float>(src[first + j] * static_cast<T>(scale));
    std::fill(v + given, v + m, 0.0f);
    scales[b] = encode_block(v, m, part, inverse, elements + first / 2, sink.census, rounding.dither,
                             rounding.first + first);
  }
  if (!sink.stride) return;
  for (size_t i = 0; i < std::min(n, count); i += sink.stride) {
    const size_t block = i / kNvBlock;
    detail::sample(static_cast<float>(src[i] * static_cast<T>(scale)),
                   element_value(elements + block * kBlockBytes, i % kNvBlock, nv_block_scale(scales[block], part)),
                   *sink.census);
  }
}

// The first n values of the run of `count` at src under `part`, (op) into out.
void decode(const uint8_t* src, size_t count, float part, size_t n, float* out, MxDecodeOp op, float post) {
  const uint8_t* scales = src;
  const uint8_t* elements = src + nv_blocks(count);
  const size_t whole = n / kNvBlock;
  detail::active_kernels().nv_decode(scales, elements, whole, part, out, op, post);
  if (whole * kNvBlock < n) {
    decode_block(scales, elements, whole, n - whole * kNvBlock, part, out + whole * kNvBlock, op, post);
  }
}

}  // namespace

namespace detail {

void scalar_nv_encode_f32(const float* src, size_t blocks, float scale, float part, float inverse, uint8_t* scales,
                          uint8_t* elements, Census* census, const Dither* dither, uint64_t first) {
  float v[kNvBlock];
  for (size_t b = 0; b < blocks; ++b) {
    for (size_t j = 0; j < kNvBlock; ++j) v[j] = src[b * kNvBlock + j] * scale;
    scales[b] = encode_block(v, kNvBlock, part, inverse, elements + b * kBlockBytes, census, dither,
                             first + b * kNvBlock);
  }
}

void scalar_nv_decode(const uint8_t* scales, const uint8_t* elements, size_t blocks, float part, float* out,
                      MxDecodeOp op, float post) {
  for (size_t b = 0; b < blocks; ++b) decode_block(scales, elements, b, kNvBlock, part, out + b * kNvBlock, op, post);
}

float scalar_nv_sum(const uint8_t* const* scales, const uint8_t* const* elements, const float* parts, size_t k,
                    size_t blocks, float* out) {
  float amax = 0.0f;
  for (size_t b = 0; b < blocks; ++b) {
    sum_block(scales, elements, parts, k, b, kNvBlock, out + b * kNvBlock);
    amax = finite_amax(out + b * kNvBlock, kNvBlock, amax);
  }
  return amax;
}

}  // namespace detail

size_t nv_bytes(size_t n) { return nv_blocks(n) + nv_element_bytes(n); }

float nv_part_scale(float amax) {
  const GradualUnderflow exact;
  return formats::nv_part_scale_of(amax);
}
float nv_part_scale(const float* src, size_t n, float scale) {
  const GradualUnderflow exact;
  return part_scale_of(src, n, scale);
}
float nv_part_scale(const double* src, size_t n, float scale) {
  const GradualUnderflow exact;
  return part_scale_of(src, n, scale);
}

void nv_encode(const float* src, size_t n, size_t count, float scale, float part, uint8_t* dst) {
  const GradualUnderflow exact;
  encode(src, n, count, scale, part, dst, dst + nv_blocks(count), detail::census_sink());
}
void nv_encode(const double* src, size_t n, size_t count, float scale, float part, uint8_t* dst) {
  const GradualUnderflow exact;
  encode(src, n, count, scale, part, dst, dst + nv_blocks(count), detail::census_sink());
}

float nv_sum(const uint8_t* const* in, const float* parts, size_t k, float* dst, size_t n) {
  const GradualUnderflow exact;
  std::vector<const uint8_t*> scales(k), elements(k);
  for (size_t r = 0; r < k; ++r) scales[r] = in[r], elements[r] = in[r] + nv_blocks(n);
  return sum_run(scales.data(), elements.data(), parts, k, n, dst);
}

namespace {

float sum_encode(const uint8_t* const* in, const float* parts, size_t k, size_t n, uint8_t* dst,
                 const Rounding& rounding) {
  const GradualUnderflow exact;
  // Twice through the runs a piece at a time, in a sum that stays in L1: the sums' amax, then the sums
  // again, encoded under the part scale it gives. The census counts, but takes no samples: the sums
  // are not a rank's contribution.
  constexpr size_t kPiece = 128 * kNvBlock;
  float sums[kPiece];
  std::vector<const uint8_t*> scales(k), elements(k);
  auto sum_piece = [&](size_t first, size_t m) {
    for (size_t r = 0; r < k; ++r) {
      scales[r] = in[r] + first / kNvBlock, elements[r] = in[r] + nv_blocks(n) + first / 2;
    }
    return sum_run(scales.data(), elements.data(), parts, k, m, sums);
  };
  float amax = 0.0f;
  for (size_t first = 0; first < n; first += kPiece) amax = std::max(amax, sum_piece(first, std::min(kPiece, n - first)));
  const float part = nv_part_scale(amax);
  const detail::CensusSink counts{detail::census_sink().census, 0};
  for (size_t first = 0; first < n; first += kPiece) {
    const size_t m = std::min(kPiece, n - first);
    sum_piece(first, m);
    encode(sums, m, m, 1.0f, part, dst + first / kNvBlock, dst + nv_blocks(n) + first / 2, counts,
           Rounding{rounding.dither, rounding.first + first});
  }
  return part;
}

}  // namespace

float nv_sum_encode(const uint8_t* const* in, const float* parts, size_t k, size_t n, uint8_t* dst) {
  return sum_encode(in, parts, k, n, dst, Rounding{});
}
float nv_sum_encode(const uint8_t* const* in, const float* parts, size_t k, size_t n, uint8_t* dst,
                    const Dither& dither, uint64_t first) {
  return sum_encode(in, parts, k, n, dst, Rounding{&dither, first});
}

void nv_encode(const float* src, size_t n, size_t count, float scale, float part, uint8_t* dst, const Dither& dither,
               uint64_t first) {
  const GradualUnderflow exact;
  encode(src, n, count, scale, part, dst, dst + nv_blocks(count), detail::census_sink(), Rounding{&dither, first});
}
void nv_encode(const double* src, size_t n, size_t count, float scale, float part, uint8_t* dst, const Dither& dither,
               uint64_t first) {
  const GradualUnderflow exact;
  encode(src, n, count, scale, part, dst, dst + nv_blocks(count), detail::census_sink(), Rounding{&dither, first});
}

void nv_restore(const uint8_t* src, size_t count, float part, float* dst, size_t n, float post) {
  const GradualUnderflow exact;
  decode(src, count, part, n, dst, MxDecodeOp::kScale, post);
}
void nv_restore(const uint8_t* src, size_t count, float part, double* dst, size_t n, float post) {
  const GradualUnderflow exact;
  // Decoded in pieces to fp32, then T(v) * T(post) in fp64.
  constexpr size_t kPiece = 128 * kNvBlock;
  float v[kPiece];
  const double p = post;
  for (size_t first = 0; first < n; first += kPiece) {
    const size_t m = std::min(kPiece, n - first);
    const uint8_t* scales = src + first / kNvBlock;
    const uint8_t* elements = src + nv_blocks(count) + first / 2;
    const size_t whole = m / kNvBlock;
    detail::active_kernels().nv_decode(scales, elements, whole, part, v, MxDecodeOp::kStore, 0.0f);
    if (whole * kNvBlock < m) decode_block(scales, elements, whole, m - whole * kNvBlock, part, v + whole * kNvBlock);
    for (size_t j = 0; j < m; ++j) dst[first + j] = static_cast<double>(v[j]) * p;
  }
}

}  // namespace cnccl::compress

// CUDA kernels of power-of-two frames, MX and NVFP4 blocks (cuda/codec.h, frame_*): the definitions of
// the CPU kernels (codec.h, backend/frames.h) on the device, with the scalar conversions and the block
// wires' stochastic rounding shared through formats.h and stochastic.h. Products reach sums only through
// __fmul_rn and __fadd_rn, so that nvcc never contracts them into an FMA the CPU does not do. An MX block
// is one warp, a lane an element; an NVFP4 block one thread, as the CPU's scalar kernel encodes it; a
// frame's rows are a grid's y, its values x, in grid-stride loops.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "compress/cuda/codec.h"
#include "compress/cuda/launch.h"
#include "compress/formats.h"

namespace cnccl::compress::cuda {
namespace {

namespace fmt = formats;

constexpr size_t kHeaderBytes = 4;
constexpr unsigned kFullWarp = 0xFFFFFFFFu;
constexpr unsigned kLanes = 32;

// An NVFP4 frame's header: its part scale's fp32 bits, then zeros up to one block's bytes
// (backend/frames.h, nv_header_bytes).
constexpr size_t kNvHeaderBytes = 1 + kNvBlock / 2;

using fmt::mx_blocks;
using fmt::nv_blocks;
// The bytes of a frame's values, before its padding to 4 bytes.
__host__ __device__ size_t filled_bytes(size_t count, Wire w) {
  if (w == Wire::kNvfp4) return kNvHeaderBytes + nv_blocks(count) + fmt::nv_element_bytes(count);
  return is_mx(w) ? mx_blocks(count) + fmt::mx_element_bytes(count, w) : kHeaderBytes + count * wire_bytes(w);
}
__host__ __device__ size_t padded(size_t bytes) { return (bytes + 3) / 4 * 4; }

__device__ __forceinline__ size_t x_index() { return blockIdx.x * size_t(blockDim.x) + threadIdx.x; }
__device__ __forceinline__ size_t x_threads() { return size_t(gridDim.x) * blockDim.x; }

// x * s as the CPU's cast forms it: in the source's precision, then rounded to fp32.
__device__ __forceinline__ float scaled(float x, float s) { return __fmul_rn(x, s); }
__device__ __forceinline__ float scaled(double x, float s) { return __double2float_rn(__dmul_rn(x, double(s))); }

// dst = v * s in dst's precision, as the CPU's restores multiply.
__device__ __forceinline__ void store_scaled(float* dst, float v, float s) { *dst = __fmul_rn(v, s); }
__device__ __forceinline__ void store_scaled(double* dst, float v, float s) { *dst = __dmul_rn(double(v), double(s)); }

// Value i of a power-of-two frame's payload, widened exactly.
__device__ __forceinline__ float wire_value(const uint8_t* payload, size_t i, Wire w) {
  if (w == Wire::kFp16) return __half2float(__ushort_as_half(reinterpret_cast<const uint16_t*>(payload)[i]));
  if (w == Wire::kBf16) return __bfloat162float(__ushort_as_bfloat16(reinterpret_cast<const uint16_t*>(payload)[i]));
  return fmt::fp8_value(payload[i], fmt::fp8_format(w));
}

// v rounded to nearest even into value i of a payload (0 for v = +0: the missing values' bytes).
__device__ __forceinline__ void store_wire(uint8_t* payload, size_t i, float v, Wire w) {
  if (w == Wire::kFp16) {
    reinterpret_cast<uint16_t*>(payload)[i] = __half_as_ushort(__float2half_rn(v));
  } else if (w == Wire::kBf16) {
    reinterpret_cast<uint16_t*>(payload)[i] = __bfloat16_as_ushort(__float2bfloat16_rn(v));
  } else {
    payload[i] = fmt::fp8_code(v, fmt::fp8_format(w));
  }
}

// Zeroes a frame's padding (bytes [filled, padded)), from the grid's first threads.
__device__ __forceinline__ void zero_padding(uint8_t* frame, size_t count, Wire w) {
  const size_t from = filled_bytes(count, w), i = x_index();
  if (i < padded(from) - from) frame[from + i] = 0;
}

// --- amax, as the bits of |x| (non-negative: their order is the values', and any NaN's exceed inf's).

__device__ __forceinline__ unsigned long long magnitude_bits(float x) { return __float_as_uint(x) & 0x7FFFFFFFu; }
__device__ __forceinline__ unsigned long long magnitude_bits(double x) {
  return static_cast<unsigned long long>(__double_as_longlong(x)) & 0x7FFFFFFFFFFFFFFFull;
}
__device__ __forceinline__ float amax_of(unsigned long long bits, float) {
  return bits > fmt::kInfinity ? fmt::float_of(fmt::kQuietNan) : __uint_as_float(unsigned(bits));
}
__device__ __forceinline__ double amax_of(unsigned long long bits, double) {
  return bits > 0x7FF0000000000000ull ? __longlong_as_double(0x7FF8000000000000ll)
                                      : __longlong_as_double(static_cast<long long>(bits));
}

// *slot = max(*slot, bits) over the calling warp's lanes.
__device__ __forceinline__ void warp_max_into(unsigned long long bits, unsigned long long* slot) {
  for (unsigned offset = kLanes / 2; offset; offset /= 2) {
    const unsigned long long other = __shfl_xor_sync(kFullWarp, bits, offset);
    bits = other > bits ? other : bits;
  }
  if ((threadIdx.x & (kLanes - 1)) == 0 && bits) atomicMax(slot, bits);
}

template <typename T>
__global__ void amax_kernel(const T* src, size_t n, unsigned long long* slot) {
  unsigned long long bits = 0;
  for (size_t i = x_index(); i < n; i += x_threads()) {
    const unsigned long long b = magnitude_bits(src[i]);
    bits = b > bits ? b : bits;
  }
  warp_max_into(bits, slot);
}

// fp32(amax * |scale|), the product formed in the source's precision (the CPU's exponent_of_amax).
__device__ __forceinline__ float scaled_amax(float amax, float scale) { return __fmul_rn(amax, fabsf(scale)); }
__device__ __forceinline__ float scaled_amax(double amax, float scale) {
  return __double2float_rn(__dmul_rn(amax, double(fabsf(scale))));
}

// --- Power-of-two frames.

// Whether a frame's casts count (backend/frames.cpp, exponent_of_amax): the 16-bit ones always; the 8-bit
// ones only where the magnitude that set the exponent is not finite, since otherwise every value is in range.
__device__ __forceinline__ bool frame_casts_count(float magnitude, Wire w) {
  return wire_bytes(w) == 2 || !fmt::finite(magnitude);
}

template <typename T>
__global__ void encode_kernel(const T* src, size_t n, size_t count, float pre_scale, Wire w, uint8_t* frame,
                              const unsigned long long* amax_slot, CastCounts* counts, const float* scale_on_device) {
  const float scale = launch::scale_of(pre_scale, scale_on_device);
  const float magnitude = scaled_amax(amax_of(*amax_slot, T()), scale);
  const int32_t k = fmt::frame_exponent(magnitude, w);
  const float s = __fmul_rn(scale, fmt::power_of_two(k));
  const bool counted = counts && frame_casts_count(magnitude, w);
  const float limit = fmt::overflow_limit(w);
  unsigned nonfinite = 0, saturated = 0;
  uint8_t* payload = frame + kHeaderBytes;
  for (size_t i = x_index(); i < count; i += x_threads()) {
    const float v = i < n ? scaled(src[i], s) : 0.0f;
    store_wire(payload, i, v, w);
    if (counted && i < n) launch::tally(v, limit, nonfinite, saturated);
  }
  launch::add_counts(counted ? counts : nullptr, nonfinite, saturated);
  if (x_index() == 0) *reinterpret_cast<int32_t*>(frame) = k;
  zero_padding(frame, count, w);
}

// The sum of value i of `ranks` frames, `stride` bytes apart, decoded with scales[r], in rank order.
__device__ __forceinline__ float frame_sum_at(const uint8_t* frames, size_t ranks, size_t stride, const float* scales,
                                              size_t i, Wire w) {
  float acc = 0.0f;
  for (size_t r = 0; r < ranks; ++r) {
    const float v = __fmul_rn(wire_value(frames + r * stride + kHeaderBytes, i, w), scales[r]);
    acc = r ? __fadd_rn(acc, v) : v;
  }
  return acc;
}

// The owner's sum, first pass: the sums' amax, and every frame's decoding scale (the second pass may
// write over a header).
struct SumWorkspace {
  unsigned long long amax;
  float scales[1];  // ranks of them
};

__global__ void sum_amax_kernel(const uint8_t* frames, size_t ranks, size_t stride, size_t count, Wire w,
                                SumWorkspace* ws, float* scales) {
  // Each thread decodes the headers itself: the workspace's scales are written by this same launch.
  unsigned long long bits = 0;
  for (size_t i = x_index(); i < count; i += x_threads()) {
    float acc = 0.0f;
    for (size_t r = 0; r < ranks; ++r) {
      const uint8_t* frame = frames + r * stride;
      const float s = fmt::frame_decoding_scale(*reinterpret_cast<const int32_t*>(frame));
      const float v = __fmul_rn(wire_value(frame + kHeaderBytes, i, w), s);
      acc = r ? __fadd_rn(acc, v) : v;
    }
    const unsigned long long b = magnitude_bits(acc);
    bits = b > bits ? b : bits;
  }
  warp_max_into(bits, &ws->amax);
  for (size_t r = x_index(); r < ranks; r += x_threads()) {
    scales[r] = fmt::frame_decoding_scale(*reinterpret_cast<const int32_t*>(frames + r * stride));
  }
}

__global__ void sum_encode_kernel(const uint8_t* frames, size_t ranks, size_t stride, size_t count, Wire w,
                                  const SumWorkspace* ws, const float* scales, uint8_t* out, CastCounts* counts) {
  const float amax = amax_of(ws->amax, 0.0f);
  const int32_t k = fmt::frame_exponent(amax, w);
  const float s = fmt::power_of_two(k);
  const bool counted = counts && frame_casts_count(amax, w);
  const float limit = fmt::overflow_limit(w);
  unsigned nonfinite = 0, saturated = 0;
  for (size_t i = x_index(); i < count; i += x_threads()) {
    // Value i of every frame is read before value i of `out`, which may be one of them, is written.
    const float v = __fmul_rn(frame_sum_at(frames, ranks, stride, scales, i, w), s);
    store_wire(out + kHeaderBytes, i, v, w);
    if (counted) launch::tally(v, limit, nonfinite, saturated);
  }
  launch::add_counts(counted ? counts : nullptr, nonfinite, saturated);
  if (x_index() == 0) *reinterpret_cast<int32_t*>(out) = k;
  zero_padding(out, count, w);
}

// The frames' decoding scales, from their headers, into `scales` (a reduce_scatter's sum reads them there).
__global__ void decoding_scales_kernel(const uint8_t* frames, size_t ranks, size_t stride, float* scales) {
  for (size_t r = x_index(); r < ranks; r += x_threads()) {
    scales[r] = fmt::frame_decoding_scale(*reinterpret_cast<const int32_t*>(frames + r * stride));
  }
}

template <typename T>
__global__ void sum_wide_kernel(const uint8_t* frames, size_t ranks, size_t stride, size_t count, Wire w,
                                const float* scales, float post, T* dst) {
  for (size_t i = x_index(); i < count; i += x_threads()) {
    const float sum = frame_sum_at(frames, ranks, stride, scales, i, w);
    store_scaled(dst + i, sum, post);
  }
}

// Row r's frame of `count` values into dst[r * count, ...), at most n values in all; rows from blockIdx.y
// in steps of gridDim.y.
template <typename T>
__global__ void restore_kernel(const uint8_t* frames, size_t stride, size_t count, Wire w, float post, T* dst,
                               size_t n) {
  for (size_t row = blockIdx.y, first = row * count; first < n; row += gridDim.y, first = row * count) {
    const uint8_t* frame = frames + row * stride;
    const float s = __fmul_rn(post, fmt::frame_decoding_scale(*reinterpret_cast<const int32_t*>(frame)));
    const size_t len = n - first < count ? n - first : count;
    for (size_t i = x_index(); i < len; i += x_threads()) {
      store_scaled(dst + first + i, wire_value(frame + kHeaderBytes, i, w), s);
    }
  }
}

// --- MX blocks.

// Value i of an MX run of `blocks` blocks at `frame`: the element times its block's scale, exactly.
__device__ __forceinline__ float mx_value(const uint8_t* frame, size_t blocks, size_t i, Wire w) {
  const float s = fmt::mx_scale_value(frame[i / kMxBlock]);
  const uint8_t* elements = frame + blocks;
  if (w == Wire::kMxfp4) return __fmul_rn(fmt::e2m1_value((elements[i / 2] >> (i % 2 * 4)) & 0xF), s);
  return __fmul_rn(fmt::fp8_value(elements[i], fmt::fp8_format(w)), s);
}

// How a launch rounds a block wire's elements: value i stochastically with block_random_bits(dither,
// first + i) (compress/stochastic.h), or to nearest. FrameRounding's, by value: a kernel's argument.
struct Rounding {
  Dither dither;
  bool stochastic;
  uint64_t first;
};
Rounding rounding_of(FrameRounding r) { return {r.dither ? *r.dither : Dither{}, r.dither != nullptr, r.first}; }

// Block b's lane: v is its value (0 past the block's m values), `random` its bits where `stochastic`.
// Writes the block's scale code and its elements as the CPU's encode_block (cpu/mx.cpp) does. Every lane
// of the warp calls it.
__device__ __forceinline__ void mx_encode_lane(float v, unsigned lane, size_t m, size_t b, Wire w, MxScale rule,
                                               uint8_t* scales, uint8_t* elements, CastCounts* counts,
                                               bool stochastic, uint32_t random) {
  // The block's bytes are written below only after every lane read what it needed (sum-encode in place).
  __syncwarp();
  const unsigned a = __float_as_uint(v) & 0x7FFFFFFFu;
  const unsigned amax = launch::warp_max(a);
  const unsigned nonfinite_lanes = __ballot_sync(kFullWarp, lane < m && a >= fmt::kInfinity);
  const bool nonfinite = nonfinite_lanes != 0;
  const bool e2m1 = w == Wire::kMxfp4;
  const int x = fmt::mx_exponent(amax, mx_emax(w), mx_largest_fraction(w), rule);
  uint8_t code = 0;
  if (!nonfinite) {
    const float q = __fmul_rn(v, fmt::float_of(uint32_t(127 - x) << 23));  // 2^-X: X <= 128 - emax keeps it normal
    const float largest = mx_largest(w);
    if (e2m1) {
      const float clamped = fminf(fabsf(q), largest);
      const float on_grid = stochastic ? stochastic_e2m1_value(clamped, random) : clamped;
      code = uint8_t((signbit(q) ? 8 : 0) | fmt::e2m1_code(on_grid));
    } else {
      const float clamped = fminf(fmaxf(q, -largest), largest);
      const Wire element = w == Wire::kMxfp8 ? Wire::kE4m3 : Wire::kE5m2;
      // On the grid already, the conversion is exact: its rounding to nearest does nothing.
      const float on_grid = stochastic ? copysignf(stochastic_fp8_value(fabsf(clamped), random, element), q) : clamped;
      code = fmt::fp8_code(on_grid, fmt::fp8_format(w));
    }
  }
  // What the block met (cpu/mx.cpp, encode_block): its values that are not finite, else those saturated.
  const unsigned saturated_lanes = __ballot_sync(kFullWarp, !nonfinite && lane < m &&
                                                 fabsf(__fmul_rn(v, fmt::float_of(uint32_t(127 - x) << 23))) >
                                                     mx_largest(w));
  if (counts && lane == 0) {
    if (nonfinite_lanes) atomicAdd(&counts->nonfinite, static_cast<unsigned long long>(__popc(nonfinite_lanes)));
    if (saturated_lanes) atomicAdd(&counts->saturated, static_cast<unsigned long long>(__popc(saturated_lanes)));
  }
  if (e2m1) {
    const unsigned high = __shfl_down_sync(kFullWarp, unsigned(code), 1);
    if (lane % 2 == 0 && lane < m) {
      elements[(b * kMxBlock + lane) / 2] = uint8_t(code | (lane + 1 < m ? high << 4 : 0));
    }
  } else if (lane < m) {
    elements[b * kMxBlock + lane] = code;
  }
  if (lane == 0) scales[b] = nonfinite ? 0xFF : uint8_t(x + 127);
}

// The bits of value i's stochastic rounding (0 where it rounds to nearest or is past the block's m values).
__device__ __forceinline__ uint32_t random_of(const Rounding& r, unsigned lane, size_t m, size_t i) {
  return r.stochastic && lane < m ? block_random_bits(r.dither, r.first + i) : 0;
}

template <typename T>
__global__ void mx_encode_kernel(const T* src, size_t n, size_t count, float pre_scale, Wire w, MxScale rule,
                                 uint8_t* frame, CastCounts* counts, const float* scale_on_device, Rounding rounding) {
  const float scale = launch::scale_of(pre_scale, scale_on_device);
  const size_t blocks = mx_blocks(count), warps = x_threads() / kLanes;
  const unsigned lane = threadIdx.x % kLanes;
  for (size_t b = x_index() / kLanes; b < blocks; b += warps) {
    const size_t i = b * kMxBlock + lane, m = count - b * kMxBlock < kMxBlock ? count - b * kMxBlock : kMxBlock;
    const float v = lane < m && i < n ? scaled(src[i], scale) : 0.0f;
    mx_encode_lane(v, lane, m, b, w, rule, frame, frame + blocks, counts, rounding.stochastic,
                   random_of(rounding, lane, m, i));
  }
  zero_padding(frame, count, w);
}

__global__ void mx_sum_encode_kernel(const uint8_t* frames, size_t ranks, size_t stride, size_t count, Wire w,
                                     MxScale rule, uint8_t* out, CastCounts* counts, Rounding rounding) {
  const size_t blocks = mx_blocks(count), warps = x_threads() / kLanes;
  const unsigned lane = threadIdx.x % kLanes;
  for (size_t b = x_index() / kLanes; b < blocks; b += warps) {
    const size_t i = b * kMxBlock + lane, m = count - b * kMxBlock < kMxBlock ? count - b * kMxBlock : kMxBlock;
    float acc = 0.0f;
    if (lane < m) {
      for (size_t r = 0; r < ranks; ++r) {
        const float v = mx_value(frames + r * stride, blocks, i, w);
        acc = r ? __fadd_rn(acc, v) : v;
      }
    }
    // The lanes' reads of block b come before mx_encode_lane's first shuffle, its writes after it:
    // `out` may be one of the frames.
    mx_encode_lane(acc, lane, m, b, w, rule, out, out + blocks, counts, rounding.stochastic,
                   random_of(rounding, lane, m, i));
  }
  zero_padding(out, count, w);
}

template <typename T>
__global__ void mx_sum_wide_kernel(const uint8_t* frames, size_t ranks, size_t stride, size_t count, Wire w, float post,
                                   T* dst) {
  const size_t blocks = mx_blocks(count);
  for (size_t i = x_index(); i < count; i += x_threads()) {
    float acc = 0.0f;
    for (size_t r = 0; r < ranks; ++r) {
      const float v = mx_value(frames + r * stride, blocks, i, w);
      acc = r ? __fadd_rn(acc, v) : v;
    }
    store_scaled(dst + i, acc, post);
  }
}

template <typename T>
__global__ void mx_restore_kernel(const uint8_t* frames, size_t stride, size_t count, Wire w, float post, T* dst,
                                  size_t n) {
  const size_t blocks = mx_blocks(count);
  for (size_t row = blockIdx.y, first = row * count; first < n; row += gridDim.y, first = row * count) {
    const uint8_t* frame = frames + row * stride;
    const size_t len = n - first < count ? n - first : count;
    for (size_t i = x_index(); i < len; i += x_threads()) {
      store_scaled(dst + first + i, mx_value(frame, blocks, i, w), post);
    }
  }
}

// --- NVFP4 blocks: a header (backend/frames.h), then the part's run: its blocks' scale codes, then their
// elements, two a byte (codec.h, nv_encode).

// P (the CPU's nv_part_scale) of the largest finite |v|, v = src[i] * scale formed as cast() forms it:
// its bits into *slot.
template <typename T>
__global__ void nv_amax_kernel(const T* src, size_t n, float pre_scale, const float* scale_on_device,
                               unsigned long long* slot) {
  const float scale = launch::scale_of(pre_scale, scale_on_device);
  unsigned long long bits = 0;
  for (size_t i = x_index(); i < n; i += x_threads()) {
    const unsigned b = __float_as_uint(scaled(src[i], scale)) & 0x7FFFFFFFu;
    if (b < fmt::kInfinity && b > bits) bits = b;
  }
  warp_max_into(bits, slot);
}

// The part scale a header carries; NaN for one that nv_part_scale cannot give (the CPU names the rank).
__device__ __forceinline__ float nv_header_part(const uint8_t* frame) {
  const float part = *reinterpret_cast<const float*>(frame);
  return fmt::nv_part_is_valid(part) ? part : fmt::float_of(fmt::kQuietNan);
}

__device__ __forceinline__ void write_nv_header(uint8_t* frame, float part) {
  *reinterpret_cast<float*>(frame) = part;
  for (size_t i = sizeof part; i < kNvHeaderBytes; ++i) frame[i] = 0;
}

// Value i of a run of `blocks` blocks at `run` under the part scale `part`: fl(e2m1 * fl(P * S)).
__device__ __forceinline__ float nv_value(const uint8_t* run, size_t blocks, size_t i, float part) {
  const float s = fmt::nv_block_scale(run[i / kNvBlock], part);
  return __fmul_rn(fmt::e2m1_value((run[blocks + i / 2] >> (i % 2 * 4)) & 0xF), s);
}

// The sum of value i of `ranks` frames, `stride` bytes apart, under their part scales, in rank order.
__device__ __forceinline__ float nv_sum_at(const uint8_t* frames, size_t ranks, size_t stride, size_t blocks,
                                           const float* parts, size_t i) {
  float acc = 0.0f;
  for (size_t r = 0; r < ranks; ++r) {
    const float v = nv_value(frames + r * stride + kNvHeaderBytes, blocks, i, parts[r]);
    acc = r ? __fadd_rn(acc, v) : v;
  }
  return acc;
}

// Writes a frame of `count` values under the part scale P of the largest finite magnitude in *amax_slot,
// a thread a block, each encoded by formats::nv_encode_block as the scalar CPU kernel encodes it: block b's
// m values come from load(b * 16, m, v). The header and padding from the grid's first threads.
template <typename Load>
__device__ void nv_encode_frame(Load load, size_t count, const unsigned long long* amax_slot, uint8_t* frame,
                                CastCounts* counts, const Rounding& rounding) {
  const float part = fmt::nv_part_scale_of(__uint_as_float(unsigned(*amax_slot)));
  const float inverse = __fdiv_rn(1.0f, part);
  const size_t blocks = nv_blocks(count);
  uint8_t* scales = frame + kNvHeaderBytes;
  const Dither* dither = rounding.stochastic ? &rounding.dither : nullptr;
  size_t nonfinite = 0, saturated = 0;
  for (size_t b = x_index(); b < blocks; b += x_threads()) {
    const size_t from = b * kNvBlock, m = count - from < kNvBlock ? count - from : kNvBlock;
    float v[kNvBlock];
    load(from, m, v);
    scales[b] = fmt::nv_encode_block(v, m, part, inverse, scales + blocks + from / 2, dither, rounding.first + from,
                                     nonfinite, saturated);
  }
  launch::add_counts(counts, unsigned(nonfinite), unsigned(saturated));
  if (x_index() == 0) write_nv_header(frame, part);
  zero_padding(frame, count, Wire::kNvfp4);
}

template <typename T>
__global__ void nv_encode_kernel(const T* src, size_t n, size_t count, float pre_scale, uint8_t* frame,
                                 const unsigned long long* amax_slot, CastCounts* counts, const float* scale_on_device,
                                 Rounding rounding) {
  const float scale = launch::scale_of(pre_scale, scale_on_device);
  const auto load = [&](size_t from, size_t m, float* v) {
    for (size_t j = 0; j < m; ++j) v[j] = from + j < n ? scaled(src[from + j], scale) : 0.0f;
  };
  nv_encode_frame(load, count, amax_slot, frame, counts, rounding);
}

// The frames' part scales, from their headers, into `parts`.
__global__ void nv_parts_kernel(const uint8_t* frames, size_t ranks, size_t stride, float* parts) {
  for (size_t r = x_index(); r < ranks; r += x_threads()) parts[r] = nv_header_part(frames + r * stride);
}

// The owner's sum, first pass: the largest finite |sum|, whose P the second pass encodes under.
__global__ void nv_sum_amax_kernel(const uint8_t* frames, size_t ranks, size_t stride, size_t count,
                                   const float* parts, unsigned long long* slot) {
  const size_t blocks = nv_blocks(count);
  unsigned long long bits = 0;
  for (size_t i = x_index(); i < count; i += x_threads()) {
    const unsigned b = __float_as_uint(nv_sum_at(frames, ranks, stride, blocks, parts, i)) & 0x7FFFFFFFu;
    if (b < fmt::kInfinity && b > bits) bits = b;
  }
  warp_max_into(bits, slot);
}

__global__ void nv_sum_encode_kernel(const uint8_t* frames, size_t ranks, size_t stride, size_t count,
                                     const float* parts, const unsigned long long* amax_slot, uint8_t* out,
                                     CastCounts* counts, Rounding rounding) {
  const size_t blocks = nv_blocks(count);
  // Block b of every frame is read before block b of `out`, which may be one of them, is written; the
  // headers are not read (the parts are in `parts`).
  const auto load = [&](size_t from, size_t m, float* v) {
    for (size_t j = 0; j < m; ++j) v[j] = nv_sum_at(frames, ranks, stride, blocks, parts, from + j);
  };
  nv_encode_frame(load, count, amax_slot, out, counts, rounding);
}

template <typename T>
__global__ void nv_sum_wide_kernel(const uint8_t* frames, size_t ranks, size_t stride, size_t count,
                                   const float* parts, float post, T* dst) {
  const size_t blocks = nv_blocks(count);
  for (size_t i = x_index(); i < count; i += x_threads()) {
    store_scaled(dst + i, nv_sum_at(frames, ranks, stride, blocks, parts, i), post);
  }
}

template <typename T>
__global__ void nv_restore_kernel(const uint8_t* frames, size_t stride, size_t count, float post, T* dst, size_t n) {
  const size_t blocks = nv_blocks(count);
  for (size_t row = blockIdx.y, first = row * count; first < n; row += gridDim.y, first = row * count) {
    const uint8_t* frame = frames + row * stride;
    const float part = nv_header_part(frame);
    const size_t len = n - first < count ? n - first : count;
    for (size_t i = x_index(); i < len; i += x_threads()) {
      store_scaled(dst + first + i, nv_value(frame + kNvHeaderBytes, blocks, i, part), post);
    }
  }
}

// A grid of blocks for `work` threads (whole warps) in x, and up to `rows` in y (a grid's y stops at 65535:
// the kernels step through more).
dim3 grid(size_t work, size_t rows = 1) {
  return dim3(unsigned(launch::blocks_for(work)), unsigned(rows < 65535 ? rows : 65535));
}

template <typename T>
void encode(const T* src, size_t n, size_t count, float scale, Wire wire, MxScale rule, uint8_t* frame, void* workspace,
            cudaStream_t stream, CastCounts* counts, const float* scale_on_device, FrameRounding rounding) {
  if (is_mx(wire)) {
    if (count == 0) return;  // no blocks, no bytes
    mx_encode_kernel<<<grid(mx_blocks(count) * kLanes), launch::kThreads, 0, stream>>>(
        src, n, count, scale, wire, rule, frame, counts, scale_on_device, rounding_of(rounding));
    return launch::check("MX encode kernel");
  }
  auto* slot = static_cast<unsigned long long*>(workspace);
  cudaMemsetAsync(slot, 0, sizeof *slot, stream);
  if (wire == Wire::kNvfp4) {
    if (n) nv_amax_kernel<<<grid(n), launch::kThreads, 0, stream>>>(src, n, scale, scale_on_device, slot);
    nv_encode_kernel<<<grid(nv_blocks(count) + kNvHeaderBytes), launch::kThreads, 0, stream>>>(
        src, n, count, scale, frame, slot, counts, scale_on_device, rounding_of(rounding));
    return launch::check("NVFP4 encode kernel");
  }
  if (n) amax_kernel<<<grid(n), launch::kThreads, 0, stream>>>(src, n, slot);
  encode_kernel<<<grid(count + kHeaderBytes), launch::kThreads, 0, stream>>>(src, n, count, scale, wire, frame, slot,
                                                                             counts, scale_on_device);
  launch::check("frame encode kernel");
}

template <typename T>
void sum_wide(const uint8_t* frames, size_t ranks, size_t stride, size_t count, Wire wire, float post, T* dst,
              void* workspace, cudaStream_t stream) {
  if (count == 0 || ranks == 0) return;
  if (is_mx(wire)) {
    mx_sum_wide_kernel<<<grid(count), launch::kThreads, 0, stream>>>(frames, ranks, stride, count, wire, post, dst);
    return launch::check("MX sum kernel");
  }
  auto* scales = static_cast<float*>(workspace);
  if (wire == Wire::kNvfp4) {
    nv_parts_kernel<<<grid(ranks), launch::kThreads, 0, stream>>>(frames, ranks, stride, scales);
    nv_sum_wide_kernel<<<grid(count), launch::kThreads, 0, stream>>>(frames, ranks, stride, count, scales, post, dst);
    return launch::check("NVFP4 sum kernel");
  }
  decoding_scales_kernel<<<grid(ranks), launch::kThreads, 0, stream>>>(frames, ranks, stride, scales);
  sum_wide_kernel<<<grid(count), launch::kThreads, 0, stream>>>(frames, ranks, stride, count, wire, scales, post, dst);
  launch::check("frame sum kernel");
}

template <typename T>
void restore(const uint8_t* frames, size_t stride, size_t count, Wire wire, float post, T* dst, size_t n,
             cudaStream_t stream) {
  if (n == 0 || count == 0) return;
  const size_t rows = (n + count - 1) / count;
  if (is_mx(wire)) {
    mx_restore_kernel<<<grid(count, rows), launch::kThreads, 0, stream>>>(frames, stride, count, wire, post, dst, n);
    return launch::check("MX restore kernel");
  }
  if (wire == Wire::kNvfp4) {
    nv_restore_kernel<<<grid(count, rows), launch::kThreads, 0, stream>>>(frames, stride, count, post, dst, n);
    return launch::check("NVFP4 restore kernel");
  }
  restore_kernel<<<grid(count, rows), launch::kThreads, 0, stream>>>(frames, stride, count, wire, post, dst, n);
  launch::check("frame restore kernel");
}

}  // namespace

size_t frame_workspace_bytes(size_t ranks) { return sizeof(SumWorkspace) + ranks * sizeof(float); }

void frame_encode(const float* src, size_t n, size_t count, float scale, Wire wire, MxScale rule, uint8_t* frame,
                  void* workspace, cudaStream_t stream, CastCounts* counts, const float* scale_on_device,
                  FrameRounding rounding) {
  encode(src, n, count, scale, wire, rule, frame, workspace, stream, counts, scale_on_device, rounding);
}
void frame_encode(const double* src, size_t n, size_t count, float scale, Wire wire, MxScale rule, uint8_t* frame,
                  void* workspace, cudaStream_t stream, CastCounts* counts, const float* scale_on_device,
                  FrameRounding rounding) {
  encode(src, n, count, scale, wire, rule, frame, workspace, stream, counts, scale_on_device, rounding);
}

void frame_sum_encode(const uint8_t* frames, size_t ranks, size_t stride, size_t count, Wire wire, MxScale rule,
                      uint8_t* out, void* workspace, cudaStream_t stream, CastCounts* counts, FrameRounding rounding) {
  if (ranks == 0) return;
  if (is_mx(wire)) {
    if (count == 0) return;
    mx_sum_encode_kernel<<<grid(mx_blocks(count) * kLanes), launch::kThreads, 0, stream>>>(
        frames, ranks, stride, count, wire, rule, out, counts, rounding_of(rounding));
    return launch::check("MX sum-encode kernel");
  }
  auto* ws = static_cast<SumWorkspace*>(workspace);
  float* scales = ws->scales;
  cudaMemsetAsync(&ws->amax, 0, sizeof ws->amax, stream);
  if (wire == Wire::kNvfp4) {
    // Three passes: the parts (the sum-encode may write over a header), the sums' amax, then the sums
    // encoded under its P.
    nv_parts_kernel<<<grid(ranks), launch::kThreads, 0, stream>>>(frames, ranks, stride, scales);
    if (count) {
      nv_sum_amax_kernel<<<grid(count), launch::kThreads, 0, stream>>>(frames, ranks, stride, count, scales, &ws->amax);
    }
    nv_sum_encode_kernel<<<grid(nv_blocks(count) + kNvHeaderBytes), launch::kThreads, 0, stream>>>(
        frames, ranks, stride, count, scales, &ws->amax, out, counts, rounding_of(rounding));
    return launch::check("NVFP4 sum-encode kernel");
  }
  sum_amax_kernel<<<grid(count > ranks ? count : ranks), launch::kThreads, 0, stream>>>(frames, ranks, stride, count,
                                                                                       wire, ws, scales);
  sum_encode_kernel<<<grid(count + kHeaderBytes), launch::kThreads, 0, stream>>>(frames, ranks, stride, count, wire, ws,
                                                                                scales, out, counts);
  launch::check("frame sum-encode kernel");
}

void frame_sum(const uint8_t* frames, size_t ranks, size_t stride, size_t count, Wire wire, float post, float* dst,
               void* workspace, cudaStream_t stream) {
  sum_wide(frames, ranks, stride, count, wire, post, dst, workspace, stream);
}
void frame_sum(const uint8_t* frames, size_t ranks, size_t stride, size_t count, Wire wire, float post, double* dst,
               void* workspace, cudaStream_t stream) {
  sum_wide(frames, ranks, stride, count, wire, post, dst, workspace, stream);
}

void frame_restore(const uint8_t* frames, size_t stride, size_t count, Wire wire, float post, float* dst, size_t n,
                   cudaStream_t stream) {
  restore(frames, stride, count, wire, post, dst, n, stream);
}
void frame_restore(const uint8_t* frames, size_t stride, size_t count, Wire wire, float post, double* dst, size_t n,
                   cudaStream_t stream) {
  restore(frames, stride, count, wire, post, dst, n, stream);
}

}  // namespace cnccl::compress::cuda

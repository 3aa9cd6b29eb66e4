// Internal: one table of CPU kernels per instruction-set level, chosen by cpu/dispatch.cpp.
#pragma once

#include <cstring>

#if defined(__x86_64__)
#include <xmmintrin.h>
#endif

#include "compress/codec.h"
#include "compress/formats.h"
#include "compress/stochastic.h"

namespace cnccl::compress::detail {

// An MX wire's element type, as its block kernels need it (codec.h, "MX blocks").
struct MxBlockFormat {
  int emax;           // the exponent of the element type's largest binade
  float max;          // its largest magnitude
  uint32_t fraction;  // the significand bits of max past its leading one (mx_largest_fraction)
  Wire element;       // the 8-bit format of the elements: kE4m3, kE5m2, or kMxfp4 for e2m1
};
MxBlockFormat mx_block_format(Wire wire);
// What an MX decode does with each value v of its blocks: out = v, or out = v * post.
enum class MxDecodeOp : uint8_t { kStore, kScale };

// How a run of block values is rounded: stochastically, element i with the random bits of index first + i
// (stochastic.h), or without a dither to nearest even (cpu/mx.cpp, cpu/nvfp4.cpp).
struct Rounding {
  const Dither* dither = nullptr;
  uint64_t first = 0;
};

// The casts count what they meet into a Census when given one (nullptr: they do not count).
struct CpuKernels {
  void (*cast_f32)(const float*, uint16_t*, size_t, float, Wire, Census*);
  void (*cast_f64)(const double*, uint16_t*, size_t, float, Wire, Census*);
  void (*restore_f32)(const uint16_t*, float*, size_t, float, Wire);
  void (*restore_f64)(const uint16_t*, double*, size_t, float, Wire);
  void (*add)(uint16_t*, const uint16_t*, size_t, Wire);
  void (*cast_add_f32)(const float*, const uint16_t*, uint16_t*, size_t, float, Wire, Census*);
  void (*sum)(const uint16_t* const*, size_t, uint16_t*, size_t, Wire);
  void (*sum_f32)(const uint16_t* const*, size_t, float*, size_t, Wire);
  // Power-of-two frames (cpu/frames.cpp).
  float (*amax_f32)(const float*, size_t);
  void (*cast8_f32)(const float*, uint8_t*, size_t, float, Wire);
  void (*restore8_f32)(const uint8_t*, float*, size_t, float, Wire);
  // The owner's sum of k ranks' frames of a 16- or 8-bit wire (codec.h, scaled_sum).
  void (*scaled_sum_f32)(const void* const* in, const float* scales, size_t k, float* dst, size_t n, Wire);
  // MX blocks (cpu/mx.cpp): `blocks` whole blocks of 32 values src[i] * scale, their scale codes to
  // scales[0..blocks) and their elements to `elements` (32 bytes a block, 16 for e2m1); what the
  // values met is counted into the census, if any (samples are taken by the caller). With a dither the
  // elements are rounded stochastically, src[i] taking the random bits of index first + i.
  void (*mx_encode_f32)(const float* src, size_t blocks, float scale, const MxBlockFormat& f, MxScale rule,
                        uint8_t* scales, uint8_t* elements, Census* census, const Dither* dither, uint64_t first);
  // The values of `blocks` whole blocks (scales, elements laid out as above) of `wire`, into out[0..32 * blocks).
  void (*mx_decode)(const uint8_t* scales, const uint8_t* elements, size_t blocks, Wire wire, float* out,
                    MxDecodeOp op, float post);
  // out[0..32 * blocks) = the sum in rank order of k ranks' values of `blocks` whole blocks, rank r's
  // scales and elements at scales[r] and elements[r] (laid out as above).
  void (*mx_sum)(const uint8_t* const* scales, const uint8_t* const* elements, size_t k, size_t blocks, Wire wire,
                 float* out);
  // NVFP4 blocks (cpu/nvfp4.cpp): `blocks` whole blocks of 16 values src[i] * scale under the part scale
  // `part` (`inverse` = fl(1 / part)), their scale codes to scales[0..blocks) and their elements to
  // `elements` (8 bytes a block); what the values met is counted into the census, if any. With a dither the
  // elements are rounded stochastically, src[i] taking the random bits of index first + i.
  void (*nv_encode_f32)(const float* src, size_t blocks, float scale, float part, float inverse, uint8_t* scales,
                        uint8_t* elements, Census* census, const Dither* dither, uint64_t first);
  // The values of `blocks` whole blocks under the part scale `part`, into out[0..16 * blocks) (op as MX's).
  void (*nv_decode)(const uint8_t* scales, const uint8_t* elements, size_t blocks, float part, float* out,
                    MxDecodeOp op, float post);
  // out[0..16 * blocks) = the sum in rank order of k ranks' values of `blocks` whole blocks, rank r's
  // scales, elements and part scale at scales[r], elements[r] and parts[r]. Returns the largest finite
  // |sum| (0 for none), found while the sums are in registers.
  float (*nv_sum)(const uint8_t* const* scales, const uint8_t* const* elements, const float* parts, size_t k,
                  size_t blocks, float* out);
  // The block rotation (cpu/rotation.cpp) of `blocks` whole blocks of 16 values: dst = H · D · src / 4 where
  // `forward`, else D · H · src / 4. src and dst may be the same buffer.
  void (*rotate_f32)(const float* src, float* dst, size_t blocks, uint16_t signs, bool forward);
};

// The grid stochastic_fp8_value (stochastic.h) rounds an MX wire's 8-bit element to, for the vector kernels:
// e4m3's or e5m2's smallest normal exponent and significand bits.
struct Fp8Grid {
  explicit Fp8Grid(Wire element)
      : min_exponent(element == Wire::kE4m3 ? -6 : -14), mantissa_bits(element == Wire::kE4m3 ? 3 : 2) {}
  int min_exponent, mantissa_bits;
};

// The integer constants of the vector kernels' round-to-nearest-even to an 8-bit format (Fp8Lanes in
// cpu/avx2.cpp, Fp8Lanes16 in cpu/avx512.cpp): e4m3, e5m2, or e2m1 for kMxfp4 (mantissa 1 bit, bias 1).
struct Fp8Rounding {
  explicit Fp8Rounding(Wire w)
      : Fp8Rounding(w == Wire::kE4m3 ? 3 : w == Wire::kE5m2 ? 2 : 1, w == Wire::kE4m3 ? 7 : w == Wire::kE5m2 ? 15 : 1,
                    w == Wire::kE4m3 ? 0x7F : 0x7C) {}
  Fp8Rounding(int mantissa_bits, int bias, int overflow)
      : shift(23 - mantissa_bits),
        nan_is_overflow(overflow == 0x7F),
        smallest_normal_code(1 << mantissa_bits),
        big_bits((128 - bias - mantissa_bits + 23) << 23),
        half_minus_one((1 << (shift - 1)) - 1),
        rebias((127 - bias) << mantissa_bits),
        top(overflow) {}
  int shift;             // the fp32 significand bits the format drops
  bool nan_is_overflow;  // e4m3: its overflow code is its NaN
  int smallest_normal_code;
  int big_bits;          // a float whose ulp is the format's subnormal step
  int half_minus_one;    // half the dropped bits' weight, less one
  int rebias;            // fp32's exponent bias less the format's, at the format's exponent position
  int top;               // the code of an overflow
};

// The kernels in use (cpu/dispatch.cpp, set_cpu_path).
const CpuKernels& active_kernels();

const CpuKernels& scalar_kernels();
const CpuKernels* avx2_f16c_kernels();  // nullptr when not compiled for x86-64
const CpuKernels* avx512_kernels();     // likewise; the AVX2 table with the 8-bit and block wires' kernels replaced

inline uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

inline float float_of(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// The block wires' random bytes (stochastic.h, block_random_bits) as the vector generators make them, a
// group of kGroup elements (kGroup / 16 Philox blocks) from a multiple of kGroup on: window() gives the
// bytes of elements [index, index + kGroup), keeping the groups it made for the next call, so that a run
// of calls that starts mid-group makes each group once.
template <size_t kGroup>
class RandomByteGroups {
 public:
  // fill(block, to): the kGroup bytes of the Philox blocks from block index `block` (a multiple of
  // kGroup / 16) on, in order, to `to`.
  template <typename Fill>
  const uint8_t* window(uint64_t index, const Fill& fill) {
    constexpr uint64_t kBlocks = kGroup / 16;
    const uint64_t g = index / kGroup;
    const size_t skip = index % kGroup;
    if (!held_ || g != group_) {
      if (held_ && next_held_ && g == group_ + 1) {
        std::memcpy(bytes_, bytes_ + kGroup, kGroup);
      } else {
        fill(g * kBlocks, bytes_);
      }
      group_ = g;
      held_ = true;
      next_held_ = false;
    }
    if (skip && !next_held_) {
      fill((g + 1) * kBlocks, bytes_ + kGroup);
      next_held_ = true;
    }
    return bytes_ + skip;
  }

 private:
  alignas(64) uint8_t bytes_[2 * kGroup];  // group group_'s bytes, then group_ + 1's where next_held_
  uint64_t group_ = 0;
  bool held_ = false, next_held_ = false;
};

// Scalar conversions shared by the vector kernels' tails.
uint16_t f32_to_fp16(float f);
uint16_t f32_to_bf16(float f);
float fp16_to_f32(uint16_t h);
float bf16_to_f32(uint16_t h);

// The scalar frame kernels (cpu/frames.cpp), also the vector kernels' tails.
float scalar_amax_f32(const float* src, size_t n);
void scalar_cast8_f32(const float* src, uint8_t* dst, size_t n, float scale, Wire w);
void scalar_restore8_f32(const uint8_t* src, float* dst, size_t n, float scale, Wire w);
void scalar_scaled_sum_f32(const void* const* in, const float* scales, size_t k, float* dst, size_t n, Wire w);
// The scalar MX block kernels (cpu/mx.cpp), also the definition the vector ones are tested against.
void scalar_mx_encode_f32(const float* src, size_t blocks, float scale, const MxBlockFormat& f, MxScale rule,
                          uint8_t* scales, uint8_t* elements, Census* census, const Dither* dither, uint64_t first);
void scalar_mx_decode(const uint8_t* scales, const uint8_t* elements, size_t blocks, Wire wire, float* out,
                      MxDecodeOp op, float post);
void scalar_mx_sum(const uint8_t* const* scales, const uint8_t* const* elements, size_t k, size_t blocks, Wire wire,
                   float* out);
// The scalar NVFP4 block kernels (cpu/nvfp4.cpp), the definition the vector ones are tested against.
void scalar_nv_encode_f32(const float* src, size_t blocks, float scale, float part, float inverse, uint8_t* scales,
                          uint8_t* elements, Census* census, const Dither* dither, uint64_t first);
void scalar_nv_decode(const uint8_t* scales, const uint8_t* elements, size_t blocks, float part, float* out,
                      MxDecodeOp op, float post);
float scalar_nv_sum(const uint8_t* const* scales, const uint8_t* const* elements, const float* parts, size_t k,
                    size_t blocks, float* out);
// The scalar block rotation (cpu/rotation.cpp), the definition the vector ones are tested against.
void scalar_rotate_f32(const float* src, float* dst, size_t blocks, uint16_t signs, bool forward);
// The values of e2m1's 16 codes (sign in bit 3).
extern const float kE2m1Values[16];
// The 256 values of an 8-bit format, exactly.
const float* fp8_values(Wire w);
uint8_t to_fp8(float f, Wire w);
// Largest |x| as the bits of a non-negative float: any NaN's bits exceed infinity's.
inline float amax_of_bits(uint32_t bits) { return bits > 0x7F800000u ? __builtin_nanf("") : float_of(bits); }

// This thread's census (CensusScope).
struct CensusSink {
  Census* census = nullptr;
  size_t stride = 0;
};
CensusSink& census_sink();

using formats::overflow_limit;

// Counts a value about to be cast to a wire whose overflow starts at `limit`.
inline void tally(float v, float limit, Census& c) {
  const float a = __builtin_fabsf(v);
  if (!(a <= 3.40282347e38f)) {
    ++c.nonfinite;
  } else if (a >= limit) {
    ++c.saturated;
  }
}

// Adds the error of one sampled value: `wire` is what `value` became on the wire, widened. Values
// that are not finite, or became so, are counted elsewhere and left out of the error.
inline void sample(float value, float wire, Census& c) {
  if (!(__builtin_fabsf(value) <= 3.40282347e38f) || !(__builtin_fabsf(wire) <= 3.40282347e38f)) return;
  const double e = double(wire) - double(value);
  c.error_squared += e * e;
  c.value_squared += double(value) * double(value);
  ++c.samples;
}

inline uint16_t to_wire(float f, Wire w) { return w == Wire::kFp16 ? f32_to_fp16(f) : f32_to_bf16(f); }
inline float from_wire(uint16_t h, Wire w) { return w == Wire::kFp16 ? fp16_to_f32(h) : bf16_to_f32(h); }

}  // namespace cnccl::compress::detail

// The scalar definitions of the 8-bit conversions, MX block scales and power-of-two frame exponents
// (codec.h, backend/frames.h), compiled for the CPU kernels and the CUDA ones (cuda/frames.cu) from
// this one source: both round the same way by construction. The CPU's vector kernels are tested bit
// for bit against the scalar ones built on these, the CUDA kernels against the CPU's.
#pragma once

#include <cstdint>
#include <cstring>

#include "compress/codec.h"
#include "compress/stochastic.h"

namespace cnccl::compress::formats {

CNCCL_HOST_DEVICE uint32_t bits_of(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
#endif
}

CNCCL_HOST_DEVICE float float_of(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
#endif
}

// 2^e as fp32 for e in [-126, 127], built from its bits (no math library's exp2).
CNCCL_HOST_DEVICE float power_of_two(int e) { return float_of(uint32_t(e + 127) << 23); }

constexpr uint32_t kQuietNan = 0x7FC00000u, kInfinity = 0x7F800000u;

// An 8-bit format: mantissa bits, exponent bias, and the code of anything that rounds past its
// largest finite value. e5m2: inf. e4m3 has no inf: NaN, not torch's saturation to 448, so that an
// overflow (an inf gradient) stays visible.
struct Fp8 {
  uint32_t mantissa_bits;
  uint32_t bias;
  uint8_t overflow;
};
// e4m3 for kE4m3 and kMxfp8's elements, e5m2 for kE5m2 and kMxfp8E5m2's.
CNCCL_HOST_DEVICE Fp8 fp8_format(Wire w) {
  return w == Wire::kE4m3 || w == Wire::kMxfp8 ? Fp8{3, 7, 0x7F} : Fp8{2, 15, 0x7C};
}

// f rounded to nearest even in the format; NaN stays NaN.
CNCCL_HOST_DEVICE uint8_t fp8_code(float f, Fp8 fp8) {
  const uint32_t x = bits_of(f);
  const uint8_t sign = static_cast<uint8_t>((x >> 24) & 0x80u);
  const uint32_t ax = x & 0x7FFFFFFFu;
  if (ax > kInfinity) return sign | 0x7F;
  const uint32_t shift = 23 - fp8.mantissa_bits;
  const uint32_t min_normal = (128 - fp8.bias) << 23;  // 2^(1 - bias)
  if (ax < min_normal) {
    // Below the smallest normal the step is 2^(1 - bias - m): adding 2^(1 - bias - m + 23) makes the
    // fp32 adder round there, to nearest even, and the low bits are the 8-bit code (up to the
    // smallest normal, whose code follows the subnormals').
    const float big = float_of((128 - fp8.bias - fp8.mantissa_bits + 23) << 23);
    return sign | static_cast<uint8_t>(bits_of(float_of(ax) + big) - bits_of(big));
  }
  const uint32_t rounded = ax + ((1u << (shift - 1)) - 1) + ((ax >> shift) & 1u);
  const uint32_t code = (rounded >> shift) - ((127 - fp8.bias) << fp8.mantissa_bits);
  return sign | static_cast<uint8_t>(code >= fp8.overflow ? fp8.overflow : code);
}

// The value of a code, exactly.
CNCCL_HOST_DEVICE float fp8_value(uint8_t code, Fp8 fp8) {
  const uint32_t magnitude = code & 0x7Fu, exponent = magnitude >> fp8.mantissa_bits;
  const uint32_t mantissa = magnitude & ((1u << fp8.mantissa_bits) - 1);
  float v;
  if (magnitude == 0x7F || (fp8.overflow == 0x7C && exponent == (0x7Fu >> fp8.mantissa_bits) && mantissa)) {
    v = float_of(kQuietNan);
  } else if (fp8.overflow == 0x7C && magnitude == 0x7C) {
    v = float_of(kInfinity);
  } else if (exponent == 0) {
    v = static_cast<float>(mantissa) * power_of_two(1 - int(fp8.bias) - int(fp8.mantissa_bits));
  } else {
    v = static_cast<float>(mantissa | (1u << fp8.mantissa_bits)) *
        power_of_two(int(exponent) - int(fp8.bias) - int(fp8.mantissa_bits));
  }
  return code & 0x80 ? -v : v;
}

// e2m1's codes of the magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6, rounding a in [0, 6] to nearest even:
// a tie goes to the even code (0.25 to 0, 0.75 to 1, 1.25 to 1, 1.75 to 2, 2.5 to 2, 3.5 to 4, 5 to 4).
CNCCL_HOST_DEVICE uint8_t e2m1_code(float a) {
  return uint8_t((a > 0.25f) + (a >= 0.75f) + (a > 1.25f) + (a >= 1.75f) + (a > 2.5f) + (a >= 3.5f) + (a > 5.0f));
}

// The value of an e2m1 code (sign in bit 3): exponent 0 is 0 or 0.5, e > 0 is (2 + m) * 2^(e - 2).
CNCCL_HOST_DEVICE float e2m1_value(uint8_t code) {
  const uint32_t e = (code >> 1) & 3u, m = code & 1u;
  const float magnitude = e == 0 ? 0.5f * float(m) : float(2 + m) * power_of_two(int(e) - 2);
  return code & 8 ? -magnitude : magnitude;
}

// An MX run of `count` values: its blocks (a scale byte each), then its elements' bytes (e2m1: two a byte).
CNCCL_HOST_DEVICE size_t mx_blocks(size_t count) { return (count + kMxBlock - 1) / kMxBlock; }
CNCCL_HOST_DEVICE size_t mx_element_bytes(size_t count, Wire wire) {
  return wire == Wire::kMxfp4 ? (count + 1) / 2 : count;
}

// The scale 2^X of an MX block's code X + 127: 0xFF is NaN (a non-finite block), 0 the subnormal 2^-127.
CNCCL_HOST_DEVICE float mx_scale_value(uint8_t code) {
  if (code == 0xFF) return float_of(kQuietNan);
  return code ? float_of(uint32_t(code) << 23) : float_of(0x00400000u);
}

// A finite block's X from the bits of its amax (codec.h, MxScale): floor(log2(amax)) is amax's exponent
// field less the bias; a subnormal or zero amax gives -127, which the clamp keeps where the true floor
// (below -127) would have gone. RCEIL's increment comes before the clamp: below it, the clamp's -127
// already holds L * 2^X >= amax.
// `emax` and `fraction`: the wire's mx_emax and mx_largest_fraction.
CNCCL_HOST_DEVICE int mx_exponent(uint32_t amax, int emax, uint32_t fraction, MxScale rule) {
  const int rceil = rule == MxScale::kRceil && (amax & 0x7FFFFFu) > fraction;
  const int x = int(amax >> 23) - 127 - emax + rceil;
  return x < -127 ? -127 : x > 127 ? 127 : x;
}

// The exponent of the largest binade of a frame's wire (fp16 15, bf16 127, e4m3 8, e5m2 15; MX: its
// elements').
CNCCL_HOST_DEVICE int frame_emax(Wire wire) {
  switch (wire) {
    case Wire::kFp16: return 15;
    case Wire::kBf16: return 127;
    case Wire::kE4m3: return 8;
    case Wire::kE5m2: return 15;
    default: return mx_emax(wire);
  }
}

// The smallest magnitude that a wire's round-to-nearest-even takes past its largest value: 65520
// (fp16), bf16's largest value plus half its step (0x7F7F8000, whose tie rounds to the even inf), and
// for the frames' 8-bit casts the float after 464 (e4m3's tie at 464 rounds to the even 448; past it,
// NaN) and 61440 (e5m2: inf, the tie rounding away from the odd 57344). What telemetry counts as
// saturated (docs/design.md, "Telemetry").
CNCCL_HOST_DEVICE float overflow_limit(Wire w) {
  switch (w) {
    case Wire::kFp16: return 65520.0f;
    case Wire::kE4m3: return float_of(0x43E80001u);
    case Wire::kE5m2: return 61440.0f;
    default: return float_of(0x7F7F8000u);
  }
}

// Whether |v| is finite (NaN is not).
CNCCL_HOST_DEVICE bool finite(float v) { return (bits_of(v) & 0x7FFFFFFFu) < kInfinity; }

// --- NVFP4 blocks (codec.h, nv_encode): the operations a block's encoding and decoding are made of, in
// torchao's order, each an fp32 operation rounded to nearest.

constexpr Fp8 kNvScaleFormat{3, 7, 0x7F};  // e4m3, its NaN the code of a block that is not finite
constexpr uint8_t kNvNanScale = 0x7F;

CNCCL_HOST_DEVICE size_t nv_blocks(size_t count) { return (count + kNvBlock - 1) / kNvBlock; }
CNCCL_HOST_DEVICE size_t nv_element_bytes(size_t count) { return (count + 1) / 2; }

// P = max(fl(amax / 2688), 2^-120), amax the part's largest finite |v|.
CNCCL_HOST_DEVICE float nv_part_scale_of(float amax) {
  const float part = amax / 2688.0f, smallest = float_of(7u << 23);
  return part < smallest ? smallest : part;
}

// Whether `part` is a P that nv_part_scale_of gives: [2^-120, FLT_MAX / 2688]. Anything else in a frame's
// header is corrupt.
CNCCL_HOST_DEVICE bool nv_part_is_valid(float part) {
  return part >= float_of(7u << 23) && part <= nv_part_scale_of(float_of(0x7F7FFFFFu));
}

// A finite block's scale code, from the bits of its largest |v|: e4m3(clamp(fl(fl(m / 6) / P), 2^-6, 448)).
CNCCL_HOST_DEVICE uint8_t nv_scale_code(uint32_t amax, float part) {
  const float s = (float_of(amax) / 6.0f) / part, smallest = float_of(0x3C800000u), largest = 448.0f;
  return fp8_code(s < smallest ? smallest : largest < s ? largest : s, kNvScaleFormat);
}

// An element's 4-bit code for q = fl(v * fl(fl(1 / P) / S)): its sign, and e2m1's code of min(|q|, 6),
// rounded to nearest even or, where `stochastic`, by stochastic_e2m1_value with `random`.
CNCCL_HOST_DEVICE uint8_t nv_element_code(float q, bool stochastic, uint32_t random) {
  const float a = fabsf(q), clamped = 6.0f < a ? 6.0f : a;
  const float on_grid = stochastic ? stochastic_e2m1_value(clamped, random) : clamped;
  return uint8_t((bits_of(q) >> 28 & 8u) | e2m1_code(on_grid));
}

// A block's decoding scale fl(P * S); NaN for a block that is not finite.
CNCCL_HOST_DEVICE float nv_block_scale(uint8_t code, float part) { return part * fp8_value(code, kNvScaleFormat); }

// One block's m <= 16 values v, already scaled, under the part scale `part` (`inverse` = fl(1 / part)):
// returns its scale code and writes its elements at `elements` (m / 2 bytes, and a low nibble for an odd
// m); with a dither, element j takes block_random_bits of index `index + j`. A block with a value that is
// not finite gets the NaN code and zero elements. Adds to `nonfinite` its values that are not finite, and
// to `saturated` those past 7, where rounding to nearest would have left 6 (the tie at 7 goes to the even 8).
// The scalar CPU kernel (cpu/nvfp4.cpp) and the CUDA one (cuda/frames.cu) are this function.
CNCCL_HOST_DEVICE uint8_t nv_encode_block(const float* v, size_t m, float part, float inverse, uint8_t* elements,
                                          const Dither* dither, uint64_t index, size_t& nonfinite, size_t& saturated) {
  uint32_t amax = 0;
  size_t bad = 0;
  for (size_t j = 0; j < m; ++j) {
    const uint32_t a = bits_of(v[j]) & 0x7FFFFFFFu;
    amax = a > amax ? a : amax;
    bad += a >= kInfinity;
  }
  if (bad) {
    nonfinite += bad;
    for (size_t j = 0; j < nv_element_bytes(m); ++j) elements[j] = 0;
    return kNvNanScale;
  }
  const uint8_t code = nv_scale_code(amax, part);
  const float reciprocal = inverse / fp8_value(code, kNvScaleFormat);
  const Dither none{};
  BlockRandomBits random(dither ? *dither : none);
  uint8_t low = 0;
  for (size_t j = 0; j < m; ++j) {
    const float q = v[j] * reciprocal;
    saturated += fabsf(q) >= 7.0f;
    const uint8_t e = nv_element_code(q, dither != nullptr, dither ? random(index + j) : 0);
    if (j % 2 == 0) {
      low = e;
    } else {
      elements[j / 2] = uint8_t(low | e << 4);
    }
  }
  if (m % 2) elements[m / 2] = low;
  return code;
}

// The largest |exponent| a frame carries: 2^k and 2^-k are both normal fp32 numbers.
constexpr int kMaxFrameExponent = 126;

// A power-of-two frame's exponent k for the magnitude a = fp32(amax * |scale|) (backend/frames.h): with
// a = m * 2^e, m in [0.5, 1) (frexp's e), k = clamp(emax - e, -126, 126); 0 when a is not finite and
// positive.
CNCCL_HOST_DEVICE int32_t frame_exponent(float a, Wire wire) {
  const uint32_t b = bits_of(a);
  if (!(a > 0) || b >= kInfinity) return 0;
  int e;
  if (b >= 0x00800000u) {
    e = int(b >> 23) - 126;
  } else {  // subnormal: the significand's leading one sets the exponent
#if defined(__CUDA_ARCH__)
    e = (31 - __clz(int(b))) - 148;
#else
    e = (31 - __builtin_clz(b)) - 148;
#endif
  }
  const int k = frame_emax(wire) - e;
  return k < -kMaxFrameExponent ? -kMaxFrameExponent : k > kMaxFrameExponent ? kMaxFrameExponent : k;
}

// The decoding scale 2^-k of a frame's exponent; NaN for one outside [-126, 126], which only corruption
// or another version writes (the CPU kernels name the rank instead; a device reads nothing back).
CNCCL_HOST_DEVICE float frame_decoding_scale(int32_t k) {
  if (k < -kMaxFrameExponent || k > kMaxFrameExponent) return float_of(kQuietNan);
  return power_of_two(-k);
}

}  // namespace cnccl::compress::formats

// cnccl's codec (namespace cnccl::compress): scale-and-cast between wide floats (fp32/fp64) and a 16-bit wire format.
// Pure functions on raw buffers; no torch, no c10d. Rounding is round-to-nearest-even and
// bit-identical to torch's own conversions for every non-NaN value (NaN stays NaN).
#pragma once

#include <cstddef>
#include <cstdint>

// The small definitions both the CPU kernels and the CUDA ones use (here, formats.h, stochastic.h) are
// compiled for both.
#if defined(__CUDACC__)
#define CNCCL_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define CNCCL_HOST_DEVICE inline
#endif

namespace cnccl::compress {

// The 16-bit formats are what this codec's kernels take. The 8-bit ones (fp8 e4m3 with no
// infinities, and e5m2) travel only inside power-of-two frames (backend/frames.h), which encode
// them with torch's own fp8 conversions; passing one to a kernel here is a bug. The MX formats
// (OCP Microscaling v1.0) travel only as blocks (mx_encode below): MXFP8 with e4m3 elements
// (kMxfp8) or e5m2 ones, MXFP4 with e2m1 elements, two a byte. NVFP4 (kNvfp4) travels as blocks of 16
// e2m1 elements under an e4m3 scale each and one fp32 scale a part (nv_encode below).
enum class Wire : uint8_t { kFp16, kBf16, kE4m3, kE5m2, kMxfp8, kMxfp8E5m2, kMxfp4, kNvfp4 };

CNCCL_HOST_DEVICE bool is_mx(Wire wire) {
  return wire == Wire::kMxfp8 || wire == Wire::kMxfp8E5m2 || wire == Wire::kMxfp4;
}

// The wires whose blocks carry their own scales: what the owner decodes before it adds, and what has no
// meaning for MIN or MAX.
CNCCL_HOST_DEVICE bool is_blocks(Wire wire) { return is_mx(wire) || wire == Wire::kNvfp4; }

// Bytes of one element on the wire, for the formats that are not blocks.
CNCCL_HOST_DEVICE size_t wire_bytes(Wire wire) { return wire == Wire::kFp16 || wire == Wire::kBf16 ? 2 : 1; }

// What a cast met, counted when the caller asks (cnccl.stats(): docs/design.md, "Telemetry"):
// values that were not finite when cast, and finite values past the wire's largest magnitude, which
// became inf (fp16, bf16) or were saturated to the largest magnitude (MX elements).
// Every stride-th value a cast writes is also compared with the value it was cast from: the squared
// error and the squared value, summed, give the cast's relative L2 error.
struct Census {
  uint64_t nonfinite = 0;
  uint64_t saturated = 0;
  uint64_t samples = 0;
  double error_squared = 0;
  double value_squared = 0;
};

// While it lives, the casts of this thread (cast(), cast_add(), mx_encode() and their stochastic and
// 8-bit forms) count into `into` (nullptr: nothing is counted), and sample every `sample_stride`-th
// value of each call from its first (0: none). Scopes nest; an inner one hides the outer.
class CensusScope {
 public:
  CensusScope(Census* into, size_t sample_stride);
  ~CensusScope();
  CensusScope(const CensusScope&) = delete;
  CensusScope& operator=(const CensusScope&) = delete;

 private:
  Census* saved_census_;
  size_t saved_stride_;
};
// While it lives, this thread's casts are counted but not sampled: an owner's encoding of a sum is
// not the rank's own contribution, whose error the samples measure.
class CensusSamplesPaused {
 public:
  CensusSamplesPaused();
  ~CensusSamplesPaused();
  CensusSamplesPaused(const CensusSamplesPaused&) = delete;
  CensusSamplesPaused& operator=(const CensusSamplesPaused&) = delete;

 private:
  size_t saved_stride_;
};
// While it lives, this thread computes with fp32 subnormals (clears MXCSR's FTZ and DAZ; restores them
// after). Every public kernel keeps them, as the CUDA kernels and the definition do: MX blocks scaled by
// 2^-127, frames' values times 2^-k, bf16's subnormals widened. A group's threads take its creator's
// floating-point settings, which may flush (torch.set_flush_denormal sets FTZ and DAZ): the kernels, and
// the backend's own arithmetic on a defined result's bits (frame exponents, a level's fp32 sums), hold one.
class GradualUnderflow {
 public:
  GradualUnderflow();
  ~GradualUnderflow();
  GradualUnderflow(const GradualUnderflow&) = delete;
  GradualUnderflow& operator=(const GradualUnderflow&) = delete;

 private:
  unsigned saved_ = 0;
};
// Counts n values src[i] * scale as a cast to `wire` meets them into this thread's census, if any:
// for the callers that know a cast met values it did not count (an 8-bit frame, which counts nothing
// while its exponent keeps every value in range, and only then).
void count_casts(const float* src, size_t n, float scale, Wire wire);
void count_casts(const double* src, size_t n, float scale, Wire wire);

// CPU implementations; the fastest one the processor supports is chosen at first use. kAvx512 is
// kAvx2F16c with the 8-bit wires' kernels (frame casts and sums; MX and NVFP4 encode, decode and sums) on
// 16 lanes (AVX-512 F, BW, VL).
enum class CpuPath : uint8_t { kScalar, kAvx2F16c, kAvx512 };
inline constexpr CpuPath kCpuPaths[] = {CpuPath::kScalar, CpuPath::kAvx2F16c, CpuPath::kAvx512};

const char* wire_name(Wire wire);
const char* cpu_path_name(CpuPath path);
bool cpu_path_supported(CpuPath path);
CpuPath cpu_path();
// Forces an implementation (tests, benchmarks). Throws std::invalid_argument if unsupported.
void set_cpu_path(CpuPath path);

// dst[i] = round16(src[i] * scale). The product is formed in the source precision (fp64 inputs
// then pass through fp32 first, exactly as torch's double->Half/BFloat16 conversion does).
void cast(const float* src, uint16_t* dst, size_t n, float scale, Wire wire);
void cast(const double* src, uint16_t* dst, size_t n, float scale, Wire wire);

// dst[i] = widen(src[i]) * scale: the restore into the caller's wide buffer.
void restore(const uint16_t* src, float* dst, size_t n, float scale, Wire wire);
void restore(const uint16_t* src, double* dst, size_t n, float scale, Wire wire);

// acc[i] = round16(widen(acc[i]) + widen(in[i])): one rounding per add, like NCCL's 16-bit sum.
void add(uint16_t* acc, const uint16_t* in, size_t n, Wire wire);

// acc[i] = round16(widen(round16(src[i] * scale)) + widen(in[i])): cast then add in one pass over
// memory, bit-identical to cast() into acc followed by add(). The host ring uses it to fold the
// cast of a part into that part's first reduction.
void cast_add(const float* src, const uint16_t* in, uint16_t* acc, size_t n, float scale, Wire wire);

// dst[i] = round16(((widen(in[0][i]) + widen(in[1][i])) + ...) + widen(in[k-1][i])): the inputs
// summed in fp32 in the order given, rounded once. At k = 2 this equals add() bit for bit (fp32
// holds more than twice a 16-bit significand plus two bits, so rounding twice is exact); at
// k > 2 it is the more accurate sum the shared-memory path defines (docs/design.md).
void sum(const uint16_t* const* in, size_t k, uint16_t* dst, size_t n, Wire wire);
// dst[i] = ((widen(in[0][i]) + widen(in[1][i])) + ...) + widen(in[k-1][i]) in fp32, not rounded:
// a reduce_scatter with fp32 accumulation writes it straight into its wide output.
void sum(const uint16_t* const* in, size_t k, float* dst, size_t n, Wire wire);

// Power-of-two frames on the CPU (backend/frames.h defines them; cpu/frames.cpp, vector forms in cpu/avx2.cpp).
// max |src[i]| over n elements, 0 for none; NaN if any element is NaN.
float amax(const float* src, size_t n);
double amax(const double* src, size_t n);
// dst[i] = round8(src[i] * scale) for the 8-bit wires, the product formed as cast() forms it;
// round-to-nearest-even, bit-identical to torch's conversions except past the largest value: e5m2
// overflows to inf as torch does, e4m3 (no infinities) to NaN where torch saturates at +-448, so that
// an inf input never comes back finite; NaN stays NaN.
void cast(const float* src, uint8_t* dst, size_t n, float scale, Wire wire);
void cast(const double* src, uint8_t* dst, size_t n, float scale, Wire wire);
// dst[i] = widen(src[i]) * scale for the 8-bit wires, as restore() above.
void restore(const uint8_t* src, float* dst, size_t n, float scale, Wire wire);
void restore(const uint8_t* src, double* dst, size_t n, float scale, Wire wire);
// dst[i] = ((widen(in[0][i]) * scales[0] + widen(in[1][i]) * scales[1]) + ...) + widen(in[k-1][i]) *
// scales[k-1], in fp32 (each product rounded, then each add): the owner's sum of k frames, on any
// wire (in[r] points at 16-bit or 8-bit values).
void scaled_sum(const void* const* in, const float* scales, size_t k, float* dst, size_t n, Wire wire);

// OCP Microscaling (MX v1.0) blocks on the CPU (cpu/mx.cpp; docs/design.md, "MX blocks"). n values are
// ceil(n / 32) blocks of 32, the last one short; their bytes (mx_bytes) are the blocks' E8M0 scales,
// then the elements: one byte each, or for MXFP4 two a byte, element 2j in the low nibble and an odd
// count's last high nibble zero. A block's values v (src[i] * scale, formed as cast() forms it) with
// amax their largest |v| get the scale 2^X, stored as X + 127, with X by the block's MxScale rule
// (below); each element is v * 2^-X rounded to nearest even after saturating to the element type's
// largest magnitude. A block with a value that is not finite has the scale 0xFF (NaN) and zero
// elements: it decodes to NaN.
// How a block's X is chosen, from amax's exponent E = floor(log2(amax)) and the element type's emax
// (e4m3 8, e5m2 15, e2m1 2) and largest magnitude L (448, 57344, 6):
// - kRceil: the smallest X with amax <= L * 2^X, clamped to [-127, 127]: ceil(log2(amax / L)), as NVIDIA's
//   hardware rounds the quotient up to a power of two (cvt.rp.satfinite.ue8m0x2) and torchao's
//   ScaleCalculationMode.RCEIL. No element saturates. In bits: X = E - emax, plus one when amax's
//   significand exceeds L's (1.75 for e4m3 and e5m2, 1.5 for e2m1).
// - kFloor: X = clamp(E - emax, -127, 127), OCP MX v1.0's rule and torchao's FLOOR: a block whose amax's
//   significand exceeds L's saturates its largest values.
// amax zero or an fp32 subnormal gives X = -127 under both.
enum class MxScale : uint8_t { kRceil, kFloor };
const char* mx_scale_name(MxScale rule);
inline constexpr size_t kMxBlock = 32;
size_t mx_bytes(size_t n, Wire wire);
// The exponent of an MX element type's largest binade (e4m3 8, e5m2 15, e2m1 2), and its largest
// magnitude (448, 57344, 6).
CNCCL_HOST_DEVICE int mx_emax(Wire wire) { return wire == Wire::kMxfp8 ? 8 : wire == Wire::kMxfp8E5m2 ? 15 : 2; }
CNCCL_HOST_DEVICE float mx_largest(Wire wire) {
  return wire == Wire::kMxfp8 ? 448.0f : wire == Wire::kMxfp8E5m2 ? 57344.0f : 6.0f;
}
// Writes the mx_bytes(count) of a run of `count` values, the n <= count of src and then +0s.
void mx_encode(const float* src, size_t n, size_t count, float scale, Wire wire, MxScale rule, uint8_t* dst);
void mx_encode(const double* src, size_t n, size_t count, float scale, Wire wire, MxScale rule, uint8_t* dst);
// The bits of L's significand past its leading one (1.75: 0x600000; 1.5: 0x400000): kRceil adds one to X
// when amax's exceed them.
CNCCL_HOST_DEVICE uint32_t mx_largest_fraction(Wire wire) { return wire == Wire::kMxfp4 ? 0x400000u : 0x600000u; }
// dst[i] = ((decode(in[0])[i] + decode(in[1])[i]) + ...) + decode(in[k-1])[i] in fp32; decoding,
// element times 2^X, is exact.
void mx_sum(const uint8_t* const* in, size_t k, float* dst, size_t n, Wire wire);
// The run mx_encode(sums, n, n, 1.0f, wire, rule, dst) writes, sums being mx_sum's of in[0..k): an
// owner's sum framed again, its sums never in memory whole. Counts what the encoding meets into this
// thread's census, and takes no samples.
void mx_sum_encode(const uint8_t* const* in, size_t k, size_t n, Wire wire, MxScale rule, uint8_t* dst);
// dst[i] = T(decode(src)[i]) * T(post) in dst's precision T, for the first n <= count elements of
// the run of `count` at src.
void mx_restore(const uint8_t* src, size_t count, float* dst, size_t n, float post, Wire wire);
void mx_restore(const uint8_t* src, size_t count, double* dst, size_t n, float post, Wire wire);

// NVFP4 blocks on the CPU (cpu/nvfp4.cpp; docs/design.md, "NVFP4 blocks"), torchao's nvfp4_quantize with a
// per-tensor scale, the tensor being a part. A run of n values is ceil(n / 16) blocks of 16, the last one
// short; its bytes (nv_bytes) are the blocks' e4m3 scale codes, then the e2m1 elements, two a byte (element
// 2j in the low nibble, an odd count's last high nibble zero). With v = src[i] * scale (formed as cast()
// forms it) and the part's scale P (nv_part_scale), a block whose values are all finite, m its largest |v|:
//   S = e4m3(clamp(fl(fl(m / 6) / P), 2^-6, 448)), rounded to nearest even;
//   element = e2m1(clamp(fl(v * fl(fl(1 / P) / S)), -6, 6)), rounded to nearest even (e2m1_code's ties);
// it decodes to fl(e2m1 * fl(P * S)). A block with a value that is not finite has the scale code 0x7F
// (e4m3's NaN) and zero elements: it decodes to NaN.
inline constexpr size_t kNvBlock = 16;
size_t nv_bytes(size_t n);
// P = max(fl(a / 2688), 2^-120) for a the largest finite |src[i] * scale| (0 for none): the largest
// block's scale lands at 448 = 2688 / 6, and the floor keeps fl(1 / P) / S finite for a part of zeros or
// of values below 2^-108.
float nv_part_scale(float amax);
float nv_part_scale(const float* src, size_t n, float scale);
float nv_part_scale(const double* src, size_t n, float scale);
// Writes the nv_bytes(count) of a run of `count` values, the n <= count of src and then +0s, under the
// part scale `part`.
void nv_encode(const float* src, size_t n, size_t count, float scale, float part, uint8_t* dst);
void nv_encode(const double* src, size_t n, size_t count, float scale, float part, uint8_t* dst);
// dst[i] = ((decode(in[0])[i] + decode(in[1])[i]) + ...) + decode(in[k-1])[i] in fp32, in[r]'s part
// scale parts[r]. Returns the largest finite |dst[i]| (0 for none), from which nv_part_scale gives the
// sums' part scale.
float nv_sum(const uint8_t* const* in, const float* parts, size_t k, float* dst, size_t n);
// Writes the run nv_encode(sums, n, n, 1.0f, nv_part_scale(a), dst) writes, sums being nv_sum's of
// in[0..k) and a the largest finite |sum|, and returns that part scale: an owner's sum encoded again, its
// sums never in memory whole. Counts what the encoding meets into this thread's census, and takes no samples.
float nv_sum_encode(const uint8_t* const* in, const float* parts, size_t k, size_t n, uint8_t* dst);
// dst[i] = T(decode(src)[i]) * T(post) in dst's precision T, for the first n <= count values of the run
// of `count` at src.
void nv_restore(const uint8_t* src, size_t count, float part, float* dst, size_t n, float post);
void nv_restore(const uint8_t* src, size_t count, float part, double* dst, size_t n, float post);

// The block rotation (cpu/rotation.cpp; docs/design.md, "Block rotation"): each whole block of 16 values
// becomes y = H · D · x / 4, H the 16 x 16 Sylvester Hadamard matrix (entries +-1) and D the diagonal of
// signs (bit j of `signs` set: D's j-th entry is -1); orthonormal, so unrotate(), x = D · H · y / 4, undoes
// it up to rounding. H · v is formed by butterflies at strides 1, 2, 4, 8 (each pair (a, b) becoming
// (a + b, a - b)), each add rounded in the values' precision; the sign and the 1/4 are exact (but among
// subnormals). The last n % 16 values are copied as they are. src and dst may be the same buffer.
inline constexpr size_t kRotationBlock = 16;
// D's signs for a seed: the low 16 bits of the first word of Philox4x32-10 keyed by the seed at the
// counter (2^32 - 1, 2^32 - 1, 2^32 - 1, 2^32 - 1), which no stochastic rounding uses (compress/stochastic.h).
uint16_t rotation_signs(uint64_t seed);
void rotate(const float* src, float* dst, size_t n, uint16_t signs);
void rotate(const double* src, double* dst, size_t n, uint16_t signs);
void unrotate(const float* src, float* dst, size_t n, uint16_t signs);
void unrotate(const double* src, double* dst, size_t n, uint16_t signs);

}  // namespace cnccl::compress

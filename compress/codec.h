// cnccl's codec (namespace cnccl::compress): scale-and-cast between wide floats (fp32/fp64) and a 16-bit wire format.
// Pure functions on raw buffers; no torch, no c10d. Rounding is round-to-nearest-even and
// bit-identical to torch's own conversions for every non-NaN value (NaN stays NaN).
#pragma once

#include <cstddef>
#include <cstdint>

namespace cnccl::compress {

// The 16-bit formats are what this codec's kernels take. The 8-bit ones (fp8 e4m3 with no
// infinities, and e5m2) travel only inside power-of-two frames (backend/frames.h), which encode
// them with torch's own fp8 conversions; passing one to a kernel here is a bug.
enum class Wire : uint8_t { kFp16, kBf16, kE4m3, kE5m2 };

// Bytes of one element on the wire.
inline size_t wire_bytes(Wire wire) { return wire == Wire::kFp16 || wire == Wire::kBf16 ? 2 : 1; }

// CPU implementations; the fastest one the processor supports is chosen at first use.
enum class CpuPath : uint8_t { kScalar, kAvx2F16c };

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

// Power-of-two frames on the CPU (backend/frames.h defines them; cpu_frames.cpp, scalar).
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

}  // namespace cnccl::compress

// Power-of-two frames (docs/design.md, "Numerics: scaling=pow2 and the 8-bit wires"): how a part
// of a compressed sum travels when scaling=pow2. A frame is a 4-byte header, the int32 exponent k,
// then the part's values times 2^k in the wire format, padded to 4 bytes. The sender picks k from
// the part's own amax, so nothing is agreed beforehand and no round trip is added; the receiver
// decodes exactly.
//
// Written with ATen operations, which run on the frames' own device (CUDA: on its current stream)
// without reading anything back to the host: one definition for the host path, gloo and NCCL.
// Every step is an fp32 multiplication by a power of two or torch's own round-to-nearest-even
// conversion, so a test's emulation in plain torch gives the same bits.
#pragma once

#include <ATen/ATen.h>

#include <vector>

#include "compress/codec.h"

namespace cnccl::frames {

// The torch dtype of a wire format's values.
at::ScalarType wire_dtype(compress::Wire wire);

// Bytes of a frame holding `count` elements of `wire`.
int64_t frame_bytes(int64_t count, compress::Wire wire);

// The exponent each part takes: with y the part's values (fp32) and amax = max |y|, finite and
// non-zero, k = clamp(emax - e, -126, 126), where amax = m * 2^e with m in [0.5, 1) and emax is
// the exponent of the wire's largest binade (fp16 15, bf16 127, e4m3 8, e5m2 15); else k = 0. Then
// amax * 2^k lies in [2^(emax-1), 2^emax): one binade of headroom, so rounding never overflows.
// `amax`: fp32, one per part; returns int32.
at::Tensor exponents(const at::Tensor& amax, compress::Wire wire);

// Writes frames[r] (a uint8 [rows, frame_bytes] tensor) from wide[r] (fp32 or fp64, [rows, count]):
// y = fp32(wide * scale) (the product in wide's precision), k from y's amax, then round(y * 2^k).
void encode(const at::Tensor& wide, double scale, compress::Wire wire, const at::Tensor& frames);

// The values frames[r] hold: fp32 [rows, count], widen(payload) * 2^-k.
at::Tensor decode(const at::Tensor& frames, int64_t count, compress::Wire wire);

// fp32 [count]: the decoded values of `frames` (one a rank, rank 0 first) added in fp32 in that
// order.
at::Tensor sum(const std::vector<at::Tensor>& frames, int64_t count, compress::Wire wire);

}  // namespace cnccl::frames

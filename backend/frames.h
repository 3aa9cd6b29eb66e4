// Power-of-two frames (docs/design.md, "Numerics"): how a part of a compressed sum travels when
// scaling=pow2. A frame is a 4-byte header, the int32 exponent k, then the part's values times 2^k in
// the wire format, padded to 4 bytes. The sender picks k from the part's own amax, so nothing is
// agreed beforehand and no round trip is added; the receiver decodes exactly.
//
// These functions are the CPU kernels' form, on CPU tensors (compress/codec.h). The composed path's CUDA
// device runs CUDA kernels of the same definition (compress/cuda/codec.h, frame_*), both built on the
// scalar conversions of compress/formats.h; tests/cpp/test_frames.cpp holds the CPU form to an emulation
// in ATen operations and, on a GPU, the CUDA kernels to the CPU form. One difference: a NaN's bytes (its
// sign, its payload) may differ between the two; it decodes as NaN on both.
#pragma once

#include <ATen/ATen.h>

#include <vector>

#include "compress/codec.h"
#include "compress/stochastic.h"

namespace cnccl::frames {

// The torch dtype of a wire format's values.
at::ScalarType wire_dtype(compress::Wire wire);

// Bytes of a frame holding `count` elements of `wire`.
int64_t frame_bytes(int64_t count, compress::Wire wire);

// Writes frames[r] (uint8 [rows.size(), frame_bytes(count)]) from rows[r] (fp32 or fp64, flat, at most
// `count` elements; a shorter row is padded with zeros) times `scale` (s = fp32(scale)). With
// a = fp32(max_i |rows[r][i]| * |s|) (the product formed in the row's precision): if a is finite and
// non-zero, a = m * 2^e with m in [0.5, 1) and k = clamp(emax - e, -126, 126), emax the exponent of the
// wire's largest binade (fp16 15, bf16 127, e4m3 8, e5m2 15); else k = 0. The payload is
// compress::cast(rows[r], s * 2^k): each value times that exact scale, rounded to the wire. The
// largest lands in [2^(emax-1), 2^emax): rounding up never overflows. An MX wire's frame is its blocks,
// each scaled by `mx_scale`'s rule (compress::mx_encode); other wires ignore it.
// `dither`: a block frame's elements (MX, NVFP4) rounded stochastically (compress/stochastic.h), row r's
// value i taking the bits of index r x count + i; other wires ignore it.
void encode(const std::vector<at::Tensor>& rows, int64_t count, double scale, compress::Wire wire,
            compress::MxScale mx_scale, const at::Tensor& frames, const compress::Dither* dither = nullptr);
// `flat` cut into `parts` rows of `count` elements (the last ones short or empty).
std::vector<at::Tensor> parts_of(const at::Tensor& flat, int64_t parts, int64_t count);

// out (fp32 [count], contiguous) = each frame's values widened and multiplied by 2^-k, added in fp32
// in the order given (one frame a rank, rank 0 first): compress::scaled_sum. Returns out.
// Frames come from peers: an exponent outside [-126, 126] throws a DistBackendError naming the rank
// (the frame's row); the CUDA kernels, which read nothing back, make that frame's values NaN.
// restore() alike, its rows being the owners' frames, row r from rank r.
at::Tensor sum(const std::vector<at::Tensor>& frames, int64_t count, compress::Wire wire, const at::Tensor& out);

// out (one frame, bytes contiguous) = encode({sum(frames' rows)}, count, 1, wire, mx_scale): the owner's
// sum framed again, without the sums ever in memory whole. `out` may be one of the rows of `frames`
// ([ranks, frame_bytes(count)], rows of contiguous bytes).
// `dither`: as encode()'s, value i taking the bits of index first + i.
void sum_encode(const at::Tensor& frames, int64_t count, compress::Wire wire, compress::MxScale mx_scale,
                const at::Tensor& out, const compress::Dither* dither = nullptr, uint64_t first = 0);

// Writes the values of `frames` ([rows, frame_bytes(count)], row after row) into `dst` (fp32 or fp64,
// any strides, at most rows * count elements): widen(payload) * fp32(post_scale * 2^-k), multiplied
// in dst's precision as compress::restore does.
void restore(const at::Tensor& frames, int64_t count, compress::Wire wire, double post_scale, const at::Tensor& dst);

// --- An NVFP4 frame (compress::nv_encode) is a header, the part scale P as fp32 bits then zeros up to a
// block's bytes, followed by the part's run of blocks, padded to 4 bytes. encode() takes P from the row
// (compress::nv_part_scale), sum_encode() from the sums, and `mx_scale` means nothing to it.

// The header's bytes: one block's (16 elements: 9 bytes), so that a frame cuts into whole blocks.
int64_t nv_header_bytes();
void write_nv_header(float part, uint8_t* dst);
// The part scale in the header of rank `sender`'s frame; one that nv_part_scale cannot give throws a
// DistBackendError naming the rank.
float nv_header(const uint8_t* frame, int64_t sender);

// --- A power-of-two frame in pieces, for the host path's pipelined reductions (the CPU kernels).
// A piece is bytes [from, from + len) of a frame, cut at multiples of the wire's element bytes (the
// 4-byte header is whole elements of every wire). Piece by piece, these write and add the bits
// encode() and sum() do: every value is cast, decoded and added on its own.

// Where a frame's values start: the header's bytes.
int64_t payload_offset(compress::Wire wire);
// The exponent k that encode() writes into the header of `row`'s frame (fp32 or fp64, contiguous),
// counting the row's casts where encode() counts them.
int32_t row_exponent(const at::Tensor& row, double scale, compress::Wire wire);
// The same of a row held in pieces, one after another (contiguous each, one dtype): a reduce_scatter's
// part made of several ranks' outputs, read where they are.
int32_t row_exponent(const std::vector<at::Tensor>& pieces, double scale, compress::Wire wire);
// row_exponent(sums, 1, wire) of an owner's fp32 sums whose largest |value| (NaN if any is) is known:
// the largest of what sum_pieces returned. The sums are read again only to count casts where the
// amax is not finite.
int32_t sum_exponent(float amax, const at::Tensor& sums, compress::Wire wire);
// Bytes [from, from + len) of the frame encode() writes for `row` (its missing values up to `count`
// +0) with exponent k, into dst.
void encode_piece(const at::Tensor& row, int32_t k, double scale, compress::Wire wire, int64_t count, int64_t from,
                  int64_t len, uint8_t* dst);
// The owner's sum of bytes [from, from + len) of each rank's frame of `count` values (pieces[r] from
// rank r), in rank order as sum() adds: out[(b - from) / element bytes] for each value's byte b;
// header and padding write nothing. The piece from 0 holds the headers: their exponents, checked as
// sum() checks them, go to k[r], which every later piece of the frames reads. Returns the largest |sum|
// it wrote (NaN if any is NaN; 0 if it wrote none), read while the piece is in cache.
float sum_pieces(const uint8_t* const* pieces, int64_t ranks, int32_t* k, compress::Wire wire, int64_t count,
                 int64_t from, int64_t len, float* out);
// Restores bytes [from, from + len) of rank `sender`'s frame of `count` values as restore() does:
// value i to dst[i] (fp32 or fp64 as `dtype` says), for i < given. The piece from 0 holds the header:
// its exponent, checked as restore() checks it, goes to *k, which every later piece reads.
void restore_piece(const uint8_t* piece, int32_t* k, int64_t sender, compress::Wire wire, int64_t count, int64_t given,
                   int64_t from, int64_t len, double post_scale, at::ScalarType dtype, void* dst);

}  // namespace cnccl::frames

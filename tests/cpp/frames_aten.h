// An emulation of power-of-two frames and MX blocks (backend/frames.h) in ATen operations, the oracle
// tests/cpp/test_frames.cpp holds the CPU kernels to: every step an fp32 or fp64 multiplication by an
// exact scale, an fp32 add, or torch's own round-to-nearest-even conversion (e4m3 past its largest value
// aside, which frames make NaN). It reads frames as frames.h lays them out; the 8-bit conversions are
// torch's, not compress/formats.h's.
#pragma once

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "backend/frames.h"
#include "compress/formats.h"

namespace cnccl::frames::aten {
namespace detail {

constexpr int64_t kHeaderBytes = 4;
constexpr int kMaxExponent = compress::formats::kMaxFrameExponent;

inline int64_t payload_bytes(int64_t count, compress::Wire wire) {
  if (compress::is_mx(wire)) return int64_t(compress::mx_bytes(size_t(count), wire));
  return count * int64_t(compress::wire_bytes(wire));
}

// 2^k as fp32, built from its bits so that no math library's exp2 is involved; k in [-126, 126].
inline at::Tensor power_of_two(const at::Tensor& k) { return k.add(127).bitwise_left_shift(23).view(at::kFloat); }

// 2^-k of received exponents. On a device nothing is read back to raise an error, so an exponent
// outside [-126, 126] (header_of) decodes its whole frame as NaN instead of as garbage scales.
inline at::Tensor decoding_scales(const at::Tensor& k) {
  const at::Tensor in_range = k.ge(-kMaxExponent).logical_and(k.le(kMaxExponent));
  return at::where(in_range, power_of_two(k.clamp(-kMaxExponent, kMaxExponent).neg()),
                   at::full_like(k, std::numeric_limits<float>::quiet_NaN(), k.options().dtype(at::kFloat)));
}

inline at::Tensor exponents(const at::Tensor& amax, compress::Wire wire) {
  const at::Tensor e = std::get<1>(at::frexp(amax));
  const at::Tensor k = e.neg().add(compress::formats::frame_emax(wire)).clamp(-kMaxExponent, kMaxExponent);
  return at::where(at::isfinite(amax).logical_and(amax.gt(0)), k, at::zeros_like(k));
}

// fp32 values rounded to the wire as compress::cast rounds them: torch's conversion, except that e4m3
// gives NaN, not 448, past its largest value (|v| > 464, the midpoint to the next binade's code).
// `v` is a temporary of the caller's, changed in place.
inline at::Tensor to_wire(at::Tensor v, compress::Wire wire) {
  if (wire != compress::Wire::kE4m3) return v.to(wire_dtype(wire));
  return v.masked_fill_(v.abs().gt(464), std::numeric_limits<float>::quiet_NaN()).to(wire_dtype(wire));
}

inline at::Tensor headers(const at::Tensor& frames) {
  return frames.narrow(1, 0, kHeaderBytes).contiguous().view(at::kInt).view({-1});
}

inline at::Tensor payloads(const at::Tensor& frames, int64_t count, compress::Wire wire) {
  return frames.narrow(1, kHeaderBytes, payload_bytes(count, wire)).contiguous().view(wire_dtype(wire));
}

// A row a piece at a time (an eighth of it, at least 1M elements): the pieces' edges are cases too.
inline int64_t piece_of(int64_t count) { return std::max<int64_t>(count / 8 + 1, int64_t(1) << 20); }

inline void encode_aten(const std::vector<at::Tensor>& rows, int64_t count, float scale, compress::Wire wire,
                 const at::Tensor& frames) {
  const int64_t piece = piece_of(count), width = int64_t(compress::wire_bytes(wire));
  std::vector<at::Tensor> flat, amax;
  for (const auto& row : rows) {
    flat.push_back(row.reshape({-1}));
    const int64_t len = flat.back().numel();
    std::vector<at::Tensor> maxima;
    for (int64_t from = 0; from < len; from += piece) {
      maxima.push_back(flat.back().narrow(0, from, std::min(piece, len - from)).abs().amax());
    }
    amax.push_back(maxima.empty() ? at::zeros({}, row.options()) : at::stack(maxima).amax());
  }
  const at::Tensor k = exponents(at::stack(amax).mul(std::fabs(double(scale))).to(at::kFloat), wire);
  frames.narrow(1, 0, kHeaderBytes).copy_(k.view(at::kByte).view({int64_t(rows.size()), kHeaderBytes}));
  const at::Tensor s = power_of_two(k).mul(double(scale));
  for (size_t r = 0; r < rows.size(); ++r) {
    const at::Tensor frame = frames[int64_t(r)];
    const int64_t len = flat[r].numel();
    // A short row's missing values are +0 on the wire, as the kernels write them.
    if (len < count) frame.narrow(0, kHeaderBytes + len * width, (count - len) * width).zero_();
    const at::Tensor row_scale = s[int64_t(r)].to(flat[r].scalar_type());
    for (int64_t from = 0; from < len; from += piece) {
      const int64_t part = std::min(piece, len - from);
      const at::Tensor payload = to_wire(flat[r].narrow(0, from, part).mul(row_scale).to(at::kFloat), wire);
      frame.narrow(0, kHeaderBytes + from * width, part * width).copy_(payload.view(at::kByte));
    }
  }
}


// --- MX blocks as ATen operations (compress::mx_encode defines them; the kernels are the CPU's).

constexpr int64_t kBlock = int64_t(compress::kMxBlock);

inline int64_t mx_blocks(int64_t count) { return (count + kBlock - 1) / kBlock; }

// The values of e2m1 codes (int32), computed where they are: a table copied to a device would make the
// host wait for the stream. Code bits: sign 3, exponent 2-1, mantissa 0; exponent 0 is 0 or 0.5, e > 0 is
// (2 + m) * 2^(e-2).
at::Tensor e2m1_values(const at::Tensor& codes) {
  const at::Tensor e = codes.bitwise_right_shift(1).bitwise_and(3), m = codes.bitwise_and(1);
  const at::Tensor magnitude = at::where(e.eq(0), m.to(at::kFloat).mul(0.5),
                                         m.add(2).to(at::kFloat).mul(power_of_two(e.sub(2))));
  return at::where(codes.bitwise_and(8).ne(0), magnitude.neg(), magnitude);
}

// Every e2m1 code's value, on the device of `like` (mxfp4's decode looks its codes up there); undefined
// for the other wires.
at::Tensor e2m1_table(compress::Wire wire, const at::Tensor& like) {
  if (wire != compress::Wire::kMxfp4) return {};
  return e2m1_values(at::arange(16, like.options().dtype(at::kInt)));
}

// Whole blocks a piece of an MX row holds (piece_of's size, rounded up to blocks).
inline int64_t mx_piece_blocks(int64_t count) { return mx_blocks(piece_of(count)); }

// rows (each at most `count` elements, fp32 or fp64) times `scale` -> frames [rows, frame_bytes], every
// row's blocks [b0, b0 + nb) at a time (the scales of a frame come first, then its elements).
inline void encode_mx_aten(const std::vector<at::Tensor>& rows, int64_t count, float scale, compress::Wire wire,
                    compress::MxScale rule, const at::Tensor& frames) {
  const int64_t n = int64_t(rows.size()), blocks = mx_blocks(count);
  if (!count) return;
  std::vector<at::Tensor> flat;
  for (const auto& row : rows) flat.push_back(row.reshape({-1}));
  const float largest = compress::mx_largest(wire);
  for (int64_t b0 = 0, nb = 0; b0 < blocks; b0 += nb) {
    nb = std::min(mx_piece_blocks(count), blocks - b0);
    const int64_t first = b0 * kBlock, len = std::min(nb * kBlock, count - first);
    at::Tensor v = at::zeros({n, nb * kBlock}, frames.options().dtype(at::kFloat));
    for (int64_t r = 0; r < n; ++r) {
      const int64_t have = std::min(flat[size_t(r)].numel() - first, nb * kBlock);
      if (have > 0) v[r].narrow(0, 0, have).copy_(flat[size_t(r)].narrow(0, first, have).mul(double(scale)).to(at::kFloat));
    }
    const at::Tensor b = v.view({n, nb, kBlock});
    const at::Tensor amax = b.abs().amax(2);
    const at::Tensor nonfinite = at::isfinite(amax).logical_not();
    const at::Tensor bits = amax.view(at::kInt);
    at::Tensor x = bits.bitwise_right_shift(23).sub(127 + compress::formats::frame_emax(wire));
    if (rule == compress::MxScale::kRceil) {
      x.add_(bits.bitwise_and(0x7FFFFF).gt(int64_t(compress::mx_largest_fraction(wire))).to(at::kInt));
    }
    x.clamp_(-127, 127);
    const at::Tensor codes = at::where(nonfinite, at::full_like(x, 255), x.add(127)).to(at::kByte);
    // In place over v (no longer needed).
    const at::Tensor q = b.mul_(power_of_two(x.neg()).unsqueeze(2))
                             .masked_fill_(nonfinite.unsqueeze(2), 0)
                             .clamp_(-largest, largest)
                             .view({n, nb * kBlock})
                             .narrow(1, 0, len);
    frames.narrow(1, b0, nb).copy_(codes);
    if (wire == compress::Wire::kMxfp4) {
      const at::Tensor a = q.abs();
      at::Tensor code = a.gt(0.25).to(at::kByte);
      for (const auto& [bound, inclusive] : {std::pair{0.75, true}, {1.25, false}, {1.75, true}, {2.5, false},
                                             {3.5, true}, {5.0, false}}) {
        code.add_((inclusive ? a.ge(bound) : a.gt(bound)).to(at::kByte));
      }
      code.bitwise_or_(at::signbit(q).to(at::kByte).mul(8));
      if (len % 2) code = at::constant_pad_nd(code, {0, 1});
      const at::Tensor pairs = code.view({n, -1, 2});
      const at::Tensor elements = pairs.select(2, 0).bitwise_or(pairs.select(2, 1).bitwise_left_shift(4));
      frames.narrow(1, blocks + first / 2, elements.size(1)).copy_(elements);  // first: whole blocks, even
    } else {
      frames.narrow(1, blocks + first, len).copy_(q.to(wire_dtype(wire)).view(at::kByte));
    }
  }
}

// The values of frames [rows, frame_bytes(count)] in blocks [b0, b0 + nb): fp32 [rows, elements]. Exact.
// `table`: e2m1_table(wire).
inline at::Tensor decode_mx_aten(const at::Tensor& frames, int64_t count, compress::Wire wire, int64_t b0, int64_t nb,
                          const at::Tensor& table) {
  const int64_t n = frames.size(0), blocks = mx_blocks(count);
  const int64_t first = b0 * kBlock, len = std::min(nb * kBlock, count - first);
  const at::Tensor codes = frames.narrow(1, b0, nb).to(at::kInt);
  const at::Tensor scales =
      at::where(codes.eq(255), at::full_like(codes, std::numeric_limits<float>::quiet_NaN(), at::kFloat),
                at::where(codes.eq(0), at::full_like(codes, 0x1p-127f, at::kFloat),
                          codes.bitwise_left_shift(23).view(at::kFloat)));
  at::Tensor values;
  if (wire == compress::Wire::kMxfp4) {
    const at::Tensor bytes = frames.narrow(1, blocks + first / 2, (len + 1) / 2);
    const at::Tensor nibbles = at::stack({bytes.bitwise_and(15), bytes.bitwise_right_shift(4)}, 2).view({n, -1});
    values = table.index_select(0, nibbles.narrow(1, 0, len).reshape({-1}).to(at::kInt)).view({n, len});
  } else {
    values = frames.narrow(1, blocks + first, len).contiguous().view(wire_dtype(wire)).to(at::kFloat);
  }
  // values is this call's own: scaled in place (padded to whole blocks only in a row's last piece).
  if (len < nb * kBlock) values = at::constant_pad_nd(values, {0, nb * kBlock - len});
  return values.view({n, nb, kBlock}).mul_(scales.unsqueeze(2)).view({n, nb * kBlock}).narrow(1, 0, len);
}

}  // namespace detail

// frames::encode, frames::sum and frames::restore (contiguous dst), emulated.
inline void encode(const std::vector<at::Tensor>& rows, int64_t count, double scale, compress::Wire wire,
                   compress::MxScale mx_scale, const at::Tensor& frames) {
  const int64_t header = compress::is_mx(wire) ? 0 : detail::kHeaderBytes;
  const int64_t bytes = detail::payload_bytes(count, wire), padding = frames.size(1) - header - bytes;
  if (padding) frames.narrow(1, header + bytes, padding).zero_();
  if (compress::is_mx(wire)) return detail::encode_mx_aten(rows, count, float(scale), wire, mx_scale, frames);
  detail::encode_aten(rows, count, float(scale), wire, frames);
}

inline at::Tensor sum(const std::vector<at::Tensor>& frames, int64_t count, compress::Wire wire, const at::Tensor& out) {
  using namespace detail;
  if (compress::is_mx(wire)) {
    const int64_t blocks = mx_blocks(count);
    const at::Tensor table = e2m1_table(wire, out);
    for (size_t r = 0; r < frames.size(); ++r) {
      const at::Tensor frame = frames[r].reshape({1, -1});
      for (int64_t b0 = 0, nb = 0; b0 < blocks; b0 += nb) {
        nb = std::min(mx_piece_blocks(count), blocks - b0);
        const at::Tensor decoded = decode_mx_aten(frame, count, wire, b0, nb, table)[0];
        const at::Tensor into = out.narrow(0, b0 * kBlock, decoded.numel());
        if (r == 0) {
          into.copy_(decoded);
        } else {
          into.add_(decoded);
        }
      }
    }
    return out;
  }
  const int64_t piece = piece_of(count);
  for (size_t r = 0; r < frames.size(); ++r) {
    const at::Tensor frame = frames[r].reshape({1, -1});
    const at::Tensor s = decoding_scales(headers(frame));
    const at::Tensor payload = payloads(frame, count, wire).view({-1});
    for (int64_t from = 0; from < count; from += piece) {
      const int64_t len = std::min(piece, count - from);
      const at::Tensor decoded = payload.narrow(0, from, len).to(at::kFloat).mul_(s);
      if (r == 0) {
        out.narrow(0, from, len).copy_(decoded);
      } else {
        out.narrow(0, from, len).add_(decoded);
      }
    }
  }
  return out;
}

inline void restore(const at::Tensor& frames, int64_t count, compress::Wire wire, double post_scale,
                    const at::Tensor& dst) {
  using namespace detail;
  const int64_t n = dst.numel();
  if (!n) return;
  const at::Tensor out = dst.view({-1});
  if (compress::is_mx(wire)) {
    const int64_t blocks = mx_blocks(count);
    const at::Tensor table = e2m1_table(wire, frames);
    for (int64_t r = 0, row_first = 0; row_first < n; ++r, row_first += count) {
      const at::Tensor frame = frames[r].reshape({1, -1});
      const int64_t row = std::min(count, n - row_first);
      for (int64_t b0 = 0, nb = 0; b0 * kBlock < row; b0 += nb) {
        nb = std::min(mx_piece_blocks(count), blocks - b0);
        const at::Tensor values = decode_mx_aten(frame, count, wire, b0, nb, table)[0];
        const int64_t len = std::min(values.numel(), row - b0 * kBlock);
        out.narrow(0, row_first + b0 * kBlock, len).copy_(values.narrow(0, 0, len)).mul_(double(float(post_scale)));
      }
    }
    return;
  }
  const at::Tensor s = decoding_scales(headers(frames)).mul(double(float(post_scale))).to(dst.scalar_type());
  const int64_t piece = piece_of(count);
  for (int64_t r = 0, first = 0; first < n; ++r, first += count) {
    const at::Tensor payload = payloads(frames[r].reshape({1, -1}), count, wire).view({-1});
    const int64_t row = std::min(count, n - first);
    for (int64_t from = 0; from < row; from += piece) {
      const int64_t len = std::min(piece, row - from);
      out.narrow(0, first + from, len).copy_(payload.narrow(0, from, len).to(at::kFloat).to(dst.scalar_type()).mul_(s[r]));
    }
  }
}

}  // namespace cnccl::frames::aten

#include "backend/frames.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "backend/errors.h"
#include "backend/wide_data.h"

namespace cnccl::frames {
namespace {

constexpr int64_t kHeaderBytes = 4;
constexpr int kMaxExponent = 126;  // 2^k and 2^-k both normal fp32 numbers

int largest_binade(compress::Wire wire) {
  switch (wire) {
    case compress::Wire::kFp16: return 15;
    case compress::Wire::kBf16: return 127;
    case compress::Wire::kE4m3: return 8;
    case compress::Wire::kE5m2: return 15;
    case compress::Wire::kMxfp8: case compress::Wire::kMxfp8E5m2: case compress::Wire::kMxfp4:
      return compress::mx_emax(wire);
  }
  TORCH_CHECK(false, "cnccl: unknown wire format");
}

// An MX frame is its blocks alone: each carries its own scale.
int64_t header_bytes(compress::Wire wire) { return compress::is_mx(wire) ? 0 : kHeaderBytes; }

int64_t payload_bytes(int64_t count, compress::Wire wire) {
  if (compress::is_mx(wire)) return int64_t(compress::mx_bytes(size_t(count), wire));
  return count * int64_t(compress::wire_bytes(wire));
}

bool on_kernels(const at::Tensor& t, Impl impl) { return impl == Impl::kForDevice && t.is_cpu(); }

// --- The CPU kernels.

int32_t exponent(float amax, compress::Wire wire) {
  if (!(amax > 0) || !std::isfinite(amax)) return 0;
  int e = 0;
  std::frexp(amax, &e);
  const int k = largest_binade(wire) - e;
  return k < -kMaxExponent ? -kMaxExponent : k > kMaxExponent ? kMaxExponent : k;
}

// The exponent of a frame that rank `sender` sent. Only this code writes frames, so one outside
// [-126, 126] is corruption or another version; it would also make 2^-k undefined (-INT32_MIN) or
// build a scale from garbage bits.
int32_t header_of(const uint8_t* frame, int64_t sender) {
  int32_t k;
  std::memcpy(&k, frame, sizeof k);
  if (k < -kMaxExponent || k > kMaxExponent) {
    throw errors::backend_error("cnccl: the power-of-two frame from rank " + std::to_string(sender) +
                                " carries the exponent " + std::to_string(k) + ", outside [-126, 126]: the peer " +
                                "sent corrupt data or runs another version of cnccl");
  }
  return k;
}

// The exponent of x[0..count) times scale, given the largest |x|.
template <typename T>
int32_t exponent_of_amax(T amax, const T* x, int64_t count, float scale, compress::Wire wire) {
  const T magnitude = amax * T(std::fabs(scale));
  const int32_t k = exponent(static_cast<float>(magnitude), wire);
  // The 8-bit casts do not count: with the exponent every finite value is in range. A value that is
  // not shows in the amax, and the exponent is then 0: finite values may overflow too.
  if (compress::wire_bytes(wire) == 1 && !std::isfinite(static_cast<float>(magnitude))) {
    compress::count_casts(x, size_t(count), std::ldexp(scale, k), wire);
  }
  return k;
}

template <typename T>
int32_t exponent_of_row(const T* x, int64_t count, float scale, compress::Wire wire) {
  return exponent_of_amax(compress::amax(x, size_t(count)), x, count, scale, wire);
}

template <typename T>
void encode_row(const T* x, int64_t count, float scale, compress::Wire wire, uint8_t* frame) {
  const int32_t k = exponent_of_row(x, count, scale, wire);
  std::memcpy(frame, &k, sizeof k);
  const float s = std::ldexp(scale, k);
  uint8_t* payload = frame + kHeaderBytes;
  if (compress::wire_bytes(wire) == 1) return compress::cast(x, payload, size_t(count), s, wire);
  compress::cast(x, reinterpret_cast<uint16_t*>(payload), size_t(count), s, wire);
}

// --- ATen operations, for any device.

// 2^k as fp32, built from its bits so that no math library's exp2 is involved; k in [-126, 126].
at::Tensor power_of_two(const at::Tensor& k) { return k.add(127).bitwise_left_shift(23).view(at::kFloat); }

// 2^-k of received exponents. On a device nothing is read back to raise an error, so an exponent
// outside [-126, 126] (header_of) decodes its whole frame as NaN instead of as garbage scales.
at::Tensor decoding_scales(const at::Tensor& k) {
  const at::Tensor in_range = k.ge(-kMaxExponent).logical_and(k.le(kMaxExponent));
  return at::where(in_range, power_of_two(k.clamp(-kMaxExponent, kMaxExponent).neg()),
                   at::full_like(k, std::numeric_limits<float>::quiet_NaN(), k.options().dtype(at::kFloat)));
}

at::Tensor exponents(const at::Tensor& amax, compress::Wire wire) {
  const at::Tensor e = std::get<1>(at::frexp(amax));
  const at::Tensor k = e.neg().add(largest_binade(wire)).clamp(-kMaxExponent, kMaxExponent);
  return at::where(at::isfinite(amax).logical_and(amax.gt(0)), k, at::zeros_like(k));
}

// fp32 values rounded to the wire as compress::cast rounds them: torch's conversion, except that e4m3
// gives NaN, not 448, past its largest value (|v| > 464, the midpoint to the next binade's code).
// `v` is a temporary of the caller's, changed in place.
at::Tensor to_wire(at::Tensor v, compress::Wire wire) {
  if (wire != compress::Wire::kE4m3) return v.to(wire_dtype(wire));
  return v.masked_fill_(v.abs().gt(464), std::numeric_limits<float>::quiet_NaN()).to(wire_dtype(wire));
}

at::Tensor headers(const at::Tensor& frames) {
  return frames.narrow(1, 0, kHeaderBytes).contiguous().view(at::kInt).view({-1});
}

at::Tensor payloads(const at::Tensor& frames, int64_t count, compress::Wire wire) {
  return frames.narrow(1, kHeaderBytes, payload_bytes(count, wire)).contiguous().view(wire_dtype(wire));
}

// The ATen forms decode a row a piece at a time: each piece's fp32 temporary is at most an eighth of
// the row (or 1M elements, so that a small row is one piece and few kernels are launched), where
// widening whole frames took 4-8 bytes per element more than the tensor (docs/usage.md, "CUDA tensors").
int64_t piece_of(int64_t count) { return std::max<int64_t>(count / 8 + 1, int64_t(1) << 20); }

void encode_aten(const std::vector<at::Tensor>& rows, int64_t count, float scale, compress::Wire wire,
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

int64_t mx_blocks(int64_t count) { return (count + kBlock - 1) / kBlock; }

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
int64_t mx_piece_blocks(int64_t count) { return mx_blocks(piece_of(count)); }

// rows (each at most `count` elements, fp32 or fp64) times `scale` -> frames [rows, frame_bytes], every
// row's blocks [b0, b0 + nb) at a time (the scales of a frame come first, then its elements).
void encode_mx_aten(const std::vector<at::Tensor>& rows, int64_t count, float scale, compress::Wire wire,
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
    at::Tensor x = bits.bitwise_right_shift(23).sub(127 + largest_binade(wire));
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
at::Tensor decode_mx_aten(const at::Tensor& frames, int64_t count, compress::Wire wire, int64_t b0, int64_t nb,
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

void restore_mx(const at::Tensor& frames, int64_t count, compress::Wire wire, float post, const at::Tensor& dst,
                Impl impl) {
  const int64_t n = dst.numel();
  if (!on_kernels(dst, impl)) {
    const bool in_place = dst.is_contiguous();
    const at::Tensor out = in_place ? dst.view({-1}) : at::empty({n}, dst.options());
    const int64_t blocks = mx_blocks(count);
    const at::Tensor table = e2m1_table(wire, frames);
    for (int64_t r = 0, row_first = 0; row_first < n; ++r, row_first += count) {
      const at::Tensor frame = frames[r].reshape({1, -1});
      const int64_t row = std::min(count, n - row_first);
      for (int64_t b0 = 0, nb = 0; b0 * kBlock < row; b0 += nb) {
        nb = std::min(mx_piece_blocks(count), blocks - b0);
        const at::Tensor values = decode_mx_aten(frame, count, wire, b0, nb, table)[0];
        const int64_t len = std::min(values.numel(), row - b0 * kBlock);
        out.narrow(0, row_first + b0 * kBlock, len).copy_(values.narrow(0, 0, len)).mul_(double(post));
      }
    }
    if (!in_place) dst.copy_(out.view(dst.sizes()));
    return;
  }
  const at::Tensor f = frames.contiguous();
  at::Tensor out = dst.is_contiguous() ? dst : at::empty_like(dst, at::MemoryFormat::Contiguous);
  with_wide_data(out, [&](auto* y) {
    for (int64_t r = 0, first = 0; first < n; ++r, first += count) {
      compress::mx_restore(f[r].const_data_ptr<uint8_t>(), size_t(count), y + first, size_t(std::min(count, n - first)),
                           post, wire);
    }
  });
  if (!out.is_same(dst)) dst.copy_(out);
}

}  // namespace

at::ScalarType wire_dtype(compress::Wire wire) {
  switch (wire) {
    case compress::Wire::kFp16: return at::kHalf;
    case compress::Wire::kBf16: return at::kBFloat16;
    case compress::Wire::kE4m3: case compress::Wire::kMxfp8: return at::kFloat8_e4m3fn;
    case compress::Wire::kE5m2: case compress::Wire::kMxfp8E5m2: return at::kFloat8_e5m2;
    case compress::Wire::kMxfp4: return at::kByte;  // two e2m1 elements a byte
  }
  TORCH_CHECK(false, "cnccl: unknown wire format");
}

int64_t frame_bytes(int64_t count, compress::Wire wire) {
  return header_bytes(wire) + (payload_bytes(count, wire) + 3) / 4 * 4;
}

std::vector<at::Tensor> parts_of(const at::Tensor& flat, int64_t parts, int64_t count) {
  std::vector<at::Tensor> out;
  const int64_t n = flat.numel();
  for (int64_t p = 0; p < parts; ++p) {
    const int64_t first = std::min(n, p * count);
    out.push_back(flat.narrow(0, first, std::min(count, n - first)));
  }
  return out;
}

void encode(const std::vector<at::Tensor>& rows, int64_t count, double scale, compress::Wire wire,
            compress::MxScale mx_scale, const at::Tensor& frames, Impl impl) {
  const int64_t bytes = payload_bytes(count, wire);
  TORCH_CHECK(frames.scalar_type() == at::kByte && frames.is_contiguous() && frames.dim() == 2 &&
                  frames.size(0) == int64_t(rows.size()) && frames.size(1) == frame_bytes(count, wire),
              "cnccl: frames of the wrong shape for ", rows.size(), " x ", count, " elements");
  const int64_t header = header_bytes(wire), padding = frames.size(1) - header - bytes;
  if (padding) frames.narrow(1, header + bytes, padding).zero_();
  if (compress::is_mx(wire)) {
    if (!on_kernels(frames, impl)) return encode_mx_aten(rows, count, float(scale), wire, mx_scale, frames);
    for (size_t r = 0; r < rows.size(); ++r) {
      // A short row's blocks are those of `count` values, its missing ones +0.
      const at::Tensor x = rows[r].contiguous();
      uint8_t* frame = frames[int64_t(r)].mutable_data_ptr<uint8_t>();
      with_wide_data(static_cast<const char*>(x.const_data_ptr()), x.scalar_type(), [&](const auto* row) {
        compress::mx_encode(row, size_t(x.numel()), size_t(count), float(scale), wire, mx_scale, frame);
      });
    }
    return;
  }
  if (!on_kernels(frames, impl)) return encode_aten(rows, count, float(scale), wire, frames);
  for (size_t r = 0; r < rows.size(); ++r) {
    const at::Tensor x = rows[r].contiguous();
    const int64_t len = x.numel();
    uint8_t* frame = frames[int64_t(r)].mutable_data_ptr<uint8_t>();
    const int64_t width = int64_t(compress::wire_bytes(wire));
    if (len < count) std::memset(frame + kHeaderBytes + len * width, 0, size_t((count - len) * width));
    with_wide_data(static_cast<const char*>(x.const_data_ptr()), x.scalar_type(),
                   [&](const auto* row) { encode_row(row, len, float(scale), wire, frame); });
  }
}

at::Tensor sum(const std::vector<at::Tensor>& frames, int64_t count, compress::Wire wire, const at::Tensor& out,
               Impl impl) {
  TORCH_CHECK(out.scalar_type() == at::kFloat && out.is_contiguous() && out.numel() == count,
              "cnccl: a frame sum needs a contiguous fp32 output of ", count, " elements");
  if (compress::is_mx(wire)) {
    if (!on_kernels(out, impl)) {
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
    std::vector<const uint8_t*> in;
    for (const auto& f : frames) in.push_back(f.const_data_ptr<uint8_t>());
    compress::mx_sum(in.data(), in.size(), out.mutable_data_ptr<float>(), size_t(count), wire);
    return out;
  }
  if (!on_kernels(out, impl)) {
    const int64_t piece = piece_of(count);
    for (size_t r = 0; r < frames.size(); ++r) {
      const at::Tensor frame = frames[r].reshape({1, -1});
      const at::Tensor s = decoding_scales(headers(frame));
      const at::Tensor payload = payloads(frame, count, wire).view({-1});
      for (int64_t from = 0; from < count; from += piece) {
        const int64_t len = std::min(piece, count - from);
        // to() copies (every wire dtype is narrower than fp32): mul_ never writes into the frame.
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
  std::vector<const void*> in;
  std::vector<float> scales;
  for (size_t r = 0; r < frames.size(); ++r) {
    const auto* frame = frames[r].const_data_ptr<uint8_t>();
    in.push_back(frame + kHeaderBytes);
    scales.push_back(std::ldexp(1.0f, -header_of(frame, int64_t(r))));
  }
  compress::scaled_sum(in.data(), scales.data(), in.size(), out.mutable_data_ptr<float>(), size_t(count), wire);
  return out;
}

void restore(const at::Tensor& frames, int64_t count, compress::Wire wire, double post_scale, const at::Tensor& dst,
             Impl impl) {
  const int64_t n = dst.numel();
  if (!n) return;
  const float post = float(post_scale);
  if (compress::is_mx(wire)) return restore_mx(frames, count, wire, post, dst, impl);
  if (!on_kernels(dst, impl)) {
    const at::Tensor s = decoding_scales(headers(frames)).mul(double(post)).to(dst.scalar_type());
    const bool in_place = dst.is_contiguous();
    const at::Tensor out = in_place ? dst.view({-1}) : at::empty({n}, dst.options());
    const int64_t piece = piece_of(count);
    for (int64_t r = 0, first = 0; first < n; ++r, first += count) {
      const at::Tensor payload = payloads(frames[r].reshape({1, -1}), count, wire).view({-1});
      const int64_t row = std::min(count, n - first);
      for (int64_t from = 0; from < row; from += piece) {
        const int64_t len = std::min(piece, row - from);
        out.narrow(0, first + from, len)
            .copy_(payload.narrow(0, from, len).to(at::kFloat).to(dst.scalar_type()).mul_(s[r]));
      }
    }
    if (!in_place) dst.copy_(out.view(dst.sizes()));
    return;
  }
  const at::Tensor f = frames.contiguous();
  // Every row's exponent is checked before any row is written: a bad one leaves dst as it was.
  std::vector<float> scales;
  for (int64_t r = 0; r * count < n; ++r) scales.push_back(std::ldexp(post, -header_of(f[r].const_data_ptr<uint8_t>(), r)));
  at::Tensor out = dst.is_contiguous() ? dst : at::empty_like(dst, at::MemoryFormat::Contiguous);
  with_wide_data(out, [&](auto* y) {
    for (int64_t r = 0, first = 0; first < n; ++r, first += count) {
      const uint8_t* frame = f[r].const_data_ptr<uint8_t>();
      const float s = scales[size_t(r)];
      const size_t len = size_t(std::min(count, n - first));
      if (compress::wire_bytes(wire) == 1) {
        compress::restore(frame + kHeaderBytes, y + first, len, s, wire);
      } else {
        compress::restore(reinterpret_cast<const uint16_t*>(frame + kHeaderBytes), y + first, len, s, wire);
      }
    }
  });
  if (!out.is_same(dst)) dst.copy_(out);
}

int64_t payload_offset(compress::Wire wire) { return header_bytes(wire); }

int32_t row_exponent(const at::Tensor& row, double scale, compress::Wire wire) {
  TORCH_CHECK(row.is_cpu() && row.is_contiguous() && !compress::is_mx(wire), "cnccl: row_exponent takes a contiguous "
              "CPU row of a power-of-two frame");
  int32_t k = 0;
  with_wide_data(static_cast<const char*>(row.const_data_ptr()), row.scalar_type(),
                 [&](const auto* x) { k = exponent_of_row(x, row.numel(), float(scale), wire); });
  return k;
}

int32_t sum_exponent(float amax, const at::Tensor& sums, compress::Wire wire) {
  TORCH_CHECK(sums.is_cpu() && sums.is_contiguous() && sums.scalar_type() == at::kFloat && !compress::is_mx(wire),
              "cnccl: sum_exponent takes the contiguous fp32 sums of a power-of-two frame");
  return exponent_of_amax(amax, sums.const_data_ptr<float>(), sums.numel(), 1.0f, wire);
}

namespace {

// The values a piece [from, from + len) of a frame of `count` values holds: [first, last).
struct PieceValues {
  int64_t first, last;
  PieceValues(int64_t count, int64_t width, int64_t from, int64_t len) {
    TORCH_INTERNAL_ASSERT(from % width == 0 && len % width == 0, "a frame's piece cuts a value");
    first = std::max<int64_t>(from - kHeaderBytes, 0) / width;
    last = std::max<int64_t>(std::min((from + len - kHeaderBytes) / width, count), first);
  }
};

}  // namespace

void encode_piece(const at::Tensor& row, int32_t k, double scale, compress::Wire wire, int64_t count, int64_t from,
                  int64_t len, uint8_t* dst) {
  const int64_t width = int64_t(compress::wire_bytes(wire)), end = from + len, given = row.numel();
  for (int64_t b = from; b < std::min(end, kHeaderBytes); ++b) dst[b - from] = reinterpret_cast<const uint8_t*>(&k)[b];
  const PieceValues v(count, width, from, len);
  uint8_t* out = dst + (kHeaderBytes + v.first * width - from);
  const int64_t cast = std::max<int64_t>(std::min(v.last, given) - v.first, 0);
  if (cast) {
    const float s = std::ldexp(float(scale), k);
    with_wide_data(static_cast<const char*>(row.const_data_ptr()), row.scalar_type(), [&](const auto* x) {
      if (width == 1) return compress::cast(x + v.first, out, size_t(cast), s, wire);
      compress::cast(x + v.first, reinterpret_cast<uint16_t*>(out), size_t(cast), s, wire);
    });
  }
  // A short row's missing values, then the padding after the last value.
  if (v.last - v.first > cast) std::memset(out + cast * width, 0, size_t((v.last - v.first - cast) * width));
  const int64_t padding = std::max(from, kHeaderBytes + count * width);
  if (end > padding) std::memset(dst + (padding - from), 0, size_t(end - padding));
}

float sum_pieces(const uint8_t* const* pieces, int64_t ranks, int32_t* k, compress::Wire wire, int64_t count,
                 int64_t from, int64_t len, float* out) {
  const int64_t width = int64_t(compress::wire_bytes(wire));
  if (from == 0) {
    TORCH_INTERNAL_ASSERT(len >= kHeaderBytes, "a frame's first piece holds its whole header");
    for (int64_t r = 0; r < ranks; ++r) k[r] = header_of(pieces[r], r);
  }
  const PieceValues v(count, width, from, len);
  if (v.last == v.first) return 0.0f;
  const int64_t at = kHeaderBytes + v.first * width - from;
  std::vector<const void*> in(static_cast<size_t>(ranks));
  std::vector<float> scales(static_cast<size_t>(ranks));
  for (int64_t r = 0; r < ranks; ++r) {
    in[size_t(r)] = pieces[r] + at;
    scales[size_t(r)] = std::ldexp(1.0f, -k[r]);
  }
  compress::scaled_sum(in.data(), scales.data(), size_t(ranks), out + at / width, size_t(v.last - v.first), wire);
  return compress::amax(out + at / width, size_t(v.last - v.first));
}

void restore_piece(const uint8_t* piece, int32_t* k, int64_t sender, compress::Wire wire, int64_t count, int64_t given,
                   int64_t from, int64_t len, double post_scale, at::ScalarType dtype, void* dst) {
  const int64_t width = int64_t(compress::wire_bytes(wire));
  if (from == 0) {
    TORCH_INTERNAL_ASSERT(len >= kHeaderBytes, "a frame's first piece holds its whole header");
    *k = header_of(piece, sender);
  }
  const PieceValues v(count, width, from, len);
  const int64_t n = std::min(v.last, given) - v.first;
  if (n <= 0) return;
  const uint8_t* values = piece + (kHeaderBytes + v.first * width - from);
  const float s = std::ldexp(float(post_scale), -*k);
  auto restore_into = [&](auto* y) {
    if (width == 1) return compress::restore(values, y + v.first, size_t(n), s, wire);
    compress::restore(reinterpret_cast<const uint16_t*>(values), y + v.first, size_t(n), s, wire);
  };
  if (dtype == at::kDouble) return restore_into(static_cast<double*>(dst));
  TORCH_INTERNAL_ASSERT(dtype == at::kFloat, "frames restore into fp32 or fp64");
  restore_into(static_cast<float*>(dst));
}

}  // namespace cnccl::frames

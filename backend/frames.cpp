#include "backend/frames.h"

#include <cmath>
#include <cstring>
#include <limits>

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
  }
  TORCH_CHECK(false, "cnccl: unknown wire format");
}

int64_t payload_bytes(int64_t count, compress::Wire wire) { return count * int64_t(compress::wire_bytes(wire)); }

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

template <typename T>
void encode_row(const T* x, int64_t count, float scale, compress::Wire wire, uint8_t* frame) {
  const T magnitude = compress::amax(x, size_t(count)) * T(std::fabs(scale));
  const int32_t k = exponent(static_cast<float>(magnitude), wire);
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
at::Tensor to_wire(const at::Tensor& v, compress::Wire wire) {
  if (wire != compress::Wire::kE4m3) return v.to(wire_dtype(wire));
  return v.masked_fill(v.abs().gt(464), std::numeric_limits<float>::quiet_NaN()).to(wire_dtype(wire));
}

at::Tensor headers(const at::Tensor& frames) {
  return frames.narrow(1, 0, kHeaderBytes).contiguous().view(at::kInt).view({-1});
}

at::Tensor payloads(const at::Tensor& frames, int64_t count, compress::Wire wire) {
  return frames.narrow(1, kHeaderBytes, payload_bytes(count, wire)).contiguous().view(wire_dtype(wire));
}

void encode_aten(const std::vector<at::Tensor>& rows, int64_t count, float scale, compress::Wire wire,
                 const at::Tensor& frames) {
  std::vector<at::Tensor> flat, amax;
  for (const auto& row : rows) {
    flat.push_back(row.reshape({-1}));
    amax.push_back(row.numel() ? flat.back().abs().amax() : at::zeros({}, row.options()));
  }
  const at::Tensor k = exponents(at::stack(amax).mul(std::fabs(double(scale))).to(at::kFloat), wire);
  frames.narrow(1, 0, kHeaderBytes).copy_(k.view(at::kByte).view({int64_t(rows.size()), kHeaderBytes}));
  const at::Tensor s = power_of_two(k).mul(double(scale));
  // A short row's missing values are +0 on the wire, as the kernels write them.
  frames.narrow(1, kHeaderBytes, payload_bytes(count, wire)).zero_();
  for (size_t r = 0; r < rows.size(); ++r) {
    if (!rows[r].numel()) continue;
    const at::Tensor payload = to_wire(flat[r].mul(s[int64_t(r)].to(flat[r].scalar_type())).to(at::kFloat), wire);
    frames[int64_t(r)].narrow(0, kHeaderBytes, payload_bytes(payload.numel(), wire)).copy_(payload.view(at::kByte));
  }
}

}  // namespace

at::ScalarType wire_dtype(compress::Wire wire) {
  switch (wire) {
    case compress::Wire::kFp16: return at::kHalf;
    case compress::Wire::kBf16: return at::kBFloat16;
    case compress::Wire::kE4m3: return at::kFloat8_e4m3fn;
    case compress::Wire::kE5m2: return at::kFloat8_e5m2;
  }
  TORCH_CHECK(false, "cnccl: unknown wire format");
}

int64_t frame_bytes(int64_t count, compress::Wire wire) {
  return kHeaderBytes + (payload_bytes(count, wire) + 3) / 4 * 4;
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
            const at::Tensor& frames, Impl impl) {
  const int64_t bytes = payload_bytes(count, wire);
  TORCH_CHECK(frames.scalar_type() == at::kByte && frames.is_contiguous() && frames.dim() == 2 &&
                  frames.size(0) == int64_t(rows.size()) && frames.size(1) == frame_bytes(count, wire),
              "cnccl: frames of the wrong shape for ", rows.size(), " x ", count, " elements");
  const int64_t padding = frames.size(1) - kHeaderBytes - bytes;
  if (padding) frames.narrow(1, kHeaderBytes + bytes, padding).zero_();
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
  if (!on_kernels(out, impl)) {
    const at::Tensor stacked = at::stack(frames);
    const at::Tensor decoded = payloads(stacked, count, wire).to(at::kFloat).mul_(
        decoding_scales(headers(stacked)).unsqueeze(1));
    out.copy_(decoded[0]);
    for (int64_t r = 1; r < decoded.size(0); ++r) out.add_(decoded[r]);
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
  if (!on_kernels(dst, impl)) {
    const at::Tensor s = decoding_scales(headers(frames)).mul(double(post)).to(dst.scalar_type());
    const at::Tensor values = payloads(frames, count, wire).to(at::kFloat).to(dst.scalar_type()).mul(s.unsqueeze(1));
    dst.copy_(values.view({-1}).narrow(0, 0, n).view(dst.sizes()));
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

}  // namespace cnccl::frames

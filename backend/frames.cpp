#include "backend/frames.h"

namespace cnccl::frames {
namespace {

constexpr int64_t kHeaderBytes = 4;
constexpr int64_t kMaxExponent = 126;  // 2^k and 2^-k both normal fp32 numbers

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

namespace {

int64_t largest_binade(compress::Wire wire) {
  switch (wire) {
    case compress::Wire::kFp16: return 15;
    case compress::Wire::kBf16: return 127;
    case compress::Wire::kE4m3: return 8;
    case compress::Wire::kE5m2: return 15;
  }
  TORCH_CHECK(false, "cnccl: unknown wire format");
}

// 2^k as fp32, built from its bits so that no math library's exp2 is involved; k in [-126, 126].
at::Tensor power_of_two(const at::Tensor& k) { return k.add(127).bitwise_left_shift(23).view(at::kFloat); }

int64_t payload_bytes(int64_t count, compress::Wire wire) { return count * int64_t(compress::wire_bytes(wire)); }

}  // namespace

int64_t frame_bytes(int64_t count, compress::Wire wire) {
  return kHeaderBytes + (payload_bytes(count, wire) + 3) / 4 * 4;
}

at::Tensor exponents(const at::Tensor& amax, compress::Wire wire) {
  const at::Tensor e = std::get<1>(at::frexp(amax));
  const at::Tensor k = e.neg().add(largest_binade(wire)).clamp(-kMaxExponent, kMaxExponent);
  return at::where(at::isfinite(amax).logical_and(amax.gt(0)), k, at::zeros_like(k));
}

void encode(const at::Tensor& wide, double scale, compress::Wire wire, const at::Tensor& frames) {
  const int64_t rows = wide.size(0), count = wide.size(1), bytes = payload_bytes(count, wire);
  TORCH_CHECK(frames.scalar_type() == at::kByte && frames.dim() == 2 && frames.size(0) == rows &&
                  frames.size(1) == frame_bytes(count, wire),
              "cnccl: frames of the wrong shape for ", rows, " x ", count, " elements");
  const double s = double(float(scale));
  at::Tensor y = s == 1.0 ? wide : wide.mul(s);
  y = y.to(at::kFloat);
  const at::Tensor amax = count ? y.abs().amax(1) : at::zeros({rows}, y.options());
  const at::Tensor k = exponents(amax, wire);
  frames.narrow(1, 0, kHeaderBytes).copy_(k.view(at::kByte).view({rows, kHeaderBytes}));
  if (count) {
    const at::Tensor payload = y.mul(power_of_two(k).unsqueeze(1)).to(wire_dtype(wire));
    frames.narrow(1, kHeaderBytes, bytes).copy_(payload.view(at::kByte));
  }
  const int64_t padding = frames.size(1) - kHeaderBytes - bytes;
  if (padding) frames.narrow(1, kHeaderBytes + bytes, padding).zero_();
}

at::Tensor decode(const at::Tensor& frames, int64_t count, compress::Wire wire) {
  const int64_t rows = frames.size(0);
  const at::Tensor k = frames.narrow(1, 0, kHeaderBytes).contiguous().view(at::kInt);
  if (!count) return at::empty({rows, 0}, frames.options().dtype(at::kFloat));
  const at::Tensor payload =
      frames.narrow(1, kHeaderBytes, payload_bytes(count, wire)).contiguous().view(wire_dtype(wire));
  return payload.to(at::kFloat).mul_(power_of_two(k.neg()));
}

at::Tensor sum(const std::vector<at::Tensor>& frames, int64_t count, compress::Wire wire) {
  at::Tensor acc = decode(frames[0].view({1, -1}), count, wire)[0];
  for (size_t r = 1; r < frames.size(); ++r) acc.add_(decode(frames[r].view({1, -1}), count, wire)[0]);
  return acc;
}

}  // namespace cnccl::frames

#include "backend/frames.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "backend/errors.h"
#include "backend/wide_data.h"
#include "compress/formats.h"

// Every public function here holds a compress::GradualUnderflow: the exponents and scales it computes
// outside the kernels (amax x scale, 2^-k x post-scale) are defined with subnormals, on any thread.
namespace cnccl::frames {
namespace {

constexpr int64_t kHeaderBytes = 4;
constexpr int kMaxExponent = compress::formats::kMaxFrameExponent;
constexpr auto kNvfp4 = compress::Wire::kNvfp4;

// An MX frame is its blocks alone: each carries its own scale. An NVFP4 frame's header is a block's
// size, so that a frame cuts into whole blocks (nv_header_bytes).
int64_t header_bytes(compress::Wire wire) {
  return compress::is_mx(wire) ? 0 : wire == kNvfp4 ? nv_header_bytes() : kHeaderBytes;
}

int64_t payload_bytes(int64_t count, compress::Wire wire) {
  if (compress::is_mx(wire)) return int64_t(compress::mx_bytes(size_t(count), wire));
  if (wire == kNvfp4) return int64_t(compress::nv_bytes(size_t(count)));
  return count * int64_t(compress::wire_bytes(wire));
}

// --- The CPU kernels.

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
  const int32_t k = compress::formats::frame_exponent(static_cast<float>(magnitude), wire);
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

// Where each received frame's values start, and its decoding scale 2^-k (k checked: header_of).
std::pair<std::vector<const void*>, std::vector<float>> decoding(const uint8_t* const* frames, int64_t ranks) {
  std::vector<const void*> payloads;
  std::vector<float> scales;
  for (int64_t r = 0; r < ranks; ++r) {
    payloads.push_back(frames[r] + kHeaderBytes);
    scales.push_back(std::ldexp(1.0f, -header_of(frames[r], r)));
  }
  return {payloads, scales};
}

// Where each received NVFP4 frame's run starts, and its part scale (checked: nv_header).
std::pair<std::vector<const uint8_t*>, std::vector<float>> nv_decoding(const uint8_t* const* frames, int64_t ranks) {
  std::vector<const uint8_t*> runs;
  std::vector<float> parts;
  for (int64_t r = 0; r < ranks; ++r) {
    runs.push_back(frames[r] + nv_header_bytes());
    parts.push_back(nv_header(frames[r], r));
  }
  return {runs, parts};
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

}  // namespace

at::ScalarType wire_dtype(compress::Wire wire) {
  switch (wire) {
    case compress::Wire::kFp16: return at::kHalf;
    case compress::Wire::kBf16: return at::kBFloat16;
    case compress::Wire::kE4m3: case compress::Wire::kMxfp8: return at::kFloat8_e4m3fn;
    case compress::Wire::kE5m2: case compress::Wire::kMxfp8E5m2: return at::kFloat8_e5m2;
    case compress::Wire::kMxfp4: case compress::Wire::kNvfp4: return at::kByte;  // two e2m1 elements a byte
  }
  TORCH_CHECK(false, "cnccl: unknown wire format");
}

int64_t frame_bytes(int64_t count, compress::Wire wire) {
  if (wire == kNvfp4) return (header_bytes(wire) + payload_bytes(count, wire) + 3) / 4 * 4;
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
            compress::MxScale mx_scale, const at::Tensor& frames, const compress::Dither* dither) {
  const compress::GradualUnderflow exact;
  const int64_t bytes = payload_bytes(count, wire);
  TORCH_CHECK(frames.is_cpu() && frames.scalar_type() == at::kByte && frames.is_contiguous() && frames.dim() == 2 &&
                  frames.size(0) == int64_t(rows.size()) && frames.size(1) == frame_bytes(count, wire),
              "cnccl: frames of the wrong shape for ", rows.size(), " x ", count, " elements");
  const int64_t header = header_bytes(wire), padding = frames.size(1) - header - bytes;
  if (padding) frames.narrow(1, header + bytes, padding).zero_();
  for (size_t r = 0; r < rows.size(); ++r) {
    const at::Tensor x = rows[r].contiguous();
    const int64_t len = x.numel();
    uint8_t* frame = frames[int64_t(r)].mutable_data_ptr<uint8_t>();
    if (compress::is_mx(wire)) {
      // A short row's blocks are those of `count` values, its missing ones +0.
      with_wide_data(static_cast<const char*>(x.const_data_ptr()), x.scalar_type(), [&](const auto* row) {
        if (dither) return compress::mx_encode(row, size_t(len), size_t(count), float(scale), wire, mx_scale, frame,
                                               *dither, uint64_t(r) * uint64_t(count));
        compress::mx_encode(row, size_t(len), size_t(count), float(scale), wire, mx_scale, frame);
      });
      continue;
    }
    if (wire == kNvfp4) {
      with_wide_data(static_cast<const char*>(x.const_data_ptr()), x.scalar_type(), [&](const auto* row) {
        const float part = compress::nv_part_scale(row, size_t(len), float(scale));
        write_nv_header(part, frame);
        uint8_t* blocks = frame + nv_header_bytes();
        if (dither) return compress::nv_encode(row, size_t(len), size_t(count), float(scale), part, blocks, *dither,
                                               uint64_t(r) * uint64_t(count));
        compress::nv_encode(row, size_t(len), size_t(count), float(scale), part, blocks);
      });
      continue;
    }
    const int64_t width = int64_t(compress::wire_bytes(wire));
    if (len < count) std::memset(frame + kHeaderBytes + len * width, 0, size_t((count - len) * width));
    with_wide_data(static_cast<const char*>(x.const_data_ptr()), x.scalar_type(),
                   [&](const auto* row) { encode_row(row, len, float(scale), wire, frame); });
  }
}

at::Tensor sum(const std::vector<at::Tensor>& frames, int64_t count, compress::Wire wire, const at::Tensor& out) {
  const compress::GradualUnderflow exact;
  TORCH_CHECK(out.is_cpu() && out.scalar_type() == at::kFloat && out.is_contiguous() && out.numel() == count,
              "cnccl: a frame sum needs a contiguous fp32 CPU output of ", count, " elements");
  std::vector<const uint8_t*> in;
  for (const auto& f : frames) in.push_back(f.const_data_ptr<uint8_t>());
  if (compress::is_mx(wire)) {
    compress::mx_sum(in.data(), in.size(), out.mutable_data_ptr<float>(), size_t(count), wire);
    return out;
  }
  if (wire == kNvfp4) {
    const auto [runs, parts] = nv_decoding(in.data(), int64_t(in.size()));
    compress::nv_sum(runs.data(), parts.data(), in.size(), out.mutable_data_ptr<float>(), size_t(count));
    return out;
  }
  const auto [payloads, scales] = decoding(in.data(), int64_t(in.size()));
  compress::scaled_sum(payloads.data(), scales.data(), in.size(), out.mutable_data_ptr<float>(), size_t(count), wire);
  return out;
}

void sum_encode(const at::Tensor& frames, int64_t count, compress::Wire wire, compress::MxScale mx_scale,
                const at::Tensor& out, const compress::Dither* dither, uint64_t first) {
  const compress::GradualUnderflow exact;
  TORCH_CHECK(frames.is_cpu() && frames.scalar_type() == at::kByte && frames.dim() == 2 && frames.stride(1) == 1 &&
                  frames.size(1) == frame_bytes(count, wire) && out.is_contiguous() &&
                  out.numel() == frames.size(1),
              "cnccl: a frame sum takes CPU frames of ", count, " elements and one frame for its result");
  std::vector<const uint8_t*> in;
  for (int64_t r = 0; r < frames.size(0); ++r) in.push_back(frames[r].const_data_ptr<uint8_t>());
  auto* dst = out.mutable_data_ptr<uint8_t>();
  const compress::CensusSamplesPaused not_a_contribution;
  const int64_t filled = header_bytes(wire) + payload_bytes(count, wire);
  if (out.numel() > filled) std::memset(dst + filled, 0, size_t(out.numel() - filled));
  if (compress::is_mx(wire)) {
    if (dither) return compress::mx_sum_encode(in.data(), in.size(), size_t(count), wire, mx_scale, dst, *dither, first);
    return compress::mx_sum_encode(in.data(), in.size(), size_t(count), wire, mx_scale, dst);
  }
  if (wire == kNvfp4) {
    // The headers are read before any byte of `out` is written, and its own header after the blocks.
    const auto [runs, parts] = nv_decoding(in.data(), int64_t(in.size()));
    uint8_t* blocks = dst + nv_header_bytes();
    const float part =
        dither ? compress::nv_sum_encode(runs.data(), parts.data(), in.size(), size_t(count), blocks, *dither, first)
               : compress::nv_sum_encode(runs.data(), parts.data(), in.size(), size_t(count), blocks);
    return write_nv_header(part, dst);
  }
  // Twice through the frames a piece at a time: the sums' amax, then the sums again, cast with the
  // exponent it gives. A piece's values are read before its bytes of `out` are written, so `out` may be
  // one of the frames.
  const auto [payloads, scales] = decoding(in.data(), int64_t(in.size()));
  const int64_t width = int64_t(compress::wire_bytes(wire));
  constexpr int64_t kPiece = 2048;
  float sums[kPiece];
  std::vector<const void*> at(in.size());
  auto sum_piece = [&](int64_t first, int64_t m) {
    for (size_t r = 0; r < in.size(); ++r) at[r] = static_cast<const uint8_t*>(payloads[r]) + first * width;
    compress::scaled_sum(at.data(), scales.data(), in.size(), sums, size_t(m), wire);
  };
  uint32_t amax_bits = 0;
  for (int64_t first = 0; first < count; first += kPiece) {
    const int64_t m = std::min(kPiece, count - first);
    sum_piece(first, m);
    amax_bits = std::max(amax_bits, compress::formats::bits_of(compress::amax(sums, size_t(m))));
  }
  const int32_t k = compress::formats::frame_exponent(compress::formats::float_of(amax_bits), wire);
  const float s = std::ldexp(1.0f, k);
  // The 8-bit casts count nothing while the exponent keeps every value in range (encode_row).
  const bool count_8bit = width == 1 && amax_bits >= compress::formats::kInfinity;
  for (int64_t first = 0; first < count; first += kPiece) {
    const int64_t m = std::min(kPiece, count - first);
    sum_piece(first, m);
    uint8_t* payload = dst + kHeaderBytes + first * width;
    if (width == 1) {
      if (count_8bit) compress::count_casts(sums, size_t(m), s, wire);
      compress::cast(sums, payload, size_t(m), s, wire);
    } else {
      compress::cast(sums, reinterpret_cast<uint16_t*>(payload), size_t(m), s, wire);
    }
  }
  std::memcpy(dst, &k, sizeof k);
}

void restore(const at::Tensor& frames, int64_t count, compress::Wire wire, double post_scale, const at::Tensor& dst) {
  const compress::GradualUnderflow exact;
  TORCH_CHECK(frames.is_cpu() && dst.is_cpu(), "cnccl: frames::restore runs on CPU tensors");
  const int64_t n = dst.numel();
  if (!n) return;
  const float post = float(post_scale);
  const at::Tensor f = frames.contiguous();
  at::Tensor out = dst.is_contiguous() ? dst : at::empty_like(dst, at::MemoryFormat::Contiguous);
  if (compress::is_mx(wire)) {
    with_wide_data(out, [&](auto* y) {
      for (int64_t r = 0, first = 0; first < n; ++r, first += count) {
        compress::mx_restore(f[r].const_data_ptr<uint8_t>(), size_t(count), y + first,
                             size_t(std::min(count, n - first)), post, wire);
      }
    });
  } else if (wire == kNvfp4) {
    // Every row's header is checked before any row is written: a bad one leaves dst as it was.
    std::vector<float> parts;
    for (int64_t r = 0; r * count < n; ++r) parts.push_back(nv_header(f[r].const_data_ptr<uint8_t>(), r));
    with_wide_data(out, [&](auto* y) {
      for (int64_t r = 0, first = 0; first < n; ++r, first += count) {
        compress::nv_restore(f[r].const_data_ptr<uint8_t>() + nv_header_bytes(), size_t(count), parts[size_t(r)],
                             y + first, size_t(std::min(count, n - first)), post);
      }
    });
  } else {
    // Every row's exponent is checked before any row is written: a bad one leaves dst as it was.
    std::vector<float> scales;
    for (int64_t r = 0; r * count < n; ++r) {
      scales.push_back(std::ldexp(post, -header_of(f[r].const_data_ptr<uint8_t>(), r)));
    }
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
  }
  if (!out.is_same(dst)) dst.copy_(out);
}

int64_t payload_offset(compress::Wire wire) { return header_bytes(wire); }

int64_t nv_header_bytes() { return int64_t(compress::nv_bytes(compress::kNvBlock)); }

void write_nv_header(float part, uint8_t* dst) {
  std::memcpy(dst, &part, sizeof part);
  std::memset(dst + sizeof part, 0, size_t(nv_header_bytes()) - sizeof part);
}

float nv_header(const uint8_t* frame, int64_t sender) {
  float part;
  std::memcpy(&part, frame, sizeof part);
  // Only this code writes frames: compress::nv_part_scale's values lie in [2^-120, FLT_MAX / 2688].
  if (!compress::formats::nv_part_is_valid(part)) {
    throw errors::backend_error("cnccl: the NVFP4 frame from rank " + std::to_string(sender) +
                                " carries the part scale " + std::to_string(part) + ", outside [2^-120, 2^128 / 2688]: " +
                                "the peer sent corrupt data or runs another version of cnccl");
  }
  return part;
}

int32_t row_exponent(const at::Tensor& row, double scale, compress::Wire wire) {
  return row_exponent(std::vector<at::Tensor>{row}, scale, wire);
}

int32_t row_exponent(const std::vector<at::Tensor>& pieces, double scale, compress::Wire wire) {
  const compress::GradualUnderflow exact;
  TORCH_CHECK(!compress::is_blocks(wire) && !pieces.empty(), "cnccl: row_exponent takes the rows of a power-of-two frame");
  for (const auto& p : pieces) {
    TORCH_CHECK(p.is_cpu() && p.is_contiguous() && p.scalar_type() == pieces[0].scalar_type(),
                "cnccl: row_exponent takes contiguous CPU pieces of one dtype");
  }
  int32_t k = 0;
  with_wide_data(static_cast<const char*>(pieces[0].const_data_ptr()), pieces[0].scalar_type(), [&](const auto* first) {
    using T = std::remove_cv_t<std::remove_pointer_t<decltype(first)>>;
    T amax = 0;  // a NaN anywhere makes it NaN
    for (const auto& p : pieces) {
      const T a = compress::amax(static_cast<const T*>(p.const_data_ptr()), size_t(p.numel()));
      if (std::isnan(a) || a > amax) amax = a;
      if (std::isnan(amax)) break;
    }
    // Each piece's casts are counted where they are (the exponent is the same for every piece).
    for (const auto& p : pieces) {
      k = exponent_of_amax(amax, static_cast<const T*>(p.const_data_ptr()), p.numel(), float(scale), wire);
    }
  });
  return k;
}

int32_t sum_exponent(float amax, const at::Tensor& sums, compress::Wire wire) {
  const compress::GradualUnderflow exact;
  TORCH_CHECK(sums.is_cpu() && sums.is_contiguous() && sums.scalar_type() == at::kFloat && !compress::is_blocks(wire),
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
  const compress::GradualUnderflow exact;
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
  const compress::GradualUnderflow exact;
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
  const compress::GradualUnderflow exact;
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

#include "backend/host/reductions/level_codec.h"

#include <algorithm>
#include <cstring>

#include "backend/frames.h"
#include "backend/host/staging.h"
#include "backend/wide_data.h"

namespace cnccl::host {
namespace {

constexpr size_t kBlock = compress::kMxBlock;
constexpr size_t kNvBlock = compress::kNvBlock;

float float_of(int32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

int32_t bits_of(float f) {
  int32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  return bits;
}

const char* data_at(const at::Tensor& piece, size_t value) {
  return static_cast<const char*>(piece.const_data_ptr()) + value * piece.element_size();
}

// Values [at, at + len) of `row`, cut where its pieces end: f(where in the run, the piece (null past the
// last), its first value there, how many it has, the run's values there).
template <typename F>
void runs(const LevelCodec::Row& row, size_t at, size_t len, const F& f) {
  const std::vector<at::Tensor>& pieces = *row.pieces;
  const size_t segment = size_t(row.segment);
  for (size_t v = at; v < at + len;) {
    const size_t j = v / segment, off = v % segment;
    const size_t run = std::min(at + len - v, segment - off);
    const at::Tensor* piece = j < pieces.size() ? &pieces[j] : nullptr;
    const size_t have = piece ? std::min(run, size_t(std::max<int64_t>(piece->numel() - int64_t(off), 0))) : 0;
    f(v - at, piece, off, have, run);
    v += run;
  }
}

}  // namespace

LevelCodec::LevelCodec(const std::optional<compress::Wire>& wire, int64_t count, compress::MxScale mx_scale)
    : form_(!wire                                ? Form::kFp32
            : compress::is_mx(*wire)             ? Form::kBlocks
            : *wire == compress::Wire::kNvfp4    ? Form::kPartBlocks
                                                 : Form::kFrames),
      mx_scale_(mx_scale),
      count_(count) {
  if (wire) wire_ = *wire;
  switch (form_) {
    case Form::kFp32:
      units_ = size_t(count), elem_ = out_elem_ = sizeof(float);
      break;
    case Form::kFrames:
      elem_ = compress::wire_bytes(wire_), out_elem_ = sizeof(float);
      units_ = size_t(frames::frame_bytes(count, wire_)) / elem_;
      values_at_ = size_t(frames::payload_offset(wire_)) / elem_;
      break;
    case Form::kBlocks:
      units_ = (size_t(count) + kBlock - 1) / kBlock;
      elem_ = compress::mx_bytes(kBlock, wire_);
      out_elem_ = kBlock * sizeof(float);
      break;
    case Form::kPartBlocks:
      units_ = 1 + (size_t(count) + kNvBlock - 1) / kNvBlock;
      elem_ = size_t(frames::nv_header_bytes());
      out_elem_ = kNvBlock * sizeof(float);
      values_at_ = 1;
      break;
  }
}

std::pair<size_t, size_t> LevelCodec::values_of(size_t u, size_t k) const {
  const size_t count = size_t(count_);
  size_t first = u, end = u + k;
  if (form_ == Form::kFrames) {
    first = std::max(u, values_at_) - values_at_;
    end = std::max(end, values_at_) - values_at_;
  }
  if (form_ == Form::kBlocks) first = u * kBlock, end = (u + k) * kBlock;
  if (form_ == Form::kPartBlocks) first = (std::max<size_t>(u, 1) - 1) * kNvBlock, end = (std::max<size_t>(u + k, 1) - 1) * kNvBlock;
  first = std::min(first, count);
  return {first, std::min(end, count) - first};
}

std::pair<size_t, size_t> LevelCodec::units_of(size_t v0, size_t v1) const {
  switch (form_) {
    case Form::kFp32: return {v0, v1};
    case Form::kFrames: return {values_at_ + v0, values_at_ + v1};
    case Form::kPartBlocks: return {1 + v0 / kNvBlock, 1 + (v1 + kNvBlock - 1) / kNvBlock};
    case Form::kBlocks: break;
  }
  return {v0 / kBlock, (v1 + kBlock - 1) / kBlock};
}

int32_t LevelCodec::exponent(const Row& row) const {
  if (form_ == Form::kPartBlocks) {
    // The part scale grows with the amax: the largest of the pieces' is the row's.
    float part = compress::nv_part_scale(0.0f);
    for (const auto& p : *row.pieces) {
      const at::Tensor x = p.contiguous();
      with_wide_data(static_cast<const char*>(x.const_data_ptr()), x.scalar_type(), [&](const auto* v) {
        part = std::max(part, compress::nv_part_scale(v, size_t(x.numel()), float(row.scale)));
      });
    }
    return bits_of(part);
  }
  return form_ == Form::kFrames ? frames::row_exponent(*row.pieces, row.scale, wire_) : 0;
}

int32_t LevelCodec::sum_exponent(float amax, const at::Tensor& sums) const {
  if (form_ == Form::kPartBlocks) return bits_of(compress::nv_part_scale(amax));
  return frames::sum_exponent(amax, sums, wire_);
}

void LevelCodec::encode(const Row& row, size_t u, size_t k, uint8_t* dst) const {
  TORCH_INTERNAL_ASSERT(!row.dither || form_ != Form::kFrames, "cnccl: power-of-two frames round to nearest only");
  const std::vector<at::Tensor>& pieces = *row.pieces;
  const at::ScalarType dtype = pieces[0].scalar_type();
  switch (form_) {
    case Form::kFp32: {
      auto* out = reinterpret_cast<float*>(dst);
      runs(row, u, k, [&](size_t o, const at::Tensor* piece, size_t off, size_t have, size_t run) {
        if (have) {
          with_wide_data(data_at(*piece, off), dtype, [&](const auto* v) {
            using T = std::remove_cv_t<std::remove_pointer_t<decltype(v)>>;
            const T scale = T(float(row.scale));
            for (size_t i = 0; i < have; ++i) out[o + i] = float(v[i] * scale);
          });
        }
        std::fill(out + o + have, out + o + run, 0.0f);
      });
      return;
    }
    case Form::kFrames: {
      const int64_t from = int64_t(u * elem_), end = from + int64_t(k * elem_);
      const int64_t header = frames::payload_offset(wire_), width = int64_t(elem_), segment = row.segment;
      const int64_t n = int64_t(pieces.size());
      // Piece j writes the frame's bytes of its values as the frame of its own values alone would, that
      // frame moved by j x segment values: the header goes with the first piece, the padding with the last.
      for (int64_t j = 0; j < n; ++j) {
        const int64_t shift = j * segment * width, last = j + 1 == n;
        const int64_t lo = std::max(from, j == 0 ? 0 : header + shift);
        const int64_t hi = last ? end : std::min(end, header + shift + segment * width);
        if (hi <= lo) continue;
        frames::encode_piece(pieces[size_t(j)], row.k, row.scale, wire_, last ? count_ - j * segment : segment,
                             lo - shift, hi - lo, dst + (lo - from));
      }
      return;
    }
    case Form::kBlocks:
      break;
    case Form::kPartBlocks:
      if (u == 0 && k > 0) {
        frames::write_nv_header(float_of(row.k), dst);
        dst += elem_, ++u, --k;
      }
      if (k == 0) return;  // the header alone: a part of no values has no pieces to read
      break;
  }
  const auto [at, len] = values_of(u, k);
  const float part = float_of(row.k);
  auto encode_run = [&](const auto* v, size_t have, size_t total) {
    if (form_ == Form::kPartBlocks && row.dither) {
      return compress::nv_encode(v, have, total, float(row.scale), part, dst, *row.dither, row.first + at);
    }
    if (form_ == Form::kPartBlocks) return compress::nv_encode(v, have, total, float(row.scale), part, dst);
    if (row.dither) {
      return compress::mx_encode(v, have, total, float(row.scale), wire_, mx_scale_, dst, *row.dither, row.first + at);
    }
    compress::mx_encode(v, have, total, float(row.scale), wire_, mx_scale_, dst);
  };
  const size_t segment = size_t(row.segment), j = at / segment;
  if (len == 0 || (at + len - 1) / segment == j) {
    const size_t off = at % segment;
    const at::Tensor& piece = pieces[j];
    const size_t have = std::min(len, size_t(std::max<int64_t>(piece.numel() - int64_t(off), 0)));
    return with_wide_data(data_at(piece, off), dtype, [&](const auto* v) { encode_run(v, have, len); });
  }
  // Blocks across two pieces (a reduce_scatter's outputs of other than a block's multiple): their values
  // joined first, this run's alone.
  with_wide_data(data_at(pieces[0], 0), dtype, [&](const auto* first_piece) {
    using T = std::remove_cv_t<std::remove_pointer_t<decltype(first_piece)>>;
    std::vector<T> joined(len, T(0));
    runs(row, at, len, [&](size_t o, const at::Tensor* piece, size_t off, size_t have, size_t) {
      if (have) std::memcpy(joined.data() + o, data_at(*piece, off), have * sizeof(T));
    });
    encode_run(joined.data(), len, len);
  });
}

float LevelCodec::sum(const uint8_t* const* in, int ranks, int32_t* heard, size_t u, size_t k, float* dst) const {
  switch (form_) {
    case Form::kFp32:
      std::memcpy(dst, in[0], k * sizeof(float));
      for (int r = 1; r < ranks; ++r) {
        const auto* v = reinterpret_cast<const float*>(in[r]);
        for (size_t i = 0; i < k; ++i) dst[i] += v[i];
      }
      return 0.0f;
    case Form::kFrames:
      return frames::sum_pieces(in, ranks, heard, wire_, count_, int64_t(u * elem_), int64_t(k * elem_), dst);
    case Form::kBlocks:
      compress::mx_sum(in, size_t(ranks), dst, values_of(u, k).second, wire_);
      return 0.0f;
    case Form::kPartBlocks:
      break;
  }
  std::vector<const uint8_t*> runs(in, in + ranks);
  if (u == 0) {
    for (int r = 0; r < ranks; ++r) {
      heard[r] = bits_of(frames::nv_header(in[r], r));
      runs[size_t(r)] += elem_;
    }
    dst += kNvBlock;  // the header's unit holds no sums
  }
  std::vector<float> parts(static_cast<size_t>(ranks));
  for (int r = 0; r < ranks; ++r) parts[size_t(r)] = float_of(heard[r]);
  return compress::nv_sum(runs.data(), parts.data(), size_t(ranks), dst, values_of(u, k).second);
}

void LevelCodec::sum_encode(const uint8_t* const* in, int ranks, size_t u, size_t k, uint8_t* dst,
                            const compress::Dither* dither, uint64_t first) const {
  TORCH_INTERNAL_ASSERT(form_ == Form::kBlocks, "cnccl: sum_encode takes MX blocks");
  const auto [at, len] = values_of(u, k);
  if (dither) return compress::mx_sum_encode(in, size_t(ranks), len, wire_, mx_scale_, dst, *dither, first + at);
  compress::mx_sum_encode(in, size_t(ranks), len, wire_, mx_scale_, dst);
}

void LevelCodec::restore(const uint8_t* run, int32_t* told, int64_t sender, size_t u, size_t k, int64_t given,
                         double post_scale, at::ScalarType dtype, char* dst) const {
  if (form_ == Form::kFrames) {
    if (given <= 0) return;  // a part past the tensor's end: nothing of it is read, as frames::restore()
    return frames::restore_piece(run, told, sender, wire_, count_, std::min(given, count_), int64_t(u * elem_),
                                 int64_t(k * elem_), post_scale, dtype, dst);
  }
  if (form_ == Form::kPartBlocks) {
    if (given <= 0) return;  // as a frame's
    if (u == 0) *told = bits_of(frames::nv_header(run, sender)), run += elem_;
  }
  const auto [at, len] = values_of(u, k);
  const size_t n = int64_t(at) < given ? std::min(len, size_t(given) - at) : 0;
  if (n == 0) return;
  char* out = dst + at * at::elementSize(dtype);
  if (form_ == Form::kFp32) {
    return write_scaled_sums(view(reinterpret_cast<char*>(const_cast<uint8_t*>(run)), int64_t(n), at::kFloat),
                             view(out, int64_t(n), dtype), post_scale);
  }
  if (form_ == Form::kPartBlocks) {
    const float part = float_of(*told);
    if (dtype == at::kDouble) return compress::nv_restore(run, len, part, reinterpret_cast<double*>(out), n, float(post_scale));
    return compress::nv_restore(run, len, part, reinterpret_cast<float*>(out), n, float(post_scale));
  }
  if (dtype == at::kDouble) {
    compress::mx_restore(run, len, reinterpret_cast<double*>(out), n, float(post_scale), wire_);
  } else {
    compress::mx_restore(run, len, reinterpret_cast<float*>(out), n, float(post_scale), wire_);
  }
}

}  // namespace cnccl::host

// Power-of-two frames (backend/frames.h): the CPU kernels and the ATen operations that CUDA tensors
// take must give the same bits; both run here on CPU tensors, on values chosen to reach every branch
// of the definition (zeros, NaN and inf, values past fp32's and the wire's ranges, short and empty
// rows, fp32 and fp64, scales that are not powers of two).
#include <gtest/gtest.h>


#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <map>

#include "backend/frames.h"
#include "tests/cpp/counting_allocator.h"

namespace cnccl::frames {
namespace {

using compress::Wire;
using testing::CountingAllocator;

std::vector<at::Tensor> rows_of(at::ScalarType dtype, int64_t count) {
  at::manual_seed(5);
  std::vector<at::Tensor> rows;
  rows.push_back(at::randn({count}) * 1e-7);
  rows.push_back(at::randn({count}) * at::pow(10.0, at::rand({count}) * 16 - 8));
  rows.push_back(at::zeros({count}));
  at::Tensor special = at::randn({count});
  special[0] = INFINITY;
  rows.push_back(special);
  special = at::randn({count});
  special[count / 2] = NAN;
  rows.push_back(special);
  rows.push_back(at::randn({count}) * 3e38);
  rows.push_back(at::randn({count}) * 1e-40);  // fp32 subnormals
  rows.push_back(at::randn({count / 3}));        // short
  rows.push_back(at::empty({0}));                // empty
  for (auto& r : rows) r = r.to(dtype);
  return rows;
}

// The same bits, except that any NaN matches any NaN: torch's vectorized conversions may give a NaN
// another payload than its scalar ones do (bf16 on processors with AVX512-BF16).
void expect_same_bits(const at::Tensor& a, const at::Tensor& b, const std::string& what) {
  const at::Tensor x = a.contiguous().view({-1}), y = b.contiguous().view({-1});
  const at::ScalarType bits = x.element_size() == 8 ? at::kLong : at::kInt;
  const at::Tensor both_nan = x.isnan().logical_and(y.isnan());
  const at::Tensor differ = x.view(bits).ne(y.view(bits)).logical_and(both_nan.logical_not()).nonzero();
  ASSERT_EQ(differ.numel(), 0) << what << ": " << differ.numel() << " elements differ, first at "
                               << differ[0].item<int64_t>() << ": " << x[differ[0].item<int64_t>()].item<double>()
                               << " vs " << y[differ[0].item<int64_t>()].item<double>();
}

// Frames compared through their headers and their values (decoded by the kernels).
void expect_same_frames(const at::Tensor& a, const at::Tensor& b, int64_t count, Wire w, const std::string& what) {
  if (compress::is_mx(w)) {
    // Every byte: the blocks' scales, their elements and the padding.
    ASSERT_TRUE(at::equal(a, b)) << what << ": " << a.ne(b).sum().item<int64_t>() << " bytes differ";
    return;
  }
  expect_same_bits(a.narrow(1, 0, 4).contiguous().view(at::kInt), b.narrow(1, 0, 4).contiguous().view(at::kInt),
                   "headers of " + what);
  at::Tensor x = at::empty({a.size(0) * count}), y = at::empty({b.size(0) * count});
  restore(a, count, w, 1.0, x);
  restore(b, count, w, 1.0, y);
  expect_same_bits(x, y, what);
}

TEST(Frames, KernelsAndAtenGiveTheSameBits) {
  for (Wire w : {Wire::kFp16, Wire::kBf16, Wire::kE4m3, Wire::kE5m2, Wire::kMxfp8, Wire::kMxfp8E5m2, Wire::kMxfp4}) {
    for (at::ScalarType dtype : {at::kFloat, at::kDouble}) {
      for (double scale : {1.0, 1.0 / 3, -2.5e-3}) {
        for (int64_t count : {1, 7, 33, 1000}) {
          for (compress::MxScale rule : {compress::MxScale::kRceil, compress::MxScale::kFloor}) {
            const std::string what = std::string(compress::wire_name(w)) + " " + c10::toString(dtype) +
                                     " scale " + std::to_string(scale) + " count " + std::to_string(count) + " " +
                                     compress::mx_scale_name(rule);
            const auto rows = rows_of(dtype, count);
            const int64_t n = int64_t(rows.size());
            at::Tensor kernels = at::empty({n, frame_bytes(count, w)}, at::kByte);
            at::Tensor aten = at::empty_like(kernels);
            encode(rows, count, scale, w, rule, kernels);
            encode(rows, count, scale, w, rule, aten, Impl::kAten);
            expect_same_frames(kernels, aten, count, w, "encode " + what);

            const auto frames = kernels.unbind(0);
            expect_same_bits(sum(frames, count, w, at::empty({count})),
                             sum(frames, count, w, at::empty({count}), Impl::kAten), "sum " + what);

            for (at::ScalarType out : {at::kFloat, at::kDouble}) {
              at::Tensor a = at::empty({n * count - 2}, out), b = at::empty({n * count - 2}, out);
              restore(kernels, count, w, 3.0, a);
              restore(kernels, count, w, 3.0, b, Impl::kAten);
              expect_same_bits(a, b, "restore " + what);
              at::Tensor strided = at::empty({2, n * count}, out).select(1, 0);  // a column: not contiguous
              at::Tensor c = at::empty({2}, out);
              restore(kernels, count, w, 1.0, strided);
              restore(kernels, count, w, 1.0, c, Impl::kAten);
              expect_same_bits(strided, c, "strided restore " + what);
            }
          }
        }
      }
    }
  }
}

// The ATen forms work through a large row in pieces of an eighth of it: here, n = 8M elements, each
// holds at most `bound` bytes per element beyond the frames and the output. Whole rows took: encode 6
// (fp16) and 14 (e4m3), the owner's sum 5-6 and the restore 8; mxfp8 8, 13 and 12; mxfp4 12, 47 and 46.
TEST(Frames, TheAtenFormsWorkInPiecesOfAnEighthOfARow) {
  const int64_t count = int64_t(8) << 20;
  for (Wire w : {Wire::kFp16, Wire::kE4m3, Wire::kMxfp8, Wire::kMxfp4}) {
    std::vector<at::Tensor> rows{at::randn({count})};
    rows[0][count - 3] = 300.0;  // the row's largest magnitude is in its last piece
    at::Tensor frames = at::empty({1, frame_bytes(count, w)}, at::kByte);
    at::Tensor out = at::empty({count});
    int64_t encode_peak = 0, sum_peak = 0, restore_peak = 0;
    {
      CountingAllocator counting;
      encode(rows, count, 1.0, w, compress::MxScale::kRceil, frames, Impl::kAten);
      encode_peak = counting.peak();
    }
    {
      CountingAllocator counting;
      sum(frames.unbind(0), count, w, out, Impl::kAten);
      sum_peak = counting.peak();
    }
    {
      CountingAllocator counting;
      restore(frames, count, w, 1.0, out, Impl::kAten);
      restore_peak = counting.peak();
    }
    // Piece by piece, the bits of the kernels' whole rows.
    at::Tensor kernels = at::empty_like(frames);
    encode(rows, count, 1.0, w, compress::MxScale::kRceil, kernels);
    expect_same_frames(kernels, frames, count, w, std::string("encode in pieces, ") + compress::wire_name(w));
    expect_same_bits(sum(kernels.unbind(0), count, w, at::empty({count})), sum(kernels.unbind(0), count, w, at::empty({count}), Impl::kAten),
                     std::string("sum in pieces, ") + compress::wire_name(w));
    at::Tensor restored = at::empty({count});
    restore(kernels, count, w, 1.0, restored);
    expect_same_bits(restored, out, std::string("restore in pieces, ") + compress::wire_name(w));
    // Bytes per element: encode, sum, restore (mxfp4 decodes through int32 nibbles).
    const std::map<Wire, std::array<double, 3>> bound{{Wire::kFp16, {0.8, 0.6, 0.6}}, {Wire::kE4m3, {1.3, 0.6, 0.6}},
                                                      {Wire::kMxfp8, {1.1, 0.6, 0.6}}, {Wire::kMxfp4, {1.6, 1.2, 1.2}}};
    EXPECT_LE(double(encode_peak) / double(count), bound.at(w)[0]) << compress::wire_name(w) << " encode";
    EXPECT_LE(double(sum_peak) / double(count), bound.at(w)[1]) << compress::wire_name(w) << " sum";
    EXPECT_LE(double(restore_peak) / double(count), bound.at(w)[2]) << compress::wire_name(w) << " restore";
  }
}

// The host path's pipelined form (encode_piece, sum_pieces) against the whole-frame kernels: a frame
// cut at every kind of place (inside the header's reach, at each value, mid-payload, in the padding,
// one piece) gives the same bytes and the same sums, for rows that reach every branch of encode.
TEST(Frames, PiecesGiveTheBitsOfWholeFrames) {
  for (Wire w : {Wire::kFp16, Wire::kBf16, Wire::kE4m3, Wire::kE5m2}) {
    const int64_t width = int64_t(compress::wire_bytes(w));
    for (at::ScalarType dtype : {at::kFloat, at::kDouble}) {
      for (int64_t count : {1, 7, 33, 1000}) {
        const std::string what = std::string(compress::wire_name(w)) + " " + c10::toString(dtype) + " count " +
                                 std::to_string(count);
        const auto rows = rows_of(dtype, count);
        const int64_t n = int64_t(rows.size()), bytes = frame_bytes(count, w);
        at::Tensor whole = at::empty({n, bytes}, at::kByte);
        encode(rows, count, 1.0 / 3, w, compress::MxScale::kRceil, whole);
        // Cuts: the header alone, then values one at a time, then a long piece, then the rest.
        std::vector<int64_t> cuts{0, payload_offset(w)};
        for (int64_t b = payload_offset(w) + width; b < std::min(bytes, payload_offset(w) + 4 * width); b += width) {
          cuts.push_back(b);
        }
        if (bytes - cuts.back() > 2 * width) cuts.push_back(cuts.back() + (bytes - cuts.back()) / (2 * width) * width);
        cuts.push_back(bytes);
        for (bool one_piece : {false, true}) {
          const std::vector<int64_t> at_cuts = one_piece ? std::vector<int64_t>{0, bytes} : cuts;
          at::Tensor pieces = at::full({n, bytes}, 0xAB, at::kByte);
          std::vector<int32_t> k(static_cast<size_t>(n));
          for (int64_t r = 0; r < n; ++r) {
            const at::Tensor row = rows[size_t(r)].contiguous();
            const int32_t exponent = row_exponent(row, 1.0 / 3, w);
            for (size_t c = 0; c + 1 < at_cuts.size(); ++c) {
              encode_piece(row, exponent, 1.0 / 3, w, count, at_cuts[c], at_cuts[c + 1] - at_cuts[c],
                           pieces[r].mutable_data_ptr<uint8_t>() + at_cuts[c]);
            }
          }
          ASSERT_TRUE(at::equal(pieces, whole)) << what << (one_piece ? " in one piece" : " in pieces") << ": "
                                                << pieces.ne(whole).sum().item<int64_t>() << " bytes differ";
          // The owner's sum of every row's frame, piece by piece into out indexed by the frame's units:
          // the header's units stay as they were.
          std::vector<const uint8_t*> in;
          for (int64_t r = 0; r < n; ++r) in.push_back(whole[r].const_data_ptr<uint8_t>());
          at::Tensor units = at::full({bytes / width}, -1.0f);
          for (size_t c = 0; c + 1 < at_cuts.size(); ++c) {
            std::vector<const uint8_t*> at_piece;
            for (const auto* f : in) at_piece.push_back(f + at_cuts[c]);
            sum_pieces(at_piece.data(), n, k.data(), w, count, at_cuts[c], at_cuts[c + 1] - at_cuts[c],
                       units.mutable_data_ptr<float>() + at_cuts[c] / width);
          }
          expect_same_bits(units.narrow(0, payload_offset(w) / width, count), sum(whole.unbind(0), count, w,
                           at::empty({count})), "sum_pieces " + what);
          EXPECT_TRUE(at::equal(units.narrow(0, 0, payload_offset(w) / width),
                                at::full({payload_offset(w) / width}, -1.0f))) << "the header's units were written";
          // Restored piece by piece, into fp32 and fp64, the last frame's values cut short: restore()'s bits.
          for (at::ScalarType out : {at::kFloat, at::kDouble}) {
            const int64_t total = n * count - 2;
            at::Tensor want = at::empty({total}, out), got = at::full({total}, -1.0, out);
            restore(whole, count, w, 3.0, want);
            for (int64_t r = 0; r * count < total; ++r) {
              int32_t told = 0;
              for (size_t c = 0; c + 1 < at_cuts.size(); ++c) {
                restore_piece(whole[r].const_data_ptr<uint8_t>() + at_cuts[c], &told, r, w, count,
                              std::min(count, total - r * count), at_cuts[c], at_cuts[c + 1] - at_cuts[c], 3.0, out,
                              static_cast<char*>(got.data_ptr()) + r * count * got.element_size());
              }
            }
            expect_same_bits(got, want, "restore_piece " + what);
          }
        }
      }
    }
  }
}

// The exponent puts a row's largest magnitude one binade below the wire's largest, where a power of
// two is exact: decoding gives back the rounded values, and a well-ranged row what scaling=none gives.
TEST(Frames, ThePowerOfTwoIsExactWhereNothingOverflowsOrUnderflows) {
  const at::Tensor x = at::rand({4096}) * 100 + 1;  // [1, 101]: normal in fp16 scaled or not
  at::Tensor frames = at::empty({1, frame_bytes(4096, Wire::kFp16)}, at::kByte);
  encode({x}, 4096, 1.0, Wire::kFp16, compress::MxScale::kRceil, frames);
  at::Tensor back = at::empty({4096});
  restore(frames, 4096, Wire::kFp16, 1.0, back);
  EXPECT_TRUE(at::equal(back, x.to(at::kHalf).to(at::kFloat)));
  int32_t k;
  std::memcpy(&k, frames.const_data_ptr<uint8_t>(), 4);
  EXPECT_EQ(k, 15 - 7) << "amax in [64, 128): 2^7 -> 2^14";
}

// A peer's exponent outside [-126, 126] (corruption, another version): the kernels name the rank whose
// frame it is, and the ATen form, which cannot raise on a device, decodes that frame as NaN and leaves
// the other frames alone.
TEST(Frames, AnExponentOutOfRangeNamesItsRankOrDecodesAsNaN) {
  const int64_t count = 64;
  std::vector<at::Tensor> rows{at::randn({count}), at::randn({count}), at::randn({count})};
  for (int32_t bad : {std::numeric_limits<int32_t>::min(), -127, 127, std::numeric_limits<int32_t>::max()}) {
    at::Tensor frames = at::empty({3, frame_bytes(count, Wire::kE4m3)}, at::kByte);
    encode(rows, count, 1.0, Wire::kE4m3, compress::MxScale::kRceil, frames);
    std::memcpy(frames[1].mutable_data_ptr<uint8_t>(), &bad, sizeof bad);
    const std::string k = std::to_string(bad);
    // The rows before the bad one are not written either: the caller's tensor stays as it was.
    at::Tensor untouched = at::full({3 * count}, 7.0f);
    for (auto attempt : {std::function<void()>([&] { sum(frames.unbind(0), count, Wire::kE4m3, at::empty({count})); }),
                         std::function<void()>([&] { restore(frames, count, Wire::kE4m3, 1.0, untouched); })}) {
      try {
        attempt();
        ADD_FAILURE() << "exponent " << k << " was decoded";
      } catch (const c10::DistBackendError& e) {
        const std::string what = e.what_without_backtrace();
        EXPECT_NE(what.find("from rank 1 carries the exponent " + k), std::string::npos) << what;
      }
    }
    EXPECT_TRUE(untouched.eq(7.0f).all().item<bool>()) << "exponent " << k << ": restore wrote rows before failing";
    const at::Tensor summed = sum(frames.unbind(0), count, Wire::kE4m3, at::empty({count}), Impl::kAten);
    EXPECT_TRUE(summed.isnan().all().item<bool>()) << "exponent " << k;
    at::Tensor restored = at::empty({3 * count});
    restore(frames, count, Wire::kE4m3, 1.0, restored, Impl::kAten);
    EXPECT_TRUE(restored.narrow(0, count, count).isnan().all().item<bool>()) << "exponent " << k;
    EXPECT_FALSE(restored.narrow(0, 0, count).isnan().any().item<bool>()) << "exponent " << k;
    EXPECT_FALSE(restored.narrow(0, 2 * count, count).isnan().any().item<bool>()) << "exponent " << k;
  }
}

}  // namespace
}  // namespace cnccl::frames

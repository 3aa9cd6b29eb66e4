// Power-of-two frames and MX blocks (backend/frames.h): the CPU kernels against an emulation in ATen
// operations (frames_aten.h), on values chosen to reach every branch of the definition (zeros, NaN and
// inf, values past fp32's and the wire's ranges, short and empty rows, fp32 and fp64, scales that are
// not powers of two). The CUDA kernels are held to the CPU kernels in test_codec_cuda.cpp.
#include <gtest/gtest.h>


#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <tuple>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "backend/composed/device.h"
#include "backend/frames.h"
#include "tests/cpp/frames_aten.h"

namespace cnccl::frames {
namespace {

using compress::Wire;

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
  if (compress::is_blocks(w)) {
    // Every byte: NVFP4's header, the blocks' scales, their elements and the padding.
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
            aten::encode(rows, count, scale, w, rule, aten);
            expect_same_frames(kernels, aten, count, w, "encode " + what);

            const auto frames = kernels.unbind(0);
            expect_same_bits(sum(frames, count, w, at::empty({count})),
                             aten::sum(frames, count, w, at::empty({count})), "sum " + what);

            for (at::ScalarType out : {at::kFloat, at::kDouble}) {
              at::Tensor a = at::empty({n * count - 2}, out), b = at::empty({n * count - 2}, out);
              restore(kernels, count, w, 3.0, a);
              aten::restore(kernels, count, w, 3.0, b);
              expect_same_bits(a, b, "restore " + what);
              at::Tensor strided = at::empty({2, n * count}, out).select(1, 0);  // a column: not contiguous
              at::Tensor c = at::empty({2}, out);
              restore(kernels, count, w, 1.0, strided);
              aten::restore(kernels, count, w, 1.0, c);
              expect_same_bits(strided, c, "strided restore " + what);
            }
          }
        }
      }
    }
  }
}

// The owner's sum framed again (sum_encode) gives the bytes of encode() of sum()'s fp32 sums, into a frame
// of its own or over one of the frames it sums, whose values it reads before it writes them; rows long
// enough for several of its pieces, with the largest sum in the last, and the edge rows of rows_of.
TEST(Frames, SumEncodeGivesTheBitsOfTheSumsFramedInPlaceToo) {
  for (Wire w : {Wire::kFp16, Wire::kBf16, Wire::kE4m3, Wire::kE5m2, Wire::kMxfp8, Wire::kMxfp8E5m2, Wire::kMxfp4}) {
    for (int64_t count : {1, 33, 5000}) {
      auto rows = rows_of(at::kFloat, count);
      rows.push_back(at::randn({count}));
      rows.back()[count - 1] = 300.0;
      std::vector<std::vector<at::Tensor>> sets{rows};  // all of them, then every adjacent pair
      for (size_t r = 0; r + 1 < rows.size(); ++r) sets.push_back({rows[r], rows[r + 1]});
      for (size_t set = 0; set < sets.size(); ++set) {
        const std::vector<at::Tensor>& some = sets[set];
        const int64_t n = int64_t(some.size());
        at::Tensor frames = at::empty({n, frame_bytes(count, w)}, at::kByte);
        encode(some, count, 1.0, w, compress::MxScale::kRceil, frames);
        at::Tensor want = at::empty({1, frames.size(1)}, at::kByte);
        encode({sum(frames.unbind(0), count, w, at::empty({count}))}, count, 1.0, w, compress::MxScale::kRceil, want);
        const std::string what = std::string(compress::wire_name(w)) + " count " + std::to_string(count) + " set " +
                                 std::to_string(set);
        at::Tensor apart = at::full_like(want, 0xAB);
        sum_encode(frames, count, w, compress::MxScale::kRceil, apart[0]);
        ASSERT_TRUE(at::equal(apart, want)) << what << ": " << apart.ne(want).sum().item<int64_t>() << " bytes differ";
        sum_encode(frames, count, w, compress::MxScale::kRceil, frames[n - 1]);
        ASSERT_TRUE(at::equal(frames[n - 1], want[0])) << what << " in place";
      }
    }
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

#if defined(__x86_64__)
// A thread that flushes subnormals (torch.set_flush_denormal(True) sets MXCSR's FTZ and DAZ; a group's
// threads take their creator's) gets the frames a thread that keeps them gets: the exponent of a row whose
// amax times its scale is subnormal (an fp32 subnormal, an fp64 value that is one in fp32, a small value
// times a small scale), and a restore whose post-scale times 2^-k is (0.01 x 2^-126). The oracle is
// computed with flushing off.
TEST(Frames, AThreadThatFlushesSubnormalsGetsTheSameExponentsAndValues) {
  const int64_t count = 96;
  const std::vector<std::pair<at::Tensor, double>> cases{
      {at::full({count}, 3e-39f), 1.0},
      {at::full({count}, 1e-40, at::kDouble), 1.0},
      {at::linspace(1e-10, 2e-10, count), 1e-30},
  };
  auto run = [&](const at::Tensor& row, double scale, Wire w) {
    at::Tensor frame = at::empty({1, frame_bytes(count, w)}, at::kByte);
    encode({row}, count, scale, w, compress::MxScale::kRceil, frame);
    at::Tensor back = at::empty({count}, row.scalar_type());
    int32_t k = 0;
    restore_piece(frame.const_data_ptr<uint8_t>(), &k, 0, w, count, count, 0, frame.size(1), 0.01,
                  row.scalar_type(), back.data_ptr());
    return std::make_tuple(row_exponent(row.contiguous(), scale, w), frame, back);
  };
  for (Wire w : {Wire::kFp16, Wire::kBf16, Wire::kE4m3, Wire::kE5m2}) {
    for (const auto& [row, scale] : cases) {
      const auto [k, frame, back] = run(row, scale, w);
      const unsigned saved = _mm_getcsr();
      _mm_setcsr(saved | 0x8040u);
      const auto [k_flushing, frame_flushing, back_flushing] = run(row, scale, w);
      _mm_setcsr(saved);
      const std::string what = "wire " + std::to_string(int(w)) + ", scale " + std::to_string(scale);
      EXPECT_EQ(k_flushing, k) << what;
      EXPECT_GT(k, 100) << what << ": the row's amax is far below the wire's";
      EXPECT_TRUE(at::equal(frame_flushing, frame)) << what;
      expect_same_bits(back_flushing, back, what);
    }
  }
}
#endif

// A peer's exponent outside [-126, 126] (corruption, another version): the kernels name the rank whose
// frame it is (the CUDA kernels, which cannot raise, decode it as NaN: test_codec_cuda.cpp).
TEST(Frames, AnExponentOutOfRangeNamesItsRank) {
  const int64_t count = 64;
  std::vector<at::Tensor> rows{at::randn({count}), at::randn({count}), at::randn({count})};
  for (int32_t bad : {std::numeric_limits<int32_t>::min(), -127, 127, std::numeric_limits<int32_t>::max()}) {
    at::Tensor frames = at::empty({3, frame_bytes(count, Wire::kE4m3)}, at::kByte);
    encode(rows, count, 1.0, Wire::kE4m3, compress::MxScale::kRceil, frames);
    std::memcpy(frames[1].mutable_data_ptr<uint8_t>(), &bad, sizeof bad);
    const std::string k = std::to_string(bad);
    // The rows before the bad one are not written either: the caller's tensor stays as it was.
    at::Tensor untouched = at::full({3 * count}, 7.0f);
    at::Tensor own = at::empty({frames.size(1)}, at::kByte);
    for (auto attempt : {std::function<void()>([&] { sum(frames.unbind(0), count, Wire::kE4m3, at::empty({count})); }),
                         std::function<void()>([&] { sum_encode(frames, count, Wire::kE4m3, compress::MxScale::kRceil, own); }),
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
  }
}

// The CUDA device's frame kernels (compress/cuda/frames.cu), as the composed path calls them, against the
// CPU's: the frames of every wire from fp32 and fp64 rows (rows_of's edges among them), the block wires'
// rounded to nearest and stochastically, the owner's sum framed again in place over a row, those
// sums into fp32 and fp64 outputs, and the restore; a header outside [-126, 126] (NVFP4's: a part scale
// nv_part_scale cannot give) decodes its frame as NaN. Skips without a GPU.
TEST(Frames, TheCudaKernelsGiveTheBitsOfTheCpuKernels) {
#if !CNCCL_WITH_CUDA
  GTEST_SKIP() << "built without the CUDA path";
#else
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA GPU on this machine: the CUDA frame kernels are built, not run";
  const auto gpu = composed::make_device_for(at::Device(at::kCUDA, 0));
  const auto cpu = composed::make_cpu_device();
  const auto on_gpu = [](const at::Tensor& t) { return t.to(at::Device(at::kCUDA, 0)); };
  // The sums' first index is no multiple of 16: their bits straddle Philox blocks, as an owner's part's do.
  const compress::Dither contributions = compress::contribution_dither(0x5EED, 3, 1);
  const compress::Dither sums = compress::sum_dither(0x5EED, 3);
  const uint64_t first = 1000003;
  for (Wire w : {Wire::kFp16, Wire::kBf16, Wire::kE4m3, Wire::kE5m2, Wire::kMxfp8, Wire::kMxfp8E5m2, Wire::kMxfp4,
                 Wire::kNvfp4}) {
    for (at::ScalarType dtype : {at::kFloat, at::kDouble}) {
      for (int64_t count : {1, 33, 100003}) {
        for (compress::MxScale rule : {compress::MxScale::kRceil, compress::MxScale::kFloor}) {
          for (bool stochastic : {false, true}) {
            if (stochastic && !compress::is_blocks(w)) continue;
            const std::string what = std::string(compress::wire_name(w)) + " " + c10::toString(dtype) + " count " +
                                     std::to_string(count) + " " + compress::mx_scale_name(rule) +
                                     (stochastic ? " sr" : "");
            Plan plan;
            plan.wire = w;
            plan.pre_scale = 1.0 / 3;
            plan.post_scale = 3.0;
            plan.mx_scale = rule;
            plan.stochastic = stochastic;
            const auto rows = rows_of(dtype, count);
            std::vector<at::Tensor> device_rows;
            for (const auto& r : rows) device_rows.push_back(on_gpu(r));
            const int64_t n = int64_t(rows.size()), bytes = frame_bytes(count, w);
            at::Tensor want = at::empty({n, bytes}, at::kByte);
            at::Tensor got = on_gpu(at::full({n, bytes}, 0xAB, at::kByte));
            cpu->encode_frames(rows, count, plan, want, contributions);
            gpu->encode_frames(device_rows, count, plan, got, contributions);
            expect_same_frames(got.cpu(), want, count, w, "encode " + what);
            for (at::ScalarType out : {at::kFloat, at::kDouble}) {
              at::Tensor a = at::empty({count}, out), b = on_gpu(a);
              cpu->sum_frames_wide(want, count, plan, a);
              gpu->sum_frames_wide(got, count, plan, b);
              expect_same_bits(b.cpu(), a, "sums " + what);
              a = at::empty({n * count - 2}, out);
              b = on_gpu(a);
              cpu->restore_frames(want, count, plan, a);
              gpu->restore_frames(got, count, plan, b);
              expect_same_bits(b.cpu(), a, "restore " + what);
            }
            at::Tensor owners = at::empty({1, bytes}, at::kByte);
            cpu->sum_frames(want, count, plan, owners[0], sums, first);
            // Over row 1, whose values are not zeros: a kernel that read a header or block after writing it
            // would change them.
            gpu->sum_frames(got, count, plan, got[1], sums, first);
            expect_same_frames(got[1].unsqueeze(0).cpu(), owners, count, w, "the owner's frame " + what);
            if (compress::is_mx(w)) continue;
            // An exponent of 127; for NVFP4 a part scale of 2^-121.
            const int32_t bad = w == Wire::kNvfp4 ? 0x03000000 : 127;
            got[1].narrow(0, 0, 4).copy_(at::from_blob(const_cast<int32_t*>(&bad), {4}, at::kByte));
            at::Tensor restored = on_gpu(at::empty({n * count}));
            gpu->restore_frames(got, count, plan, restored);
            EXPECT_TRUE(restored.narrow(0, count, count).isnan().all().item<bool>()) << what;
            EXPECT_FALSE(restored.narrow(0, 0, count).isnan().any().item<bool>()) << what;
          }
        }
      }
    }
  }
#endif
}

}  // namespace
}  // namespace cnccl::frames

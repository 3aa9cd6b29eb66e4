// One level's wire (docs/design.md, "One level codec"): how a part of `count` values travels through one
// level of a sum, as fp32, as one power-of-two frame (backend/frames.h), as MX blocks (compress/codec.h)
// or as an NVFP4 frame (blocks under the part's scale, which its header carries),
// and the four things every schedule does with it: encode a contribution, add the ranks' contributions
// in fp32 in rank order, encode an owner's sum again, restore a result. The flat sums in frames
// (framed_reductions.cpp) have one level; a wire per level (level_reductions.cpp) has two, the second's
// contributions the first one's sums. A schedule cuts a part into runs of units and moves them: a unit
// is a float, a frame's wire element (the header its first ones), an MX block of 32 values or an NVFP4
// block of 16 (the header the first; a part's last block may be short, and a run of blocks travels as
// the run of the values it covers). Cutting changes no bit: every unit is encoded, added and restored
// on its own, but for a frame's exponent or part scale, which the run that starts the frame carries
// (frames.h: it is summed and restored first).
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "compress/codec.h"
#include "compress/stochastic.h"

namespace cnccl::host {

class LevelCodec {
 public:
  // kPartBlocks: NVFP4, blocks whose scales are relative to the part's, carried as a frame's exponent is
  // (its fp32 bits where an exponent goes).
  enum class Form : uint8_t { kFp32, kFrames, kBlocks, kPartBlocks };

  // A contribution: a part's values in pieces of `segment` values each, one after another, read where
  // they lie (fp32 or fp64, contiguous; the last may be short, and values past the pieces are +0), each
  // multiplied by `scale`; a frame's exponent `k` (exponent(): an NVFP4 part scale's bits).
  // A block row's elements (MX, NVFP4) are rounded stochastically where `dither` is given, value i taking
  // the bits of index first + i (compress/stochastic.h).
  struct Row {
    const std::vector<at::Tensor>* pieces;
    int64_t segment;
    double scale;
    int32_t k = 0;
    const compress::Dither* dither = nullptr;
    uint64_t first = 0;
  };

  // `wire` null: fp32.
  LevelCodec(const std::optional<compress::Wire>& wire, int64_t count, compress::MxScale mx_scale);

  Form form() const { return form_; }
  // Whether a part's encoding depends on all of its values: a power-of-two frame's exponent, an NVFP4
  // part's scale (exponent()).
  bool part_scaled() const { return form_ == Form::kFrames || form_ == Form::kPartBlocks; }
  compress::Wire wire() const { return wire_; }
  int64_t count() const { return count_; }
  size_t units() const { return units_; }        // a part's
  size_t elem() const { return elem_; }          // bytes a unit on the wire
  size_t out_elem() const { return out_elem_; }  // bytes a unit's fp32 sums
  // Units before the first value's (a frame's header).
  size_t values_at() const { return values_at_; }
  // Bytes of a part's fp32 sums, a cache line's multiple.
  size_t sums_bytes() const { return (units_ * out_elem_ + 63) / 64 * 64; }
  // Where value 0's sum lies in them: past the header's units (a frame's header units hold no sums).
  size_t first_sum_at() const { return values_at_ * out_elem_; }
  // The values units [u, u + k) of a part hold: (first, how many).
  std::pair<size_t, size_t> values_of(size_t u, size_t k) const;
  // The units that hold values [v0, v1) of a part: [first, end).
  std::pair<size_t, size_t> units_of(size_t v0, size_t v1) const;

  // A frame's exponent of `row`, an NVFP4 part scale's bits (0 for forms that are not part_scaled()).
  int32_t exponent(const Row& row) const;
  // The exponent of an owner's contiguous fp32 `sums`, whose largest |value| sum() returned.
  int32_t sum_exponent(float amax, const at::Tensor& sums) const;
  // Units [u, u + k) of `row`'s encoding, into dst.
  void encode(const Row& row, size_t u, size_t k, uint8_t* dst) const;
  // The fp32 sums of units [u, u + k) of `ranks` contributions (in[r] from rank r), added in rank order,
  // into dst (out_elem() bytes a unit; a frame's header units get none). Frames: the run from unit 0
  // stores each rank's exponent in heard[r] for the later runs. Returns the largest |sum| (frames: NaN if
  // any is; NVFP4: the largest finite; else 0).
  float sum(const uint8_t* const* in, int ranks, int32_t* heard, size_t u, size_t k, float* dst) const;
  // MX blocks: the owner's sums of units [u, u + k) encoded again, as encode() of them would, into dst;
  // rounded stochastically where `dither` is given, the part's value i taking the bits of index first + i.
  void sum_encode(const uint8_t* const* in, int ranks, size_t u, size_t k, uint8_t* dst,
                  const compress::Dither* dither = nullptr, uint64_t first = 0) const;
  // Restores units [u, u + k) of the result `run` (rank `sender`'s, for messages) into the part at `dst`
  // (of `dtype`, fp32 or fp64): its values below `given` times `post_scale`. fp32 results are sums.
  // Frames: the run from unit 0 checks the header and stores its exponent in *told for the later runs.
  void restore(const uint8_t* run, int32_t* told, int64_t sender, size_t u, size_t k, int64_t given,
               double post_scale, at::ScalarType dtype, char* dst) const;

 private:
  Form form_;
  compress::Wire wire_ = compress::Wire::kFp16;
  compress::MxScale mx_scale_;
  int64_t count_;
  size_t units_, elem_, out_elem_, values_at_ = 0;
};

}  // namespace cnccl::host

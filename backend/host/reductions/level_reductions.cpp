// The host path's sums with a wire per level (plan.per_level; docs/design.md, "A wire per level"), on a
// group whose H hosts each hold L ranks that share memory. A sum's elements are cut into L local parts of
// `count` elements (local part l is local rank l's) and each local part into H sub-parts of count / H
// (sub-part j is host j's). Each level is a LevelCodec (level_codec.h):
//  1. inside each host, through shared memory (reduce_shm): every rank's contribution to local part l goes
//     to local rank l in plan.inside's frame (one power-of-two or NVFP4 frame a part, or MX blocks) or as
//     fp32, and local rank l decodes and adds them in fp32 in local rank order;
//  2. across hosts, among the local ranks l of every host (cross_, reduce_chunked): each owner's fp32 sums
//     go to the hosts that own their sub-parts, one plan.across frame (power-of-two or NVFP4; or fp32, or
//     MX blocks) a sub-part, and each decodes and adds them in fp32 in host order. allreduce then encodes
//     its sub-part's sum again, and the results go back to every host and are restored into local part l;
//     a reduce_scatter's sub-part is one rank's output;
//  3. allreduce: each restored piece of the local parts copied to every rank of the host, in the dtype.
// The levels run together, a chunk at a time: producing a chunk for level 2 first sums it at level 1,
// waits at level 1 progress level 2's messages (ShmComm::Idle), and a chunk's results go on to level 3
// as they are restored. Every local rank of a host makes the same level-1 and level-3 calls in the same
// order (reduce_chunked's, a function of the sizes alone), so their shared-memory steps match.
// An allreduce's local parts are ceil(n / L) rounded up to a multiple of 32 H, so every MX block (and NVFP4
// block of 16), at either level, is a block of the tensor; a reduce_scatter's local part l is the outputs
// of the ranks of local rank l, in host order (sub-part j: the output of host j's), so count = H x the
// output's numel.
#include <algorithm>
#include <climits>
#include <cstring>

#include "backend/frames.h"
#include "backend/host/host_path.h"
#include "backend/host/reductions/level_codec.h"
#include "backend/host/shm/shm_algorithms.h"
#include "backend/host/shm/shm_comm.h"
#include "backend/host/staging.h"
#include "backend/host/transport/comm.h"
#include "backend/host/transport/tags.h"

namespace cnccl::host {

HostPath::Step HostPath::per_level_step(std::function<std::vector<std::vector<at::Tensor>>()> make_rows,
                                        int64_t count, int64_t segment, const Plan& plan, size_t staging_bytes,
                                        LevelResults results) {
  const int ranks = shm_->size(), hosts = cross_->size();
  const int64_t sub = count / hosts;
  const bool gather = bool(results.at);
  const LevelCodec inside(plan.inside, count, plan.mx_scale);
  const LevelCodec across(plan.across, sub, plan.mx_scale);
  // rounding=sr (docs/numerics.md, "A wire per level"): value v of local part l takes the bits of index
  // l x count + v at every level, level 1's contributions this rank's, level 2's this rank's second-level
  // ones, the owners' sums the sums'. Only block levels round; options.cpp refuses frames with sr.
  const auto dithered = dithers(plan, size_t(count));
  const compress::Dither level1_bits = dithered.first, sum_bits = dithered.second;
  const compress::Dither level2_bits = compress::second_level_dither(plan.sr_seed, dithered.first.seq, uint32_t(rank_));
  const uint64_t local_first = uint64_t(shm_->rank()) * uint64_t(count);
  const size_t sub_units = across.units();
  // The workspace: the caller's staging area, this owner's level-1 sums, its sub-part's level-2 sums.
  const size_t sums_at = (staging_bytes + 63) / 64 * 64, total_at = sums_at + inside.sums_bytes();
  auto rows = std::make_shared<std::vector<std::vector<at::Tensor>>>();  // each local part's pieces
  auto mine = std::make_shared<std::vector<int32_t>>(ranks);   // this rank's exponent of each local part
  auto heard = std::make_shared<std::vector<int32_t>>(ranks);  // every local rank's exponent of this part
  Step step;
  step.workspace_bytes = total_at + across.sums_bytes();
  step.wrote_results = results.wrote;
  // The level's own fp32 arithmetic (the pre-scale, the sums) keeps subnormals whatever the thread's
  // floating-point settings, as the kernels do: the bits are defined with them.
  step.pre = [=](const Buffers&) {
    const compress::GradualUnderflow exact;
    *rows = make_rows();
    for (int q = 0; q < ranks; ++q) (*mine)[q] = inside.exponent({&(*rows)[q], segment, plan.pre_scale});
  };
  step.algorithm = [=, this](const Buffers& b) {
    const compress::GradualUnderflow exact;
    comm_->end();  // the group's signature agreement, before any data moves
    if (count == 0) return;
    // This closure's copies of the bits' keys, which outlive every use below.
    const compress::Dither *level1_dither = plan.stochastic ? &level1_bits : nullptr,
                           *level2_dither = plan.stochastic ? &level2_bits : nullptr,
                           *sum_dither = plan.stochastic ? &sum_bits : nullptr;
    // 1. Inside the host: the fp32 sums of this local rank's part.
    const ChunkProduce produce = timed_producer([=](size_t first, size_t len, char* dst) {
      const size_t q = first / inside.units();
      inside.encode({&(*rows)[q], segment, plan.pre_scale, (*mine)[q], level1_dither, q * uint64_t(count)},
                    first - q * inside.units(), len, reinterpret_cast<uint8_t*>(dst));
    });
    const RankSum sum = timed_reducer([=](const char* const* in, char* dst, size_t first, size_t len) {
      inside.sum(reinterpret_cast<const uint8_t* const*>(in), ranks, heard->data(),
                 first % inside.units(), len, reinterpret_cast<float*>(dst));
    });
    char* sums_area = b.workspace + sums_at;
    float* sums = reinterpret_cast<float*>(sums_area + inside.first_sum_at());
    // Level 1 runs in pieces, each when level 2 first needs it: units [u0, u1) of every local part, less
    // those summed already (an MX block that two pieces share).
    std::vector<uint8_t> summed(inside.units(), 0);
    auto level1 = [&](size_t u0, size_t u1) {
      u1 = std::min(u1, inside.units());
      while (u0 < u1 && summed[u0]) ++u0;
      while (u1 > u0 && summed[u1 - 1]) --u1;
      if (u0 == u1) return;
      std::fill(summed.begin() + int64_t(u0), summed.begin() + int64_t(u1), uint8_t(1));
      Parts parts;
      for (int q = 0; q < ranks; ++q) {
        parts.offset.push_back(size_t(q) * inside.units() + u0);
        parts.length.push_back(u1 - u0);
      }
      reduce_shm(*shm_, {parts, inside.elem(), produce, sum, sums_area + u0 * inside.out_elem(),
                         ChunkedReduction::kOwn, 0, inside.out_elem()});
    };
    // The headers first: every later piece's sum reads their exponents.
    if (inside.values_at()) level1(0, inside.values_at());

    // 2. Across hosts. Sub-part j's sums are host j's contribution, one row of one piece.
    std::vector<std::vector<at::Tensor>> sub_rows;
    for (int j = 0; j < hosts; ++j) {
      sub_rows.push_back({view(reinterpret_cast<char*>(sums + size_t(j) * size_t(sub)), sub, at::kFloat)});
    }
    const size_t h = size_t(hosts);
    std::vector<int32_t> exponent(h, INT32_MIN), heard_across(h), told(h);
    // A chunk's level 1, then its encoding; a power-of-two frame's exponent and an NVFP4 part's scale need
    // the whole sub-part, so the first piece of sub-part j sums all of it (reduce_chunked's order: this
    // host's sub-part last, so the link starts after the first).
    const ChunkProduce encode = timed_producer([&](size_t first, size_t k, char* dst) {
      const compress::CensusSamplesPaused not_a_contribution;  // the census counts level 1's casts alone
      const size_t j = first / sub_units;
      across.encode({&sub_rows[j], sub, 1.0, exponent[j], level2_dither, local_first + j * uint64_t(sub)},
                    first - j * sub_units, k, reinterpret_cast<uint8_t*>(dst));
    });
    const ChunkProduce produce_across = [&](size_t first, size_t k, char* dst) {
      const size_t j = first / sub_units, base = j * size_t(sub);
      if (across.part_scaled()) {
        if (exponent[j] == INT32_MIN) {
          const auto [u0, u1] = inside.units_of(base, base + size_t(sub));
          level1(u0, u1);
          timed_reduce([&] {
            const compress::CensusSamplesPaused not_a_contribution;
            exponent[j] = across.exponent({&sub_rows[j], sub, 1.0});
          });
        }
      } else {
        const auto [v, len] = across.values_of(first - j * sub_units, k);
        const auto [u0, u1] = inside.units_of(base + v, base + v + len);
        level1(u0, u1);
      }
      encode(first, k, dst);
    };
    // Owners add the hosts' chunks in host order; an allreduce's MX owner encodes its sums again at once.
    // Of this owner's |sums| (frames: a NaN's bits are larger; NVFP4: the finite ones'), as a non-negative
    // float's bits.
    uint32_t largest = 0;
    const RankSum add = timed_reducer([&](const char* const* in, char* dst, size_t first, size_t k) {
      const compress::CensusSamplesPaused not_a_contribution;
      const auto* const* runs = reinterpret_cast<const uint8_t* const*>(in);
      const size_t u = first % sub_units;
      if (gather && across.form() == LevelCodec::Form::kBlocks) {
        return across.sum_encode(runs, hosts, u, k, reinterpret_cast<uint8_t*>(dst), sum_dither,
                                 local_first + first / sub_units * uint64_t(sub));
      }
      const float a = across.sum(runs, hosts, heard_across.data(), u, k, reinterpret_cast<float*>(dst));
      uint32_t bits;
      std::memcpy(&bits, &a, sizeof bits);
      largest = std::max(largest, bits & 0x7FFFFFFFu);
    });
    // Level 2 runs while waits at level 1 progress it.
    const ShmComm::Idle idle{[this] { cross_->poll(); },
                             [this](std::chrono::microseconds limit) { cross_->wait_for_activity(limit); }};
    const ShmComm::IdleScope progress_across(*shm_, idle);
    char* y = gather ? results.at(b.workspace) : nullptr;
    const size_t wide = at::elementSize(results.dtype);
    // An allreduce's results of units [first, first + k) of sub-part j, restored into this local part and
    // then shared with the host (level 3), in the order reduce_chunked or allgather_chunked hands them over.
    const ChunkConsume restore_run = timed_consumer([&](size_t first, size_t k, const char* run) {
      const size_t j = first / sub_units, u = first - j * sub_units;
      const int64_t base = int64_t(j) * sub, given = results.have - base;
      across.restore(reinterpret_cast<const uint8_t*>(run), &told[j], int64_t(j), u, k, given, plan.post_scale,
                     results.dtype, y + base * int64_t(wide));
      // After a frame's header check (a bad one writes nothing); a sub-part past the tensor's end writes nothing.
      if (results.wrote && given > 0) *results.wrote = true;
    });
    // Level 3 is a transfer, timed as one.
    const ChunkConsume restore = [&](size_t first, size_t k, const char* run) {
      restore_run(first, k, run);
      const size_t j = first / sub_units;
      const auto [v, len] = across.values_of(first - j * sub_units, k);
      results.share(j * size_t(sub) + v, len, b.workspace);
    };
    char* total = b.workspace + total_at;
    const Parts parts = Parts::equal(sub_units, hosts);
    // A power-of-two frame's or an NVFP4 part's owner frames its sum once every piece is in (its exponent or
    // part scale is the whole sum's); the frames are then allgathered.
    const bool frames_again = gather && across.part_scaled();
    ChunkedReduction chunks{parts, across.elem(), produce_across, add, total,
                            gather && !frames_again ? ChunkedReduction::kAll : ChunkedReduction::kOwn, 0,
                            gather && !frames_again ? 0 : across.out_elem()};
    if (gather && !frames_again) chunks.consume = restore;
    chunks.chunk_bytes = kLevelChunkBytes;
    reduce_chunked(*cross_, chunks);
    if (frames_again) {
      const std::vector<at::Tensor> sum_row{
          view(total + across.first_sum_at(), sub, at::kFloat)};
      int32_t k = 0;
      timed_reduce([&] {
        float amax;
        std::memcpy(&amax, &largest, sizeof amax);
        k = across.sum_exponent(amax, sum_row[0]);
      });
      const ChunkProduce frame_sum = timed_producer([&](size_t first, size_t len, char* dst) {
        const compress::CensusSamplesPaused not_a_contribution;
        across.encode({&sum_row, sub, 1.0, k, sum_dither, local_first + first / sub_units * uint64_t(sub)},
                      first % sub_units, len, reinterpret_cast<uint8_t*>(dst));
      });
      allgather_chunked(*cross_, parts, across.elem(), frame_sum, restore, tags::kSecondPhase, kLevelChunkBytes);
    }
    cross_->end();
    if (!gather) results.finish(reinterpret_cast<const float*>(total + across.first_sum_at()), b.workspace);
  };
  return step;
}

HostPath::Step HostPath::per_level_allreduce_step(const at::Tensor& tensor, const Plan& plan) {
  const int ranks = shm_->size(), local = shm_->rank(), hosts = cross_->size();
  const int64_t n = tensor.numel(), align = int64_t(compress::kMxBlock) * hosts;
  const int64_t count = ((n + ranks - 1) / ranks + align - 1) / align * align;
  const size_t wide = tensor.element_size();
  // Results land in the tensor, or in a staging copy that replaces it once every part is in (a strided
  // tensor, or untouched_on_failure); the staging area leads the workspace.
  const bool direct = tensor.is_contiguous() && !config_.untouched_on_failure;
  auto src = std::make_shared<at::Tensor>();
  Parts parts;
  for (int64_t q = 0; q < ranks; ++q) {
    parts.offset.push_back(size_t(std::min(n, q * count)));
    parts.length.push_back(size_t(std::min(n, (q + 1) * count) - std::min(n, q * count)));
  }
  auto y_of = [=](char* workspace) { return direct ? static_cast<char*>(tensor.data_ptr()) : workspace; };
  LevelResults results;
  results.at = [=](char* workspace) { return y_of(workspace) + parts.offset[size_t(local)] * wide; };
  results.have = int64_t(parts.length[size_t(local)]);
  results.dtype = tensor.scalar_type();
  results.wrote = direct ? std::make_shared<bool>(false) : nullptr;
  // 3. Elements [first, first + len) of every local part to every rank of the host.
  results.share = [=, this, wrote = results.wrote](size_t first, size_t len, char* workspace) {
    Parts range;
    size_t any = 0;
    for (int q = 0; q < ranks; ++q) {
      const size_t length = parts.length[size_t(q)], lo = std::min(first, length);
      range.offset.push_back(parts.offset[size_t(q)] + lo);
      range.length.push_back(std::min(first + len, length) - lo);
      any += range.length.back();
    }
    if (!any) return;
    if (wrote) *wrote = true;
    allgather_shm(*shm_, y_of(workspace), range, wide);
  };
  Step step = per_level_step(
      [=] {
        *src = tensor.reshape({-1}).contiguous();
        std::vector<std::vector<at::Tensor>> rows;
        for (const auto& part : frames::parts_of(*src, ranks, count)) rows.push_back({part});
        return rows;
      },
      count, count, plan, direct ? 0 : size_t(n) * wide, std::move(results));
  step.post = [=](const Buffers& b) {
    src->reset();
    if (!direct && n) unpack(b.workspace, tensor);
  };
  return step;
}

HostPath::Step HostPath::per_level_reduce_scatter_step(const std::vector<at::Tensor>& inputs, const at::Tensor& output,
                                                       const Plan& plan) {
  const int ranks = shm_->size(), hosts = cross_->size();
  const int64_t each = output.numel();
  // Local part l: the inputs of its ranks, in host order.
  std::vector<std::vector<at::Tensor>> by_local(static_cast<size_t>(ranks));
  for (int j = 0; j < hosts; ++j) {
    for (int l = 0; l < ranks; ++l) by_local[size_t(l)].push_back(inputs[size_t(shm_->hosts()[size_t(j)][size_t(l)])]);
  }
  LevelResults results;
  results.finish = [=, this](const float* total, char*) {
    timed_restore([&] { restore_sums_into(total, output, plan); });
  };
  // Each local part's inputs are read where they are (a strided one copied), one piece an output.
  return per_level_step(
      [=] {
        std::vector<std::vector<at::Tensor>> rows;
        for (const auto& part : by_local) {
          rows.emplace_back();
          for (const auto& t : part) rows.back().push_back(t.contiguous().view({-1}));
        }
        return rows;
      },
      each * hosts, each, plan, 0, std::move(results));
}

}  // namespace cnccl::host

// The host path's sums with a wire per level (plan.per_level; docs/design.md, "A wire per level"), on a
// group whose H hosts each hold L ranks that share memory. A sum's elements are cut into L local parts of
// `count` elements (local part l is local rank l's) and each local part into H sub-parts of count / H
// (sub-part j is host j's):
//  1. inside each host, through shared memory (reduce_shm, pipelined): every rank's contribution to local
//     part l goes to local rank l in plan.inside's frame (one power-of-two frame a part, or MX blocks) or
//     as fp32, and local rank l decodes and adds them in fp32 in local rank order;
//  2. across hosts, among the local ranks l of every host (cross_): each owner's fp32 sums go to the
//     hosts that own their sub-parts, one plan.across frame (or fp32) a sub-part, and each decodes and
//     adds them in fp32 in host order. allreduce then frames its sub-part's sum again, and the frames are
//     allgathered and restored into local part l; a reduce_scatter's sub-part is one rank's output;
//  3. allreduce: the local parts allgathered through shared memory, in the tensor's dtype.
// An allreduce's local parts are ceil(n / L) rounded up to a multiple of 32 H, so every MX block, at either
// level, is a block of 32 of the tensor; a reduce_scatter's local part l is the outputs of the ranks of
// local rank l, in host order (sub-part j: the output of host j's), so count = H x the output's numel.
#include <algorithm>
#include <cstring>

#include "backend/frames.h"
#include "backend/host/host_path.h"
#include "backend/host/shm/shm_algorithms.h"
#include "backend/host/shm/shm_comm.h"
#include "backend/host/staging.h"
#include "backend/host/transport/comm.h"
#include "backend/host/transport/tags.h"
#include "backend/wide_data.h"

namespace cnccl::host {
namespace {

// How a level's contributions travel: fp32 as they are, power-of-two frames, or MX blocks. Every
// compressed level is framed: a frame costs 4 bytes a part, and no 16-bit level then overflows.
enum class LevelForm : uint8_t { kFp32, kFrames, kBlocks };
LevelForm form_of(const std::optional<compress::Wire>& wire) {
  return !wire ? LevelForm::kFp32 : compress::is_mx(*wire) ? LevelForm::kBlocks : LevelForm::kFrames;
}

// Level 1's layout of `rows` (one a local part, each at most `count` elements) through shared memory:
// what ChunkedReduction needs, and where the owner's fp32 sums of its part's values start.
struct InsideLevel {
  LevelForm form;
  compress::Wire wire = compress::Wire::kFp16;
  size_t units, elem, out_elem;  // units a part, bytes a unit sent, bytes a unit summed
  int64_t sums_at = 0;           // floats before the first value's sum (a frame's header)

  InsideLevel(const std::optional<compress::Wire>& w, int64_t count) : form(form_of(w)) {
    if (w) wire = *w;
    switch (form) {
      case LevelForm::kFp32:
        units = size_t(count), elem = out_elem = sizeof(float);
        break;
      case LevelForm::kFrames:
        elem = compress::wire_bytes(wire), out_elem = sizeof(float);
        units = size_t(frames::frame_bytes(count, wire)) / elem;
        sums_at = frames::payload_offset(wire) / int64_t(elem);
        break;
      case LevelForm::kBlocks:  // the part's last block may be short (a reduce_scatter's)
        units = (size_t(count) + compress::kMxBlock - 1) / compress::kMxBlock;
        elem = compress::mx_bytes(compress::kMxBlock, wire);
        out_elem = compress::kMxBlock * sizeof(float);
        break;
    }
  }
  size_t sums_bytes() const { return (units * out_elem + 63) / 64 * 64; }
};

}  // namespace

HostPath::Step HostPath::per_level_step(std::function<std::vector<std::vector<at::Tensor>>()> make_rows,
                                        int64_t count, int64_t segment, const Plan& plan, bool gather,
                                        size_t staging_bytes,
                                        std::function<void(const float*, char*)> deliver, ChunkConsume restore_run) {
  const int ranks = shm_->size(), local = shm_->rank(), hosts = cross_->size(), host = cross_->rank();
  const int64_t sub = count / hosts;
  const InsideLevel inside(plan.inside, count);
  const LevelForm across = form_of(plan.across);
  const compress::Wire across_wire = plan.across.value_or(compress::Wire::kFp16);
  // One host's frame (or fp32 run) of a sub-part; the workspace: the caller's staging area, this owner's
  // level-1 sums, the frames it sends, the frames it gathers, its sub-part's fp32 sum.
  const size_t frame = across == LevelForm::kFp32 ? size_t(sub) * sizeof(float)
                                                  : size_t(frames::frame_bytes(sub, across_wire));
  auto line = [](size_t bytes) { return (bytes + 63) / 64 * 64; };
  const size_t sums_at = line(staging_bytes), sent_at = sums_at + inside.sums_bytes();
  const size_t gathered_at = sent_at + line(frame * size_t(hosts)), total_at = gathered_at + line(frame * size_t(hosts));
  auto rows = std::make_shared<std::vector<std::vector<at::Tensor>>>();  // each local part's pieces
  auto mine = std::make_shared<std::vector<int32_t>>(ranks);   // this rank's exponent of each local part
  auto heard = std::make_shared<std::vector<int32_t>>(ranks);  // every local rank's exponent of this part
  Step step;
  step.workspace_bytes = total_at + size_t(sub) * sizeof(float);
  // The level's own fp32 arithmetic (the pre-scale, the sums) keeps subnormals whatever the thread's
  // floating-point settings, as the kernels do: the bits are defined with them.
  step.pre = [=](const Buffers&) {
    const compress::GradualUnderflow exact;
    *rows = make_rows();
    if (inside.form != LevelForm::kFrames) return;
    for (int q = 0; q < ranks; ++q) (*mine)[q] = frames::row_exponent((*rows)[q], plan.pre_scale, inside.wire);
  };
  step.algorithm = [=, this](const Buffers& b) {
    const compress::GradualUnderflow exact;
    comm_->end();  // the group's signature agreement, before any data moves
    if (count == 0) return;
    // 1. Inside the host: the fp32 sums of this local rank's part.
    const std::vector<std::vector<at::Tensor>>& x = *rows;
    const at::ScalarType dtype = x[0][0].scalar_type();
    const size_t piece_elements = size_t(segment);
    // Elements [at, at + len) of local part q as a contribution, cut where its pieces end: f(where in the
    // run, the piece (null past the last), its first element there, how many it has, the run's elements there).
    auto runs = [&x, piece_elements](size_t q, size_t at, size_t len, const auto& f) {
      for (size_t v = at; v < at + len;) {
        const size_t j = v / piece_elements, off = v % piece_elements;
        const size_t run = std::min(at + len - v, piece_elements - off);
        const at::Tensor* piece = j < x[q].size() ? &x[q][j] : nullptr;
        const size_t have = piece ? std::min(run, size_t(std::max<int64_t>(piece->numel() - int64_t(off), 0))) : 0;
        f(v - at, piece, off, have, run);
        v += run;
      }
    };
    auto data = [](const at::Tensor* piece, size_t off) {
      return static_cast<const char*>(piece->const_data_ptr()) + off * piece->element_size();
    };
    ChunkProduce produce;
    RankSum sum;
    switch (inside.form) {
      case LevelForm::kFp32:
        produce = [=](size_t first, size_t len, char* dst) {
          const size_t q = first / size_t(count);
          auto* out = reinterpret_cast<float*>(dst);
          runs(q, first - q * size_t(count), len,
               [&](size_t o, const at::Tensor* piece, size_t off, size_t have, size_t run) {
                 if (have) {
                   with_wide_data(data(piece, off), dtype, [&](const auto* v) {
                     using T = std::remove_cv_t<std::remove_pointer_t<decltype(v)>>;
                     const T pre = T(float(plan.pre_scale));
                     for (size_t i = 0; i < have; ++i) out[o + i] = float(v[i] * pre);
                   });
                 }
                 std::fill(out + o + have, out + o + run, 0.0f);
               });
        };
        sum = [=](const char* const* in, char* dst, size_t, size_t len) {
          auto* out = reinterpret_cast<float*>(dst);
          std::memcpy(out, in[0], len * sizeof(float));
          for (int q = 1; q < ranks; ++q) {
            const auto* v = reinterpret_cast<const float*>(in[q]);
            for (size_t i = 0; i < len; ++i) out[i] += v[i];
          }
        };
        break;
      case LevelForm::kFrames:
        produce = [=](size_t first, size_t len, char* dst) {
          const size_t q = first / inside.units;
          const int64_t from = int64_t((first - q * inside.units) * inside.elem);
          const int64_t end = from + int64_t(len * inside.elem);
          const int64_t header = frames::payload_offset(inside.wire), width = int64_t(inside.elem);
          const int64_t pieces = int64_t(x[q].size());
          // Piece j writes the frame's bytes of its values as the frame of its own values alone would, that
          // frame moved by j x segment values: the header goes with the first piece, the padding with the last.
          for (int64_t j = 0; j < pieces; ++j) {
            const int64_t shift = j * segment * width, last = j + 1 == pieces;
            const int64_t lo = std::max(from, j == 0 ? 0 : header + shift);
            const int64_t hi = last ? end : std::min(end, header + shift + segment * width);
            if (hi <= lo) continue;
            frames::encode_piece(x[q][size_t(j)], (*mine)[q], plan.pre_scale, inside.wire,
                                 last ? count - j * segment : segment, lo - shift, hi - lo,
                                 reinterpret_cast<uint8_t*>(dst) + (lo - from));
          }
        };
        sum = [=](const char* const* in, char* dst, size_t first, size_t len) {
          frames::sum_pieces(reinterpret_cast<const uint8_t* const*>(in), ranks, heard->data(), inside.wire, count,
                             int64_t((first - size_t(local) * inside.units) * inside.elem), int64_t(len * inside.elem),
                             reinterpret_cast<float*>(dst));
        };
        break;
      case LevelForm::kBlocks:
        // Blocks [first, first + k) of a part cover its elements from (first - part's first) x 32.
        auto covered = [=](size_t first, size_t k) {
          const size_t at = (first % inside.units) * compress::kMxBlock;
          return std::make_pair(at, std::min(k * compress::kMxBlock, size_t(count) - at));
        };
        produce = [=](size_t first, size_t k, char* dst) {
          const size_t q = first / inside.units;
          const auto [at, len] = covered(first, k);
          auto* out = reinterpret_cast<uint8_t*>(dst);
          const size_t j = at / piece_elements;
          if (len == 0 || (at + len - 1) / piece_elements == j) {
            const size_t off = at % piece_elements;
            const at::Tensor& piece = x[q][j];
            const size_t have = std::min(len, size_t(std::max<int64_t>(piece.numel() - int64_t(off), 0)));
            return with_wide_data(data(&piece, off), dtype, [&](const auto* v) {
              compress::mx_encode(v, have, len, float(plan.pre_scale), inside.wire, plan.mx_scale, out);
            });
          }
          // Blocks across two pieces (a reduce_scatter's outputs of other than 32 x m elements): their values
          // joined first, this chunk's alone.
          with_wide_data(data(&x[q][0], 0), dtype, [&](const auto* first_piece) {
            using T = std::remove_cv_t<std::remove_pointer_t<decltype(first_piece)>>;
            std::vector<T> joined(len, T(0));
            runs(q, at, len, [&](size_t o, const at::Tensor* piece, size_t off, size_t have, size_t) {
              if (have) std::memcpy(joined.data() + o, data(piece, off), have * sizeof(T));
            });
            compress::mx_encode(joined.data(), len, len, float(plan.pre_scale), inside.wire, plan.mx_scale, out);
          });
        };
        sum = [=](const char* const* in, char* dst, size_t first, size_t k) {
          compress::mx_sum(reinterpret_cast<const uint8_t* const*>(in), size_t(ranks), reinterpret_cast<float*>(dst),
                           covered(first, k).second, inside.wire);
        };
        break;
    }
    char* sums_area = b.workspace + sums_at;
    reduce_shm(*shm_, {Parts::equal(inside.units, ranks), inside.elem, timed_producer(produce), timed_reducer(sum),
                       sums_area, ChunkedReduction::kOwn, 0, inside.out_elem});
    float* sums = reinterpret_cast<float*>(sums_area) + inside.sums_at;

    // 2. Across hosts: this host's sub-part of the part, added from every host's frame (or fp32 run).
    char* sent = b.workspace + sent_at;
    char* gathered = b.workspace + gathered_at;
    float* total = reinterpret_cast<float*>(b.workspace + total_at);
    const at::Tensor total_t = view(reinterpret_cast<char*>(total), sub, at::kFloat);
    auto frames_at = [&](char* base, int64_t n) {
      return view(base, n * int64_t(frame), at::kByte).view({n, int64_t(frame)});
    };
    // The census counts the callers' own casts (level 1's), not the owners' sums.
    const compress::CensusSamplesPaused not_a_contribution;
    if (gather && across == LevelForm::kBlocks) {
      // MX blocks carry their scales: level 2 pipelined as mx_allreduce_step's is, a block the unit (sub is
      // a multiple of 32), each chunk encoded, summed and re-encoded by its owner, and restored as it comes.
      const size_t block = compress::kMxBlock;
      const ChunkProduce encode = [=](size_t first, size_t k, char* dst) {
        compress::mx_encode(sums + first * block, k * block, k * block, 1.0f, across_wire, plan.mx_scale,
                            reinterpret_cast<uint8_t*>(dst));
      };
      const RankSum add = [=](const char* const* in, char* dst, size_t, size_t k) {
        compress::mx_sum_encode(reinterpret_cast<const uint8_t* const*>(in), size_t(hosts), k * block, across_wire,
                                plan.mx_scale, reinterpret_cast<uint8_t*>(dst));
      };
      const ChunkConsume restore = [=](size_t first, size_t k, const char* run) {
        restore_run(first * block, k * block, run);
      };
      ChunkedReduction blocks{Parts::equal(size_t(sub) / block, hosts), compress::mx_bytes(block, across_wire),
                              timed_producer(encode), timed_reducer(add), nullptr, ChunkedReduction::kAll};
      blocks.consume = timed_consumer(restore);
      reduce_chunked(*cross_, blocks);
      cross_->end();
      return deliver(nullptr, b.workspace);
    }
    timed_reduce([&] {
      if (across == LevelForm::kFp32) return copy_bytes(sent, sums, size_t(count) * sizeof(float));
      const at::Tensor sums_t = view(reinterpret_cast<char*>(sums), count, at::kFloat);
      frames::encode(frames::parts_of(sums_t, hosts, sub), sub, 1.0, across_wire, plan.mx_scale, frames_at(sent, hosts));
    });
    const RankSum add_hosts = [&](const char* const* in, char*, size_t, size_t) {
      if (across == LevelForm::kFp32) {
        std::memcpy(total, in[0], size_t(sub) * sizeof(float));
        for (int j = 1; j < hosts; ++j) {
          const auto* v = reinterpret_cast<const float*>(in[j]);
          for (int64_t i = 0; i < sub; ++i) total[i] += v[i];
        }
        return;
      }
      std::vector<at::Tensor> received;
      for (int j = 0; j < hosts; ++j) received.push_back(view(const_cast<char*>(in[j]), int64_t(frame), at::kByte));
      frames::sum(received, sub, across_wire, total_t);
    };
    reduce_scatter_alltoall(*cross_, sent, Parts::equal(frame, hosts), 1, timed_reducer(add_hosts), nullptr);
    if (!gather) {
      cross_->end();
      return deliver(total, b.workspace);
    }
    // allreduce: the sub-part's sum framed once more (one rounding to the wire), every host's gathered.
    timed_reduce([&] {
      char* own = gathered + size_t(host) * frame;
      if (across == LevelForm::kFp32) return copy_bytes(own, total, size_t(sub) * sizeof(float));
      frames::encode({total_t}, sub, 1.0, across_wire, plan.mx_scale, frames_at(own, 1));
    });
    allgather_ring(*cross_, gathered, Parts::equal(frame, hosts), 1, tags::kSecondPhase);
    cross_->end();
    deliver(reinterpret_cast<const float*>(gathered), b.workspace);
  };
  return step;
}

HostPath::Step HostPath::per_level_allreduce_step(const at::Tensor& tensor, const Plan& plan) {
  const int ranks = shm_->size(), local = shm_->rank(), hosts = cross_->size();
  const int64_t n = tensor.numel(), align = int64_t(compress::kMxBlock) * hosts;
  const int64_t count = ((n + ranks - 1) / ranks + align - 1) / align * align, sub = count / hosts;
  const size_t wide = tensor.element_size();
  const at::ScalarType dtype = tensor.scalar_type();
  // Results land in the tensor, or in a staging copy that replaces it once every part is in (a strided
  // tensor, or untouched_on_failure).
  const bool direct = tensor.is_contiguous() && !config_.untouched_on_failure;
  auto src = std::make_shared<at::Tensor>();
  std::shared_ptr<bool> wrote = direct ? std::make_shared<bool>(false) : nullptr;
  Parts parts;
  for (int64_t q = 0; q < ranks; ++q) {
    parts.offset.push_back(size_t(std::min(n, q * count)));
    parts.length.push_back(size_t(std::min(n, (q + 1) * count) - std::min(n, q * count)));
  }
  auto y_of = [=](char* staging) { return direct ? static_cast<char*>(tensor.data_ptr()) : staging; };
  auto staging = std::make_shared<char*>(nullptr);
  // Level 2's results as MX runs, a chunk at a time: elements [first, first + len) of this local part.
  const ChunkConsume restore_run = [=](size_t first, size_t len, const char* run) {
    if (wrote) *wrote = true;
    const size_t have = parts.length[local], given = first < have ? std::min(len, have - first) : 0;
    if (!given) return;
    char* dst = y_of(*staging) + (parts.offset[local] + first) * wide;
    const auto* codes = reinterpret_cast<const uint8_t*>(run);
    if (dtype == at::kDouble) {
      compress::mx_restore(codes, len, reinterpret_cast<double*>(dst), given, float(plan.post_scale), *plan.across);
    } else {
      compress::mx_restore(codes, len, reinterpret_cast<float*>(dst), given, float(plan.post_scale), *plan.across);
    }
  };
  auto deliver = [=, this](const float* gathered, char* staging_area) {
    char* y = y_of(staging_area);
    if (wrote) *wrote = true;
    // 3. Every local part to every rank of the host; with `gathered`, level 2's results are restored first.
    if (!gathered) return allgather_shm(*shm_, y, parts, wide);
    const at::Tensor part = view(y + parts.offset[local] * wide, int64_t(parts.length[local]), dtype);
    timed_restore([&] {
      if (!plan.across) {
        const at::Tensor sums = view(const_cast<char*>(reinterpret_cast<const char*>(gathered)), part.numel(), at::kFloat);
        return write_scaled_sums(sums, part, plan.post_scale);
      }
      const int64_t frame = frames::frame_bytes(sub, *plan.across);
      const at::Tensor all = view(const_cast<char*>(reinterpret_cast<const char*>(gathered)), frame * hosts, at::kByte);
      frames::restore(all.view({hosts, frame}), sub, *plan.across, plan.post_scale, part);
    });
    allgather_shm(*shm_, y, parts, wide);
  };
  Step step = per_level_step(
      [=] {
        *src = tensor.reshape({-1}).contiguous();
        std::vector<std::vector<at::Tensor>> rows;
        for (const auto& part : frames::parts_of(*src, ranks, count)) rows.push_back({part});
        return rows;
      },
      count, count, plan, /*gather=*/true, direct ? 0 : size_t(n) * wide, deliver, restore_run);
  step.wrote_results = wrote;
  const auto algorithm = step.algorithm;
  step.algorithm = [=](const Buffers& b) {
    *staging = b.workspace;  // the staging area leads the workspace
    algorithm(b);
  };
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
  std::vector<std::vector<at::Tensor>> by_local(static_cast<size_t>(ranks));  // local part l: its ranks' inputs, in host order
  for (int j = 0; j < hosts; ++j) {
    for (int l = 0; l < ranks; ++l) by_local[size_t(l)].push_back(inputs[size_t(shm_->hosts()[size_t(j)][size_t(l)])]);
  }
  auto deliver = [=, this](const float* total, char*) {
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
      each * hosts, each, plan, /*gather=*/false, 0, deliver, nullptr);
}

}  // namespace cnccl::host

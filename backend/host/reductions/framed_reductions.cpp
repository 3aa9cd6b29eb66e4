// The host path's compressed sums in frames (plan.framed; backend/frames.h), each a ChunkedReduction
// through shared memory on one host (reduce_shm) and pipelined over the transport elsewhere
// (reduce_chunked), the same functions on either: every rank's piece of part p goes to rank p, which
// decodes and adds them in fp32 in rank order. Parts and blocks are cut as the composed path's frames
// cut them, so every path gives the same bits.
//
// A power-of-two frame (framed_*_step) has one exponent for its whole part: each rank finds a part's
// exponent (the amax pass) when it produces the part's first piece, then casts and sends its frames in
// pieces, the header in the first. Over the transport (reduce_chunked) the later parts' passes overlap the
// first pieces' transfer; through shared memory (reduce_shm) every part's first piece is published at once.
// reduce_scatter writes the owner's sum, unrounded; allreduce's owner frames its whole sum with its own
// exponent once every piece is in, and the owners' frames are allgathered in pieces, each restored as
// it comes (allgather_shm, allgather_chunked). allreduce's parts are ceil(n / size) elements (the last
// short or empty).
//
// MX blocks (mx_*_step) carry their scales, so a chunk of a part's blocks is encoded, summed and
// decoded on its own, and allreduce's results go back chunk by chunk. The unit is a block (its scale
// byte and elements: compress::mx_bytes(32)); a piece of k blocks travels as the MX run of the values
// it covers, which for the part's last block may be short.
//
// Both are one level of LevelCodec (level_codec.h), which a wire per level shares.
#include <atomic>
#include <cstring>
#include <memory>
#include <mutex>

#include "backend/frames.h"
#include "backend/host/host_path.h"
#include "backend/host/reductions/level_codec.h"
#include "backend/host/shm/shm_algorithms.h"
#include "backend/host/staging.h"
#include "backend/host/transport/comm.h"
#include "backend/host/transport/tags.h"

namespace cnccl::host {
namespace {

using Rows = std::vector<std::vector<at::Tensor>>;  // each part's contribution, in pieces (LevelCodec::Row)

// A flat tensor's parts of `count` values, one piece each (the last short, or empty).
Rows parts_as_rows(const at::Tensor& flat, int parts, int64_t count) {
  Rows rows;
  for (const auto& part : frames::parts_of(flat, parts, count)) rows.push_back({part});
  return rows;
}

// Each part's exponent, found once, by whichever piece of the part is produced first.
class PartExponents {
 public:
  explicit PartExponents(int parts) : found_(std::make_unique<std::once_flag[]>(size_t(parts))), values_(size_t(parts)) {}

  template <typename Find>
  int32_t of(size_t q, Find find) {
    std::call_once(found_[q], [&] { values_[q] = find(); });
    return values_[q];
  }

 private:
  std::unique_ptr<std::once_flag[]> found_;
  std::vector<int32_t> values_;
};

// Of part q's `count` values, those the tensor of n has.
int64_t given(int64_t n, size_t q, int64_t count) {
  return std::max<int64_t>(0, std::min(count, n - int64_t(q) * count));
}

}  // namespace

HostPath::Step HostPath::mx_allreduce_step(const at::Tensor& tensor, const Plan& plan, bool on_shm) {
  const int size = size_;
  const int64_t n = tensor.numel(), count = (n + size - 1) / size;
  const LevelCodec codec(plan.wire, count, plan.mx_scale);
  const size_t units = codec.units(), wide = tensor.element_size();
  const at::ScalarType dtype = tensor.scalar_type();
  // Results restored chunk by chunk into the tensor, or into a staging copy that replaces it once
  // every chunk is in (a strided tensor, or untouched_on_failure: docs/design.md, "Shared memory").
  const bool direct = tensor.is_contiguous() && !config_.untouched_on_failure;
  // Stochastic rounding: each value takes the bits of its index in the tensor.
  const auto dithered = dithers(plan, size_t(n));
  const compress::Dither contributions = dithered.first, of_sums = dithered.second;
  const bool stochastic = plan.stochastic;
  auto src = std::make_shared<at::Tensor>();
  auto rows = std::make_shared<Rows>();
  Step step;
  step.on_shm = on_shm;
  step.workspace_bytes = direct ? 0 : size_t(n) * wide;
  if (direct) step.wrote_results = std::make_shared<bool>(false);
  const std::shared_ptr<bool> wrote = step.wrote_results;
  step.pre = [=](const Buffers&) {
    *src = tensor.reshape({-1}).contiguous();
    *rows = parts_as_rows(*src, size, count);
  };
  step.algorithm = [=, this](const Buffers& b) {
    char* y = direct ? static_cast<char*>(tensor.data_ptr()) : b.workspace;
    const ChunkProduce produce = [=](size_t block, size_t k, char* dst) {
      const size_t q = block / units;
      codec.encode({&(*rows)[q], count, plan.pre_scale, 0, stochastic ? &contributions : nullptr, q * uint64_t(count)},
                   block - q * units, k, reinterpret_cast<uint8_t*>(dst));
    };
    const RankSum sum = [=](const char* const* in, char* dst, size_t block, size_t k) {
      const size_t q = block / units;
      codec.sum_encode(reinterpret_cast<const uint8_t* const*>(in), size, block % units, k,
                       reinterpret_cast<uint8_t*>(dst), stochastic ? &of_sums : nullptr, q * uint64_t(count));
    };
    const ChunkConsume consume = [=](size_t block, size_t k, const char* result) {
      const size_t q = block / units;
      if (wrote) *wrote = true;
      codec.restore(reinterpret_cast<const uint8_t*>(result), nullptr, int64_t(q), block - q * units, k,
                    given(n, q, count), plan.post_scale, dtype, y + q * size_t(count) * wide);
    };
    ChunkedReduction reduction{Parts::equal(units, size), codec.elem(), timed_producer(produce), timed_reducer(sum),
                               nullptr, ChunkedReduction::kAll};
    reduction.consume = timed_consumer(consume);
    reduce(reduction, on_shm);
  };
  step.post = [=](const Buffers& b) {
    src->reset();
    rows->clear();
    if (!direct) unpack(b.workspace, tensor);
  };
  return step;
}

HostPath::Step HostPath::mx_reduce_scatter_step(const std::vector<at::Tensor>& inputs, const at::Tensor& output,
                                                const Plan& plan, bool on_shm) {
  const int size = size_;
  const int64_t each = output.numel();
  const LevelCodec codec(plan.wire, each, plan.mx_scale);
  const size_t units = codec.units();
  const compress::Dither contributions = dithers(plan, size_t(each) * size_t(size)).first;
  const bool stochastic = plan.stochastic;
  auto rows = std::make_shared<Rows>();
  Step step;
  step.on_shm = on_shm;
  step.workspace_bytes = codec.sums_bytes();  // this rank's part's fp32 sums
  step.pre = [=](const Buffers&) {
    for (const auto& in : inputs) rows->push_back({in.contiguous()});
  };
  step.algorithm = [=, this](const Buffers& b) {
    const ChunkProduce produce = [=](size_t block, size_t k, char* dst) {
      const size_t q = block / units;
      codec.encode({&(*rows)[q], each, plan.pre_scale, 0, stochastic ? &contributions : nullptr, q * uint64_t(each)},
                   block - q * units, k, reinterpret_cast<uint8_t*>(dst));
    };
    const RankSum sum = [=](const char* const* in, char* dst, size_t block, size_t k) {
      codec.sum(reinterpret_cast<const uint8_t* const*>(in), size, nullptr, block % units, k,
                reinterpret_cast<float*>(dst));
    };
    reduce({Parts::equal(units, size), codec.elem(), timed_producer(produce), timed_reducer(sum), b.workspace,
            ChunkedReduction::kOwn, 0, codec.out_elem()},
           on_shm);
  };
  step.post = [=](const Buffers& b) {
    rows->clear();
    restore_sums_into(reinterpret_cast<const float*>(b.workspace), output, plan);
  };
  return step;
}

HostPath::Step HostPath::framed_allreduce_step(const at::Tensor& tensor, const Plan& plan, bool on_shm) {
  const int size = size_;
  const int64_t n = tensor.numel(), count = (n + size - 1) / size;
  const LevelCodec codec(plan.wire, count, plan.mx_scale);
  // Stochastic rounding (NVFP4's here): each value takes the bits of its index in the tensor.
  const auto dithered = dithers(plan, size_t(n));
  const compress::Dither contributions = dithered.first, of_sums = dithered.second;
  const bool stochastic = plan.stochastic;
  const size_t units = codec.units(), width = codec.elem(), wide = tensor.element_size();
  const at::ScalarType dtype = tensor.scalar_type();
  // The owners' frames are restored as their pieces come: into the tensor, or into a staging copy
  // that replaces it once every frame is in (a strided tensor, or untouched_on_failure).
  const bool direct = tensor.is_contiguous() && !config_.untouched_on_failure;
  auto src = std::make_shared<at::Tensor>();
  auto rows = std::make_shared<Rows>();
  auto mine = std::make_shared<PartExponents>(size);           // this rank's exponent of each part
  auto heard = std::make_shared<std::vector<int32_t>>(size);  // every rank's exponent of this owner's part
  auto told = std::make_shared<std::vector<int32_t>>(size);   // each owner's exponent of its sum
  // The largest |sum| of this owner's part so far, as the bits of a non-negative float (a NaN's exceed
  // infinity's): its frame's exponent is ready when the last piece is summed, with no pass over the sums.
  auto largest = std::make_shared<std::atomic<uint32_t>>(0);
  Step step;
  step.on_shm = on_shm;
  // This owner's fp32 sums, a float for each unit of its frame; then the staging copy, unless direct.
  const size_t sums_bytes = codec.sums_bytes();
  step.workspace_bytes = sums_bytes + (direct ? 0 : size_t(n) * wide);
  if (direct) step.wrote_results = std::make_shared<bool>(false);
  const std::shared_ptr<bool> wrote = step.wrote_results;
  step.pre = [=](const Buffers&) {
    *src = tensor.reshape({-1}).contiguous();
    *rows = parts_as_rows(*src, size, count);
  };
  step.algorithm = [=, this](const Buffers& b) {
    const ChunkProduce produce = [=](size_t first, size_t len, char* dst) {
      const size_t q = first / units;
      const int32_t e = mine->of(q, [&] { return codec.exponent({&(*rows)[q], count, plan.pre_scale}); });
      codec.encode({&(*rows)[q], count, plan.pre_scale, e, stochastic ? &contributions : nullptr,
                    q * uint64_t(count)},
                   first - q * units, len, reinterpret_cast<uint8_t*>(dst));
    };
    const RankSum sum = [=](const char* const* in, char* dst, size_t first, size_t len) {
      const float a = codec.sum(reinterpret_cast<const uint8_t* const*>(in), size, heard->data(),
                                first % units, len, reinterpret_cast<float*>(dst));
      uint32_t bits, seen = largest->load(std::memory_order_relaxed);
      std::memcpy(&bits, &a, sizeof bits);
      bits &= 0x7FFFFFFFu;
      while (bits > seen && !largest->compare_exchange_weak(seen, bits, std::memory_order_relaxed)) {
      }
    };
    char* sums = b.workspace;
    reduce({Parts::equal(units, size), width, timed_producer(produce), timed_reducer(sum), sums,
            ChunkedReduction::kOwn, 0, codec.out_elem()},
           on_shm);
    // The owner's frame of its sum needs the whole sum's amax: it goes out once every piece is in.
    const std::vector<at::Tensor> total{
        view(sums + codec.first_sum_at(), count, at::kFloat)};
    int32_t k = 0;
    timed_reduce([&] {
      const compress::CensusSamplesPaused not_a_contribution;
      const uint32_t bits = largest->load(std::memory_order_relaxed);  // a NaN's bits are a NaN
      float amax;
      std::memcpy(&amax, &bits, sizeof amax);
      k = codec.sum_exponent(amax, total[0]);
    });
    const ChunkProduce frame_sum = [&](size_t first, size_t len, char* dst) {
      const compress::CensusSamplesPaused not_a_contribution;
      codec.encode({&total, count, 1.0, k, stochastic ? &of_sums : nullptr, uint64_t(rank_) * uint64_t(count)},
                   first % units, len, reinterpret_cast<uint8_t*>(dst));
    };
    char* y = direct ? static_cast<char*>(tensor.data_ptr()) : b.workspace + sums_bytes;
    const ChunkConsume restore = [=](size_t first, size_t len, const char* piece) {
      const size_t q = first / units;
      codec.restore(reinterpret_cast<const uint8_t*>(piece), &(*told)[q], int64_t(q), first - q * units, len,
                    given(n, q, count), plan.post_scale, dtype, y + q * size_t(count) * wide);
      // After the header's check (a bad one writes nothing); a part past the tensor's end writes nothing.
      if (wrote && given(n, q, count)) *wrote = true;
    };
    const Parts parts = Parts::equal(units, size);
    if (on_shm) return allgather_shm(*shm_, nullptr, parts, width, timed_producer(frame_sum), timed_consumer(restore));
    allgather_chunked(*comm_, parts, width, timed_producer(frame_sum), timed_consumer(restore), tags::kSecondPhase);
  };
  step.post = [=](const Buffers& b) {
    src->reset();
    rows->clear();
    if (!direct) unpack(b.workspace + sums_bytes, tensor);
  };
  return step;
}

HostPath::Step HostPath::framed_reduce_scatter_step(const std::vector<at::Tensor>& inputs, const at::Tensor& output,
                                                    const Plan& plan, bool on_shm) {
  const int size = size_;
  const int64_t each = output.numel();
  const LevelCodec codec(plan.wire, each, plan.mx_scale);
  const size_t units = codec.units();
  const compress::Dither contributions = dithers(plan, size_t(each) * size_t(size)).first;
  const bool stochastic = plan.stochastic;
  auto rows = std::make_shared<Rows>();
  auto mine = std::make_shared<PartExponents>(size);
  auto heard = std::make_shared<std::vector<int32_t>>(size);
  Step step;
  step.on_shm = on_shm;
  step.workspace_bytes = codec.sums_bytes();  // this rank's fp32 sums, a float for each unit of its frame
  step.pre = [=](const Buffers&) {
    for (int q = 0; q < size; ++q) rows->push_back({inputs[size_t(q)].contiguous()});
  };
  step.algorithm = [=, this](const Buffers& b) {
    const ChunkProduce produce = [=](size_t first, size_t len, char* dst) {
      const size_t q = first / units;
      const int32_t e = mine->of(q, [&] { return codec.exponent({&(*rows)[q], each, plan.pre_scale}); });
      codec.encode({&(*rows)[q], each, plan.pre_scale, e, stochastic ? &contributions : nullptr,
                    q * uint64_t(each)},
                   first - q * units, len, reinterpret_cast<uint8_t*>(dst));
    };
    const RankSum sum = [=](const char* const* in, char* dst, size_t first, size_t len) {
      codec.sum(reinterpret_cast<const uint8_t* const*>(in), size, heard->data(), first % units, len,
                reinterpret_cast<float*>(dst));
    };
    reduce({Parts::equal(units, size), codec.elem(), timed_producer(produce), timed_reducer(sum), b.workspace,
            ChunkedReduction::kOwn, 0, codec.out_elem()},
           on_shm);
  };
  step.post = [=](const Buffers& b) {
    rows->clear();
    restore_sums_into(reinterpret_cast<const float*>(b.workspace + codec.first_sum_at()), output, plan);
  };
  return step;
}

}  // namespace cnccl::host

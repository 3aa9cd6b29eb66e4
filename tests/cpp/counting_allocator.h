// A CPU allocator that counts: installed for its lifetime, it hands out the real allocator's memory
// and keeps the bytes live and their peak. On CUDA the same ATen calls allocate the same buffers at
// the same points (the caching allocator counts an allocation when it is made), so a peak measured here
// is the one max_memory_allocated shows there.
#pragma once

#include <c10/core/CPUAllocator.h>

#include <atomic>
#include <cstring>
#include <memory>

namespace cnccl::testing {

class CountingAllocator final : public c10::Allocator {
 public:
  CountingAllocator() : real_(c10::GetCPUAllocator()) { c10::SetCPUAllocator(this, kPriority); }
  ~CountingAllocator() override { c10::SetCPUAllocator(real_, kPriority); }
  int64_t peak() const { return counts_->peak; }

  c10::DataPtr allocate(size_t bytes) override {
    auto* held = new Held{real_->allocate(bytes), bytes, counts_};
    const int64_t live = counts_->live += int64_t(bytes);
    int64_t peak = counts_->peak;
    while (live > peak && !counts_->peak.compare_exchange_weak(peak, live)) {
    }
    return {held->inner.get(), held, &release, held->inner.device()};
  }
  void copy_data(void* dest, const void* src, std::size_t count) const override { std::memcpy(dest, src, count); }

 private:
  static constexpr uint8_t kPriority = 100;
  struct Counts {
    std::atomic<int64_t> live{0}, peak{0};
  };
  // What a buffer handed out holds: it may outlive the allocator (a future kept by a double).
  struct Held {
    c10::DataPtr inner;
    size_t bytes;
    std::shared_ptr<Counts> counts;
  };
  static void release(void* ctx) {
    auto* held = static_cast<Held*>(ctx);
    held->counts->live -= int64_t(held->bytes);
    delete held;
  }
  c10::Allocator* real_;
  std::shared_ptr<Counts> counts_ = std::make_shared<Counts>();
};

}  // namespace cnccl::testing

// A CPU allocator that counts: installed for its lifetime, it hands out the real allocator's memory
// and keeps the bytes live and their peak. On CUDA the same ATen calls allocate the same buffers at
// the same points (the caching allocator counts an allocation when it is made), so a peak measured here
// is the one max_memory_allocated shows there.
#pragma once

#include <c10/core/CPUAllocator.h>

#include <atomic>
#include <cstring>

namespace cnccl::testing {

class CountingAllocator final : public c10::Allocator {
 public:
  CountingAllocator() : real_(c10::GetCPUAllocator()) { c10::SetCPUAllocator(this, kPriority); }
  ~CountingAllocator() override { c10::SetCPUAllocator(real_, kPriority); }
  int64_t peak() const { return peak_; }

  c10::DataPtr allocate(size_t bytes) override {
    auto* held = new Held{real_->allocate(bytes), bytes, this};
    const int64_t live = live_ += int64_t(bytes);
    int64_t peak = peak_;
    while (live > peak && !peak_.compare_exchange_weak(peak, live)) {
    }
    return {held->inner.get(), held, &release, held->inner.device()};
  }
  void copy_data(void* dest, const void* src, std::size_t count) const override { std::memcpy(dest, src, count); }

 private:
  static constexpr uint8_t kPriority = 100;
  struct Held {
    c10::DataPtr inner;
    size_t bytes;
    CountingAllocator* owner;
  };
  static void release(void* ctx) {
    auto* held = static_cast<Held*>(ctx);
    held->owner->live_ -= int64_t(held->bytes);
    delete held;
  }
  c10::Allocator* real_;
  std::atomic<int64_t> live_{0}, peak_{0};
};

}  // namespace cnccl::testing

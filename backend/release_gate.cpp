#include "backend/release_gate.h"

#include <atomic>
#include <chrono>
#include <shared_mutex>

namespace cnccl::release_gate {
namespace {

// Readers are the drops; glibc's rwlock lets them in while close() waits, so a drop that destroys a
// group, whose threads drop too as it joins them, never waits on close().
std::shared_timed_mutex gate;
std::atomic<bool> closed{false};
// A drop is a few reference counts; this bound only matters if one destroys a group whose engine
// waits for a collective in flight, and then close() proceeds without it.
constexpr std::chrono::seconds kCloseBound{5};

}  // namespace

bool enter() {
  gate.lock_shared();
  if (!closed.load()) return true;
  gate.unlock_shared();
  return false;
}

void leave() { gate.unlock_shared(); }

void close() {
  const bool locked = gate.try_lock_for(kCloseBound);
  closed.store(true);
  if (locked) gate.unlock();
}

}  // namespace cnccl::release_gate

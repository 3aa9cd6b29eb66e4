#include "backend/release_gate.h"

#include <atomic>
#include <chrono>
#include <shared_mutex>

namespace cnccl::release_gate {
namespace {

// Readers are the drops; glibc's rwlock lets them in while close() waits, so a drop that destroys a
// group, whose threads drop too as it joins them, never waits on close(). Never destroyed: threads
// a job never joined may still pass through it while the process exits.
std::shared_timed_mutex& gate = *new std::shared_timed_mutex;
std::atomic<bool> closed{false};
// A drop inside a drop on one thread (a completion whose callback drops more) holds the gate once.
thread_local int depth = 0;
// A drop is a few reference counts; this bound only matters if one destroys a group whose engine
// waits for a collective in flight, and then close() proceeds without it.
constexpr std::chrono::seconds kCloseBound{5};

}  // namespace

bool enter() {
  if (depth > 0) {
    ++depth;
    return true;
  }
  gate.lock_shared();
  if (!closed.load()) {
    depth = 1;
    return true;
  }
  gate.unlock_shared();
  return false;
}

void leave() {
  if (--depth == 0) gate.unlock_shared();
}

void close() {
  const bool locked = gate.try_lock_for(kCloseBound);
  closed.store(true);
  if (locked) gate.unlock();
}

}  // namespace cnccl::release_gate

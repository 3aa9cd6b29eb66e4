// The host path's shared-memory channel among ranks of one host (docs/design.md, "Shared
// memory"): every rank writes only its own segment and reads the others' through read-only
// mappings. A segment holds a control block (monotonic step counters, one per cache line, and the
// signature headers) and kDepth slots, each a contribution area and a result area. Steps are
// numbered alike on every rank (the collectives are the same, in the same order, or the
// signatures fail), so slot `step % kDepth` and counter values need no agreement of their own.
// Owned and used by the group's executor thread; abort() may come from any thread.
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "backend/host/shm/shm_segment.h"

namespace cnccl::host {

class ShmComm {
 public:
  // Bytes of one slot's contribution area (and of its result area).
  static constexpr size_t kSlotBytes = size_t(512) << 10;
  // What a reduction's chunk uses of a slot while ranks spin: little enough that a chunk's fp32
  // input (256 KiB at 2 ranks), its slots and results stay in a core's 1-2 MiB L2 from the cast to
  // the restore, so the restore writes into cached lines. At 2 ranks 64 MiB allreduces took
  // 11.0 ms with 128 KiB, 13.9-14.2 with 512 and 15.4 with 1 MiB (64 KiB: 10.5, but 1 MiB calls
  // 10% slower for the extra steps; bench/allreduce.py). Ranks that sleep between steps (more
  // ranks than CPUs) pay a wake-up a step instead, and fill the slot: 4 ranks on 2 cores ran 16 MiB
  // at 3.6x gloo with 512 KiB chunks, 3.0x with 128.
  static constexpr size_t kSpinningChunkBytes = size_t(128) << 10;
  size_t chunk_bytes() const { return spins() ? kSpinningChunkBytes : kSlotBytes; }
  static constexpr uint64_t kDepth = 2;
  // Elements of `elem` bytes in one piece of a chunk that gives each of `ranks` ranks a piece of a
  // slot: a whole number of cache lines' worth where a slot holds that many, so pieces never share
  // a line, else what fits. Never more than `bytes` / ranks (at most kSlotBytes).
  static size_t piece_elements(int ranks, size_t elem, size_t bytes = kSlotBytes);
  enum Counter : int { kPosted, kReduced, kReleased, kCounters };

  // Collective over the group: maps the segments of the ranks on this host (host_identity()).
  // Returns nullptr, with the reason in `why`, when any rank has shared memory turned off
  // (`enabled`), when a segment cannot be made or mapped, or when the group spans hosts that do
  // not each hold the same number (> 1) of its ranks. The channel's ranks are this host's, in
  // the order of their group ranks.
  static std::unique_ptr<ShmComm> connect(c10d::Store& store, int rank, int size, std::string group_name, bool enabled,
                                          std::string* why);
  ~ShmComm();

  // This rank among the host's ranks, and their number.
  int rank() const { return rank_; }
  int size() const { return size_; }
  // The group's ranks by host (hosts in the order of their lowest rank), and this rank's host.
  const std::vector<std::vector<int>>& hosts() const { return hosts_; }
  int host() const { return host_; }
  // Whether a waiter spins a while before it sleeps (docs/design.md, "The channel"), and how long.
  bool spins() const { return spin_.count() > 0; }
  std::chrono::microseconds spin() const { return spin_; }
  // The spin budget after a waiter measured a futex wake-up (from its waker's post to its own
  // return) of `wake_up`: an average of the wake-ups seen so far, within [kMinSpin, kMaxSpin].
  // Spinning as long as a sleep and wake-up costs keeps any wait within twice its best cost
  // (whether the peer then comes sooner or later).
  static std::chrono::microseconds spin_after(std::chrono::microseconds spin, std::chrono::nanoseconds wake_up);
  // At most half the longest sleep between checks of the deadline and peers: measured wake-ups
  // include waiting for a core, which a busy machine can stretch.
  static constexpr std::chrono::microseconds kMinSpin{10}, kMaxSpin{500};

  // The CPU quota, in whole CPUs rounded up, of the cgroup (v2) named for this process in
  // `proc_cgroup` (/proc/self/cgroup) under `root` (/sys/fs/cgroup): the smallest `cpu.max` of it
  // and its ancestors; 0 for none.
  static int cgroup_cpu_quota(const std::string& proc_cgroup, const std::string& root);
  // Whether the host's ranks outnumber the CPUs they may run on, given each rank's affinity ('0'/'1'
  // by CPU number; empty when unknown) and cgroup quota (0 for none).
  static bool oversubscribed(const std::vector<std::string>& affinities, const std::vector<int>& quotas,
                             int hardware_cpus);

  // Starts a collective. `signature` is what every rank must agree on; the first step's
  // wait_all(kPosted) compares it with every peer's, before any data is read.
  void begin(const char* op, uint64_t seq, std::chrono::milliseconds timeout, const std::string& signature);
  // One step that only agrees on the signature, for a collective whose data goes elsewhere.
  void agree();

  // The next step: waits until no rank still reads the slot it reuses.
  uint64_t acquire();
  char* contribution(int rank, uint64_t step) const { return slot(rank, step); }
  char* result(int rank, uint64_t step) const { return slot(rank, step) + kSlotBytes; }
  // Publishes this rank's counter (the first kPosted of a collective also publishes its signature).
  void post(Counter counter, uint64_t step);
  // Waits until every other rank's counter reached `step`. Throws DistBackendError (naming the
  // op, seq, group and peer) when a peer exited, the deadline passed, the signatures differ, or
  // abort() was called.
  void wait_all(Counter counter, uint64_t step);

  // What a wait does while it idles when another channel must progress meanwhile (a wire per level's
  // messages across hosts, in flight while this host sums the next piece: docs/design.md, "A wire
  // per level"): `poll` every few spins, and `sleep` instead of the futex, so the other channel's
  // traffic wakes this rank too. A peer's post is then seen within one sleep, not by its wake-up.
  struct Idle {
    std::function<void()> poll;
    std::function<void(std::chrono::microseconds)> sleep;
  };
  static constexpr std::chrono::microseconds kIdleSleep{50};
  // Waits run `idle` while this lives (executor thread only; the hook must not use this channel).
  class IdleScope {
   public:
    IdleScope(ShmComm& shm, const Idle& idle) : shm_(shm), before_(shm.idle_) { shm.idle_ = &idle; }
    ~IdleScope() { shm_.idle_ = before_; }
    IdleScope(const IdleScope&) = delete;
    IdleScope& operator=(const IdleScope&) = delete;

   private:
    ShmComm& shm_;
    const Idle* before_;
  };

  void abort(const std::string& why);
  // Tells this host's peers that this rank failed the current collective, and why: a peer waiting on it
  // there, or in any later collective, fails at once, naming it and `what`, instead of at the deadline.
  // A rank may fail alone (a disagreement only its ring neighbours across hosts saw, a failure between
  // hosts).
  void publish_failure(const std::string& what);

  // Bytes this rank wrote to its segment for its peers to read: its contributions to their parts
  // and the results of its own (the shared-memory counterpart of a transport's bytes sent).
  void count_published(size_t bytes) { published_ += bytes; }
  uint64_t bytes_published() const { return published_.load(); }

 private:
  struct Control;
  ShmComm(int rank, int size, std::string group_name, std::vector<Segment> segments, std::vector<Liveness> peers,
          std::vector<std::vector<int>> hosts, int host, std::chrono::microseconds spin);
  int global_rank(int local) const { return hosts_[host_][local]; }

  Control& control(int rank) const;
  char* slot(int rank, uint64_t step) const;
  void wait_one(int peer, Counter counter, uint64_t step);
  void compare_signatures(uint64_t step);
  [[noreturn]] void fail(const std::string& what, int peer) const;

  const int rank_, size_;
  const std::string group_name_;
  std::vector<Segment> segments_;  // by rank; this rank's is writable
  std::vector<Liveness> peers_;    // by rank
  const std::vector<std::vector<int>> hosts_;
  const int host_;
  uint64_t step_ = 0;
  std::chrono::microseconds spin_;  // how long a waiter spins before it sleeps
  const Idle* idle_ = nullptr;
  const char* op_ = "";
  uint64_t seq_ = 0;
  std::chrono::steady_clock::time_point deadline_;
  std::chrono::milliseconds timeout_{0};
  std::string signature_;
  bool signature_pending_ = false;  // the collective's first post has not happened yet
  bool signature_checked_ = true;
  std::mutex abort_mutex_;
  std::atomic<bool> aborted_{false};
  std::atomic<uint64_t> published_{0};
  uint64_t posted_steps_ = 0, kill_at_posted_step_ = 0;  // fault_injection.h
  std::string abort_reason_;
};

}  // namespace cnccl::host

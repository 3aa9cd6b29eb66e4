#include "backend/host/shm/shm_comm.h"

#include <c10/util/Exception.h>
#include <linux/futex.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <fstream>
#include <map>
#include <cstring>
#include <random>
#include <sstream>
#include <thread>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "backend/host/fault_injection.h"
#include "backend/signature.h"

namespace cnccl::host {
namespace {

using Clock = std::chrono::steady_clock;

constexpr uint64_t kMagic = 0x636e63636c73686dull;  // "cnccl shm"
constexpr size_t kSignatureBytes = 256;
constexpr size_t kFailureBytes = 1024;
// How long a waiter spins before it sleeps until it has measured a wake-up (ShmComm::spin_after).
// A futex wake-up on an idle core of a 2-core VM took 100 us or more: 4K allreduces at 2 ranks took
// 110-140 us with 30 us of spinning and 30-45 us with 200 (bench/allreduce.py).
constexpr std::chrono::microseconds kFirstSpin{200};
// The longest a sleeping waiter goes without looking at its deadline, abort flag and peer.
constexpr auto kMaxFutexSleep = std::chrono::milliseconds(1);

void cpu_relax() {
#if defined(__x86_64__)
  _mm_pause();
#endif
}

uint32_t* futex_word(const std::atomic<uint64_t>& counter) {
  // The low half of the little-endian counter changes on every increment.
  return reinterpret_cast<uint32_t*>(const_cast<std::atomic<uint64_t>*>(&counter));
}

// Whether a FUTEX_WAKE ended the sleep (not the limit, nor a counter that had already moved).
bool futex_wait(const std::atomic<uint64_t>& counter, uint32_t seen, std::chrono::nanoseconds limit) {
  timespec ts{0, long(limit.count())};
  return ::syscall(SYS_futex, futex_word(counter), FUTEX_WAIT, seen, &ts, nullptr, 0) == 0;
}

void futex_wake(const std::atomic<uint64_t>& counter) {
  ::syscall(SYS_futex, futex_word(counter), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

std::string key(const char* what, int rank) { return std::string("cnccl/shm/") + what + "/" + std::to_string(rank); }

void set(c10d::Store& store, const std::string& k, const std::string& v) {
  store.set(k, std::vector<uint8_t>(v.begin(), v.end()));
}

std::string get(c10d::Store& store, const std::string& k) {
  const std::vector<uint8_t> v = store.get(k);
  return std::string(v.begin(), v.end());
}

}  // namespace

struct ShmComm::Control {
  // A cache line a counter, so that ranks polling one do not slow down the writers of the others. A member
  // type, not one of this file's own: a type in an anonymous namespace would give Control's fields internal
  // linkage (GCC's -Wsubobject-linkage, where a unity build includes this file).
  struct alignas(64) Line {
    std::atomic<uint64_t> value{0};
  };
  uint64_t magic;
  uint64_t token;  // proves a peer mapped this very segment
  Line counters[kCounters];
  Line sleeping;  // nonzero while this rank may sleep on a peer's counter
  // By counter: when this rank last woke peers sleeping on it (steady clock, shared by the host).
  Line woke_ns[kCounters];
  struct Header {
    uint64_t step;
    char text[kSignatureBytes];
  } headers[kDepth];
  // The collective this rank failed last (its seq + 1), and why; written before the number.
  Line failed;
  char failure[kFailureBytes];
};

namespace {
constexpr size_t kControlBytes = 4096;
constexpr size_t kShmSegmentBytes = kControlBytes + ShmComm::kDepth * 2 * ShmComm::kSlotBytes;
}  // namespace

namespace {

// What a rank publishes in the store for the others to decide with.
struct Announcement {
  bool ok = false;
  std::string identity, reason;
  int pid = -1, fd = -1;
  uint64_t token = 0;
  std::string cpus;  // the CPUs it may run on (its affinity), as 0/1 characters by CPU number
  int quota_cpus = 0;  // its cgroup's CPU quota, whole CPUs rounded up; 0 for none
  int hardware_cpus = 0;  // the CPUs its machine has (std::thread::hardware_concurrency)
};

std::string affinity() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof set, &set) != 0) return {};
  std::string cpus(CPU_SETSIZE, '0');
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) cpus[size_t(cpu)] = CPU_ISSET(cpu, &set) ? '1' : '0';
  return cpus.substr(0, cpus.find_last_of('1') + 1);
}

}  // namespace

int ShmComm::cgroup_cpu_quota(const std::string& proc_cgroup, const std::string& root) {
  std::ifstream cgroup(proc_cgroup);
  std::string line, path;
  while (std::getline(cgroup, line)) {
    if (line.rfind("0::", 0) == 0) path = line.substr(3);
  }
  if (path.empty() || path[0] != '/') return 0;
  // A cgroup runs no faster than any of its ancestors allow: the smallest quota on the way up.
  int quota = 0;
  for (;;) {
    std::ifstream max(root + (path == "/" ? "" : path) + "/cpu.max");
    std::string limit;
    long long period = 0;
    if ((max >> limit >> period) && limit != "max" && period > 0) {
      const int cpus = int(std::max(1LL, (std::stoll(limit) + period - 1) / period));
      quota = quota ? std::min(quota, cpus) : cpus;
    }
    if (path == "/") return quota;
    path = path.substr(0, std::max<size_t>(path.find_last_of('/'), 1));
  }
}

// A spinning waiter holds a CPU the rank it waits for may need; so spin only where the host's
// ranks fit in the CPUs they may run on: the union of their affinities (each rank's own would say
// ranks pinned one per CPU share), and at most the smallest cgroup quota among them.
bool ShmComm::oversubscribed(const std::vector<std::string>& affinities, const std::vector<int>& quotas,
                             int hardware_cpus) {
  std::string all;
  for (const auto& cpus : affinities) {
    if (cpus.size() > all.size()) all.resize(cpus.size(), '0');
    for (size_t cpu = 0; cpu < cpus.size(); ++cpu) {
      if (cpus[cpu] == '1') all[cpu] = '1';
    }
  }
  int available = int(std::count(all.begin(), all.end(), '1'));
  if (available == 0) available = hardware_cpus;
  for (int quota : quotas) {
    if (quota > 0) available = std::min(available, quota);
  }
  return available < int(affinities.size());
}

namespace {

std::string encode(const Announcement& a) {
  std::ostringstream out;
  out << (a.ok ? "ok" : "no") << "\n" << a.identity << "\n" << a.pid << " " << a.fd << " " << a.token << "\n"
      << (a.cpus.empty() ? "-" : a.cpus) << " " << a.quota_cpus << " " << a.hardware_cpus << "\n" << a.reason;
  return out.str();
}

Announcement decode(const std::string& text) {
  std::istringstream in(text);
  Announcement a;
  std::string state;
  std::getline(in, state);
  a.ok = state == "ok";
  std::getline(in, a.identity);
  in >> a.pid >> a.fd >> a.token;
  in.ignore();
  std::string cpus_line;
  std::getline(in, cpus_line);
  std::istringstream cpus(cpus_line);
  cpus >> a.cpus >> a.quota_cpus >> a.hardware_cpus;
  if (a.cpus == "-") a.cpus.clear();  // unknown
  std::getline(in, a.reason);
  return a;
}

}  // namespace

std::unique_ptr<ShmComm> ShmComm::connect(c10d::Store& store, int rank, int size, std::string group_name,
                                          bool enabled, std::string* why) {
  static_assert(sizeof(Control) <= kControlBytes);
  // Every rank takes part in every round, even with shared memory off, so that all agree.
  Segment own;
  Announcement mine;
  mine.identity = host_identity();
  mine.pid = ::getpid();
  mine.token = std::random_device{}() | (uint64_t(std::random_device{}()) << 32);
  mine.reason = enabled ? "" : "off on rank " + std::to_string(rank) + " (CNCCL_SHM / Options.shm)";
  mine.cpus = affinity();
  mine.quota_cpus = cgroup_cpu_quota("/proc/self/cgroup", "/sys/fs/cgroup");
  mine.hardware_cpus = int(std::thread::hardware_concurrency());
  if (enabled) {
    try {
      own = Segment::create(kShmSegmentBytes);
      auto* control = new (own.data()) Control{};
      control->magic = kMagic;
      control->token = mine.token;
      mine.fd = own.fd();
      mine.ok = true;
    } catch (const std::exception& e) {
      mine.reason = "rank " + std::to_string(rank) + ": " + e.what();
    }
  }
  set(store, key("rank", rank), encode(mine));

  std::vector<Announcement> all(size);
  std::string trouble;
  for (int r = 0; r < size; ++r) {
    all[r] = r == rank ? mine : decode(get(store, key("rank", r)));
    if (!all[r].ok && trouble.empty()) trouble = all[r].reason;
  }
  // Hosts in the order of their lowest rank, each with its ranks in order.
  std::vector<std::vector<int>> hosts;
  std::map<std::string, size_t> host_of;
  for (int r = 0; r < size; ++r) {
    const auto [it, added] = host_of.emplace(all[r].identity, hosts.size());
    if (added) hosts.emplace_back();
    hosts[it->second].push_back(r);
  }
  const int host = int(host_of[mine.identity]);
  const std::vector<int>& local = hosts[host];
  if (trouble.empty() && hosts.size() > 1) {
    for (const auto& h : hosts) {
      if (h.size() == local.size() && local.size() > 1) continue;
      trouble = std::to_string(hosts.size()) + " hosts (or sets of namespaces) that do not each hold the same " +
                "number (> 1) of ranks";
      break;
    }
  }
  const int local_rank = int(std::find(local.begin(), local.end(), rank) - local.begin());
  std::vector<Segment> segments(local.size());
  std::vector<Liveness> peers(local.size());
  for (size_t i = 0; i < local.size() && trouble.empty(); ++i) {
    const int peer = local[i];
    if (peer == rank) continue;
    try {
      peers[i] = Liveness(all[peer].pid);
      segments[i] = Segment::open(peers[i], all[peer].fd, kShmSegmentBytes);
      const auto* control = reinterpret_cast<const Control*>(segments[i].data());
      if (control->magic != kMagic || control->token != all[peer].token) {
        trouble = "rank " + std::to_string(peer) + "'s segment does not hold what it announced";
      }
    } catch (const std::exception& e) {
      trouble = "rank " + std::to_string(rank) + " cannot map rank " + std::to_string(peer) + "'s segment: " + e.what();
    }
  }
  set(store, key("mapped", rank), trouble.empty() ? "ok" : trouble);
  for (int r = 0; r < size; ++r) {
    const std::string state = get(store, key("mapped", r));
    if (state != "ok" && trouble.empty()) trouble = state;
  }
  if (!trouble.empty()) {
    *why = trouble;
    return nullptr;
  }
  // Every rank has mapped every segment of its host (the round above): the memory now lives only
  // as long as its mappings, so no exit of any kind leaves it behind.
  own.close_fd();
  segments[local_rank] = std::move(own);
  // Decided from what every rank announced, so the host's ranks decide alike: the chunks of a
  // reduction depend on it (chunk_bytes), and ranks that cut them differently would mix up data.
  std::vector<std::string> affinities;
  std::vector<int> quotas;
  int hardware_cpus = INT_MAX;
  for (int r : local) {
    affinities.push_back(all[r].cpus);
    quotas.push_back(all[r].quota_cpus);
    hardware_cpus = std::min(hardware_cpus, std::max(1, all[r].hardware_cpus));
  }
  const bool shared = oversubscribed(affinities, quotas, hardware_cpus);
  const auto spin = shared ? std::chrono::microseconds(0) : kFirstSpin;
  return std::unique_ptr<ShmComm>(new ShmComm(local_rank, int(local.size()), std::move(group_name), std::move(segments),
                                              std::move(peers), std::move(hosts), host, spin));
}

ShmComm::ShmComm(int rank, int size, std::string group_name, std::vector<Segment> segments,
                 std::vector<Liveness> peers, std::vector<std::vector<int>> hosts, int host,
                 std::chrono::microseconds spin)
    : rank_(rank), size_(size), group_name_(std::move(group_name)), segments_(std::move(segments)),
      peers_(std::move(peers)), hosts_(std::move(hosts)), host_(host), spin_(spin) {
  kill_at_posted_step_ = fault_injection::kill_at(fault_injection::kShmStep, global_rank(rank));
}

std::chrono::microseconds ShmComm::spin_after(std::chrono::microseconds spin, std::chrono::nanoseconds wake_up) {
  // An average over the last few wake-ups (weight 1/8 each): one slow wake-up (a preempted
  // waiter) moves it little.
  const auto sample = std::chrono::duration_cast<std::chrono::microseconds>(wake_up);
  const auto averaged = spin + (sample - spin) / 8;
  return std::clamp(averaged, kMinSpin, kMaxSpin);
}

size_t ShmComm::piece_elements(int ranks, size_t elem, size_t bytes) {
  constexpr size_t kLine = 64;
  const size_t fits = std::min(bytes, kSlotBytes) / size_t(ranks) / elem;
  TORCH_CHECK(fits > 0, "cnccl: ", ranks, " ranks of ", elem, "-byte elements do not fit a shared-memory slot");
  return fits >= kLine ? fits / kLine * kLine : fits;
}

ShmComm::~ShmComm() = default;

ShmComm::Control& ShmComm::control(int rank) const {
  return *reinterpret_cast<Control*>(segments_[rank].data());
}

char* ShmComm::slot(int rank, uint64_t step) const {
  return segments_[rank].data() + kControlBytes + (step % kDepth) * 2 * kSlotBytes;
}

void ShmComm::begin(const char* op, uint64_t seq, std::chrono::milliseconds timeout, const std::string& signature) {
  op_ = op;
  seq_ = seq;
  timeout_ = timeout;
  deadline_ = Clock::now() + timeout;
  signature_ = fit_signature(std::string(op) + "(" + signature + ")", kSignatureBytes);
  signature_pending_ = true;
  signature_checked_ = false;
}

void ShmComm::agree() {
  const uint64_t step = acquire();
  post(kPosted, step);
  wait_all(kPosted, step);
  post(kReleased, step);
}

uint64_t ShmComm::acquire() {
  const uint64_t step = ++step_;
  if (step > kDepth) wait_all(kReleased, step - kDepth);
  return step;
}

void ShmComm::post(Counter counter, uint64_t step) {
  Control& own = control(rank_);
  if (counter == kPosted && signature_pending_) {
    auto& header = own.headers[step % kDepth];
    header.step = step;
    std::memset(header.text, 0, sizeof header.text);
    signature_.copy(header.text, sizeof header.text - 1);
    signature_pending_ = false;
  }
  own.counters[counter].value.store(step, std::memory_order_seq_cst);
  if (counter == kPosted) fault_injection::count(posted_steps_, kill_at_posted_step_);
  for (int peer = 0; peer < size_; ++peer) {
    if (peer != rank_ && control(peer).sleeping.value.load(std::memory_order_seq_cst)) {
      own.woke_ns[counter].value.store(uint64_t(Clock::now().time_since_epoch().count()),
                                       std::memory_order_relaxed);
      futex_wake(own.counters[counter].value);
      return;
    }
  }
}

void ShmComm::wait_all(Counter counter, uint64_t step) {
  for (int peer = 0; peer < size_; ++peer) {
    if (peer != rank_) wait_one(peer, counter, step);
  }
  if (counter == kPosted && !signature_checked_) compare_signatures(step);
}

void ShmComm::wait_one(int peer, Counter counter, uint64_t step) {
  const std::atomic<uint64_t>& theirs = control(peer).counters[counter].value;
  if (theirs.load(std::memory_order_acquire) >= step) return;
  const auto spin_until = Clock::now() + spin_;
  while (Clock::now() < spin_until) {
    for (int i = 0; i < 64; ++i) {
      cpu_relax();
      if (theirs.load(std::memory_order_acquire) >= step) return;
    }
    if (idle_) idle_->poll();
  }
  std::atomic<uint64_t>& sleeping = control(rank_).sleeping.value;
  for (;;) {
    if (aborted_.load()) {
      std::lock_guard<std::mutex> lock(abort_mutex_);
      fail(abort_reason_, -1);
    }
    // Any dead peer, not only the awaited one, since the awaited one may be waiting on it; but only
    // one that had not reached this point itself: what it posted before it died stays readable (the
    // segment lives as long as its mappings), so a peer that posted everything and left (a reduce's
    // non-root) fails nothing.
    for (int other = 0; other < size_; ++other) {
      if (other == rank_ || peers_[other].alive()) continue;
      if (control(other).counters[counter].value.load(std::memory_order_acquire) >= step) continue;
      fail("rank " + std::to_string(global_rank(other)) + " (pid " + std::to_string(peers_[other].pid()) +
               ") exited before it reached this step of the collective",
           other);
    }
    // A peer that failed a collective (publish_failure) posts nothing more, in it or after it: its
    // group is unusable. An earlier one counts too: a call can fail on some ranks only (a wire per
    // level's reduce_scatter has no step inside a host after its step across hosts). A later one does
    // not: that peer posted all of this collective before it moved on (a reduce's non-root leaves
    // while its root still waits on a slow owner), so this one can still finish; the next wait on it
    // fails.
    for (int other = 0; other < size_; ++other) {
      const uint64_t failed = control(other).failed.value.load(std::memory_order_acquire);
      if (other == rank_ || failed == 0 || failed > seq_ + 1) continue;
      fail("rank " + std::to_string(global_rank(other)) +
               (failed == seq_ + 1 ? std::string(" failed this collective: ")
                                   : " failed an earlier collective (seq " + std::to_string(failed - 1) + "): ") +
               peer_text(control(other).failure, kFailureBytes),
           other);
    }
    const auto now = Clock::now();
    if (now >= deadline_) {
      fail("timed out after " + std::to_string(timeout_.count()) + " ms waiting for rank " +
               std::to_string(global_rank(peer)) +
               " (it has not reached this collective, or is stuck in an earlier one)",
           peer);
    }
    if (idle_) {
      // Not marked sleeping: peers do not wake this rank, which looks again after one short sleep.
      idle_->poll();
      if (theirs.load(std::memory_order_acquire) >= step) return;
      idle_->sleep(std::chrono::duration_cast<std::chrono::microseconds>(
          std::min<Clock::duration>(kIdleSleep, deadline_ - now)));
      if (theirs.load(std::memory_order_acquire) >= step) return;
      continue;
    }
    sleeping.store(1, std::memory_order_seq_cst);
    const uint64_t seen = theirs.load(std::memory_order_seq_cst);
    const bool woken =
        seen < step && futex_wait(theirs, uint32_t(seen), std::min<Clock::duration>(kMaxFutexSleep, deadline_ - now));
    sleeping.store(0, std::memory_order_relaxed);
    if (theirs.load(std::memory_order_acquire) >= step) {
      // Woken by this peer's post: what the sleep cost past the post, the measure of how long to spin.
      const Clock::time_point woke{
          Clock::duration(control(peer).woke_ns[counter].value.load(std::memory_order_relaxed))};
      if (woken && spins() && woke > now) spin_ = spin_after(spin_, Clock::now() - woke);
      return;
    }
  }
}

void ShmComm::compare_signatures(uint64_t step) {
  signature_checked_ = true;
  for (int peer = 0; peer < size_; ++peer) {
    if (peer == rank_) continue;
    const auto& theirs = control(peer).headers[step % kDepth];
    const std::string text = peer_text(theirs.text, sizeof theirs.text);
    if (theirs.step == step && text == signature_) continue;
    fail("ranks disagree on this collective: rank " + std::to_string(global_rank(rank_)) + " called " + signature_ +
             ", rank " + std::to_string(global_rank(peer)) + " called " +
             (theirs.step == step ? text : "a different sequence of collectives"),
         peer);
  }
}

void ShmComm::abort(const std::string& why) {
  std::lock_guard<std::mutex> lock(abort_mutex_);
  if (aborted_.load()) return;
  abort_reason_ = why;
  aborted_.store(true);
}

void ShmComm::publish_failure(const std::string& what) {
  Control& mine = control(rank_);
  const size_t n = std::min(what.size(), kFailureBytes - 1);
  std::memcpy(mine.failure, what.data(), n);
  mine.failure[n] = '\0';
  mine.failed.value.store(seq_ + 1, std::memory_order_release);
}

void ShmComm::fail(const std::string& what, int peer) const {
  std::string msg = "cnccl: " + std::string(op_) + " (seq " + std::to_string(seq_) + ", group '" + group_name_ +
                    "', rank " + std::to_string(global_rank(rank_)) + ", shared memory): " + what;
  if (peer >= 0) msg += " [peer rank " + std::to_string(global_rank(peer)) + "]";
  C10_THROW_ERROR(DistBackendError, msg);
}

}  // namespace cnccl::host

// The shared-memory channel, reduction and copies (backend/host/shm/shm_comm.cpp, reduce_shm.cpp,
// copy_shm.cpp; allreduce_hierarchical.cpp needs two hosts: tests/python/test_shm.py): ranks are
// threads of one process, each with its own real memfd segment, mapped by the others through
// /proc/self/fd as separate processes would map them. Oracles are written here: integer sums, and
// for the 16-bit wire torch's own c10::Half / c10::BFloat16 conversions summed in fp32.
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <gtest/gtest.h>
#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <thread>

#include "backend/host/algorithms/algorithms.h"
#include "backend/host/shm/shm_algorithms.h"
#include "backend/host/shm/shm_comm.h"
#include "compress/codec.h"
#include "tests/cpp/host/values.h"

namespace cnccl::host::testing {
namespace {

using Body = std::function<void(ShmComm&)>;

// Runs `body` on `size` connected ranks; returns each rank's error ("" when none).
std::vector<std::string> on_shm_ranks(int size, const Body& body,
                                      const std::function<std::string(int)>& signature = {}) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::vector<std::string> errors(size);
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      try {
        std::string why;
        auto shm = ShmComm::connect(*store, r, size, "memory", /*enabled=*/true, &why);
        if (!shm) throw std::runtime_error("no shared memory: " + why);
        shm->begin("test", 0, std::chrono::seconds(30), signature ? signature(r) : "same");
        body(*shm);
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  return errors;
}

void expect_no_errors(const std::vector<std::string>& errors) {
  for (size_t r = 0; r < errors.size(); ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
}

// Counts that exercise the one-shot form, zero-length parts, uneven parts and many chunks.
const std::vector<size_t> kCounts{0, 1, 7, 1000, 1001, 40000, (size_t(1) << 19) + 3};

ChunkedReduction int32_sum(const std::vector<int32_t>& mine, int32_t* out, size_t count, int size,
                       ChunkedReduction::Deliver deliver, int root = 0) {
  return {Parts::even(count, size), 4,
          [&mine](size_t offset, size_t n, char* dst) { std::memcpy(dst, mine.data() + offset, n * 4); },
          [size](const char* const* in, char* dst, size_t /*first*/, size_t n) {
            std::memcpy(dst, in[0], n * 4);
            for (int q = 1; q < size; ++q) add_int32(dst, in[q], n);
          },
          reinterpret_cast<char*>(out), deliver, root};
}

TEST(Shm, AllreduceSumsEverywhere) {
  for (int size : {1, 2, 3, 4, 5}) {
    for (size_t count : kCounts) {
      std::vector<std::vector<int32_t>> out(size, std::vector<int32_t>(count, 12345));
      expect_no_errors(on_shm_ranks(size, [&](ShmComm& shm) {
        const auto mine = contribution(shm.rank(), count);
        reduce_shm(shm, int32_sum(mine, out[shm.rank()].data(), count, size, ChunkedReduction::kAll));
      }));
      for (int r = 0; r < size; ++r) {
        for (size_t i = 0; i < count; ++i) {
          ASSERT_EQ(out[r][i], sum_over_ranks(size, i)) << "size " << size << " count " << count << " rank " << r;
        }
      }
    }
  }
}

TEST(Shm, ReduceScatterDeliversEachRankItsOwnPartAlone) {
  for (int size : {2, 3, 5}) {
    for (size_t count : kCounts) {
      const Parts parts = Parts::even(count, size);
      std::vector<std::vector<int32_t>> out(size, std::vector<int32_t>(count, 12345));
      expect_no_errors(on_shm_ranks(size, [&](ShmComm& shm) {
        const auto mine = contribution(shm.rank(), count);
        reduce_shm(shm, int32_sum(mine, out[shm.rank()].data(), count, size, ChunkedReduction::kOwn));
      }));
      // The own part lands from out[0]; nothing past it is written.
      for (int r = 0; r < size; ++r) {
        for (size_t j = 0; j < count; ++j) {
          const bool own = j < parts.length[r];
          ASSERT_EQ(out[r][j], own ? sum_over_ranks(size, parts.offset[r] + j) : 12345)
              << "size " << size << " rank " << r << " j " << j;
        }
      }
    }
  }
}

TEST(Shm, ReduceDeliversToTheRootOnly) {
  const int size = 3, root = 1;
  for (size_t count : kCounts) {
    std::vector<std::vector<int32_t>> out(size, std::vector<int32_t>(count, 12345));
    expect_no_errors(on_shm_ranks(size, [&](ShmComm& shm) {
      const auto mine = contribution(shm.rank(), count);
      reduce_shm(shm, int32_sum(mine, out[shm.rank()].data(), count, size, ChunkedReduction::kRoot, root));
    }));
    for (int r = 0; r < size; ++r) {
      for (size_t i = 0; i < count; ++i) ASSERT_EQ(out[r][i], r == root ? sum_over_ranks(size, i) : 12345);
    }
  }
}

template <typename Sixteen>
void check_wire_sum_is_fp32_in_rank_order_rounded_once(compress::Wire wire) {
  for (int size : {2, 3, 4}) {
    for (size_t count : {size_t(9), size_t(300001)}) {
      // Large values of both signs beside small ones: fp32 sums of these depend on the order of
      // the adds, so only rank order gives the oracle's bits.
      auto value = [](int rank, size_t i) {
        static const float kTable[4] = {30000.0f, 3e-3f, -30000.0f, 0.75f};
        return kTable[(i + size_t(rank)) % 4] * (1.0f + float(i % 5) * 0.01f);
      };
      std::vector<std::vector<uint16_t>> out(size, std::vector<uint16_t>(count));
      expect_no_errors(on_shm_ranks(size, [&](ShmComm& shm) {
        std::vector<float> mine(count);
        for (size_t i = 0; i < count; ++i) mine[i] = value(shm.rank(), i);
        ChunkedReduction r{Parts::even(count, size), 2,
                       [&](size_t offset, size_t n, char* dst) {
                         compress::cast(mine.data() + offset, reinterpret_cast<uint16_t*>(dst), n, 1.0f, wire);
                       },
                       [&](const char* const* in, char* dst, size_t /*first*/, size_t n) {
                         compress::sum(reinterpret_cast<const uint16_t* const*>(in), size,
                                       reinterpret_cast<uint16_t*>(dst), n, wire);
                       },
                       reinterpret_cast<char*>(out[shm.rank()].data()), ChunkedReduction::kAll};
        reduce_shm(shm, r);
      }));
      for (size_t i = 0; i < count; ++i) {
        float acc = float(Sixteen(value(0, i)));
        for (int q = 1; q < size; ++q) acc += float(Sixteen(value(q, i)));
        const Sixteen want(acc);
        for (int r = 0; r < size; ++r) ASSERT_EQ(out[r][i], want.x) << "size " << size << " i " << i << " rank " << r;
      }
    }
  }
}

TEST(Shm, Fp16WireSumsInFp32InRankOrderAndRoundsOnce) {
  check_wire_sum_is_fp32_in_rank_order_rounded_once<c10::Half>(compress::Wire::kFp16);
}

TEST(Shm, Bf16WireSumsInFp32InRankOrderAndRoundsOnce) {
  check_wire_sum_is_fp32_in_rank_order_rounded_once<c10::BFloat16>(compress::Wire::kBf16);
}

TEST(Shm, AllgatherFillsEveryPartEverywhere) {
  for (int size : {1, 2, 3, 5}) {
    for (size_t count : kCounts) {
      const Parts parts = Parts::even(count, size);
      std::vector<std::vector<int32_t>> data(size, std::vector<int32_t>(count, -1));
      expect_no_errors(on_shm_ranks(size, [&](ShmComm& shm) {
        auto& mine = data[shm.rank()];
        for (size_t i = parts.offset[shm.rank()]; i < parts.offset[shm.rank()] + parts.length[shm.rank()]; ++i) {
          mine[i] = value(shm.rank(), i);
        }
        allgather_shm(shm, reinterpret_cast<char*>(mine.data()), parts, 4);
      }));
      for (int r = 0; r < size; ++r) {
        for (int p = 0; p < size; ++p) {
          for (size_t i = parts.offset[p]; i < parts.offset[p] + parts.length[p]; ++i) {
            ASSERT_EQ(data[r][i], value(p, i)) << "size " << size << " count " << count << " rank " << r;
          }
        }
      }
    }
  }
}

// With a producer and a consumer nothing is read from or written to data: the owner writes its piece
// into its slot, and every part's pieces, the rank's own too, go to the consumer once each, in order.
TEST(Shm, AllgatherWithAProducerAndAConsumerHandsOverEveryPieceOnce) {
  for (int size : {1, 2, 3, 5}) {
    for (size_t count : kCounts) {
      const Parts parts = Parts::even(count, size);
      std::vector<std::vector<int32_t>> out(size, std::vector<int32_t>(count, -1));
      std::vector<std::string> problems(size);
      expect_no_errors(on_shm_ranks(size, [&](ShmComm& shm) {
        const int r = shm.rank();
        std::vector<size_t> next(size_t(size), 0);
        allgather_shm(
            shm, nullptr, parts, 4,
            [&](size_t first, size_t n, char* dst) {
              for (size_t j = 0; j < n; ++j) reinterpret_cast<int32_t*>(dst)[j] = value(r, first + j);
            },
            [&](size_t first, size_t n, const char* piece) {
              int q = 0;
              while (q + 1 < size && first >= parts.offset[q + 1]) ++q;
              if (first != parts.offset[q] + next[q]) problems[r] = "a part's pieces came out of order or twice";
              next[q] += n;
              std::memcpy(out[r].data() + first, piece, n * 4);
            });
        for (int q = 0; q < size; ++q) {
          if (next[q] != parts.length[q]) problems[r] = "part " + std::to_string(q) + " was not handed over whole";
        }
      }));
      for (int r = 0; r < size; ++r) {
        EXPECT_EQ(problems[r], "") << "size " << size << " count " << count << " rank " << r;
        for (int p = 0; p < size; ++p) {
          for (size_t i = parts.offset[p]; i < parts.offset[p] + parts.length[p]; ++i) {
            ASSERT_EQ(out[r][i], value(p, i)) << "size " << size << " count " << count << " rank " << r;
          }
        }
      }
    }
  }
}

TEST(Shm, BroadcastCopiesTheRootsBytesEverywhere) {
  const int size = 3, root = 2;
  for (size_t count : kCounts) {
    std::vector<std::vector<int32_t>> data(size);
    expect_no_errors(on_shm_ranks(size, [&](ShmComm& shm) {
      auto& mine = data[shm.rank()] = shm.rank() == root ? contribution(root, count) : std::vector<int32_t>(count, -1);
      broadcast_shm(shm, reinterpret_cast<char*>(mine.data()), count * 4, root);
    }));
    for (int r = 0; r < size; ++r) EXPECT_EQ(data[r], contribution(root, count)) << "rank " << r << " count " << count;
  }
}

TEST(Shm, DisagreeingSignaturesFailEveryRankBeforeAnyDataIsRead) {
  const int size = 3;
  // The buffers reduce_shm writes into outlive its throw, so the test sees what it wrote.
  std::vector<std::vector<int32_t>> results(size);
  // Rank 2 reduces a different count: its signature differs, and so would its number of chunks.
  const auto errors = on_shm_ranks(
      size,
      [&](ShmComm& shm) {
        const size_t count = shm.rank() == 2 ? 300000 : 1000;
        auto& result = results[shm.rank()];
        result.assign(count, 7);
        const auto mine = contribution(shm.rank(), count);
        reduce_shm(shm, int32_sum(mine, result.data(), count, size, ChunkedReduction::kAll));
      },
      [](int r) { return r == 2 ? "count=300000" : "count=1000"; });
  for (int r = 0; r < size; ++r) {
    EXPECT_NE(errors[r].find("ranks disagree on this collective"), std::string::npos)
        << "rank " << r << ": " << errors[r];
    EXPECT_EQ(results[r], std::vector<int32_t>(results[r].size(), 7)) << "rank " << r;
  }
}

// Every rank's piece of a chunk within its share of the slot, for any number of local ranks and any
// element size (a floor of one cache line a piece overflowed the slot past 8192 ranks x bytes).
TEST(Shm, PiecesOfAChunkFitTheSlot) {
  for (size_t bytes : {ShmComm::kSlotBytes, ShmComm::kSpinningChunkBytes}) {
    for (int ranks = 1; ranks <= 8192; ranks += ranks < 16 ? 1 : 61) {
      for (size_t elem : {1, 2, 4, 8, 16}) {
        const size_t piece = ShmComm::piece_elements(ranks, elem, bytes);
        EXPECT_GT(piece, 0u) << ranks << " x " << elem;
        EXPECT_LE(piece * elem * size_t(ranks), bytes) << ranks << " x " << elem;
        if (bytes / size_t(ranks) / elem >= 64) EXPECT_EQ(piece % 64, 0u) << ranks << " x " << elem;
      }
    }
  }
}

// The trust model (docs/design.md, "Shared memory"): once created, no other descriptor of a segment,
// even a read-write one opened through /proc as any process of the same user could, can resize it
// (which would give every mapping rank a SIGBUS) or write it.
TEST(ShmSegment, NoOneButItsOwnerCanResizeOrWriteIt) {
  const Segment own = Segment::create(1 << 20);
  const std::string path = "/proc/self/fd/" + std::to_string(own.fd());
  const int rw = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  ASSERT_GE(rw, 0) << path;
  EXPECT_NE(::ftruncate(rw, 4096), 0) << "shrunk";
  EXPECT_NE(::ftruncate(rw, 2 << 20), 0) << "grown";
  EXPECT_EQ(::mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, rw, 0), MAP_FAILED) << "mapped writable";
  EXPECT_LT(::pwrite(rw, "x", 1, 0), 0) << "written";
  ::close(rw);
  own.data()[0] = 'y';  // the owner's own mapping stays writable
  const Segment peer = Segment::open(Liveness(::getpid()), own.fd(), 1 << 20);
  EXPECT_EQ(peer.data()[0], 'y');
}

// A peer maps only what cnccl announced: a sealed cnccl memfd of the announced size.
TEST(ShmSegment, OpeningRefusesAnUnsealedFileAnotherFileOrAnotherSize) {
  const Liveness self(::getpid());
  const int unsealed = ::memfd_create("cnccl", MFD_CLOEXEC);
  ASSERT_EQ(::ftruncate(unsealed, 1 << 20), 0);
  const int other = ::open("/proc/self/exe", O_RDONLY | O_CLOEXEC);
  const Segment own = Segment::create(1 << 20);
  auto refusal = [&](int fd, size_t bytes) {
    try {
      Segment::open(self, fd, bytes);
    } catch (const std::runtime_error& e) {
      return std::string(e.what());
    }
    return std::string("mapped");
  };
  EXPECT_NE(refusal(unsealed, 1 << 20).find("not sealed"), std::string::npos) << refusal(unsealed, 1 << 20);
  EXPECT_NE(refusal(other, 1 << 20).find("not a cnccl memfd"), std::string::npos) << refusal(other, 1 << 20);
  EXPECT_NE(refusal(own.fd(), 2 << 20).find("not the segment announced"), std::string::npos);
  ::close(unsealed);
  ::close(other);
}

// What a rank posted stays readable after it exits (its segment lives as long as the mappings), so a
// peer that had posted everything a step needs and left, as a reduce's non-root does, fails nothing;
// a peer that exits before posting still fails the wait at once. Ranks are processes here (a death
// is seen through a pidfd); rank 1 posts its result late, so rank 0 is waiting when rank 2 is gone.
TEST(Shm, APeerThatExitedAfterPostingEverythingFailsNothing) {
  char path[] = "/tmp/cnccl-test-store-XXXXXX";
  const int fd = ::mkstemp(path);
  ASSERT_GE(fd, 0);
  ::close(fd);
  ::unlink(path);
  auto rank_main = [&](int r) -> int {
    auto store = c10::make_intrusive<c10d::FileStore>(path, 3);
    std::string why;
    auto shm = ShmComm::connect(*store, r, 3, "processes", true, &why);
    if (!shm) return 10;
    try {
      shm->begin("reduce", 0, std::chrono::seconds(20), "same");
      const uint64_t step = shm->acquire();
      shm->post(ShmComm::kPosted, step);
      shm->wait_all(ShmComm::kPosted, step);
      if (r == 1) std::this_thread::sleep_for(std::chrono::milliseconds(500));
      shm->post(ShmComm::kReduced, step);
      shm->post(ShmComm::kReleased, step);
      if (r == 2) return 0;  // a non-root leaves once it has posted
      if (r == 1) {  // stays until rank 0 is done, so that only rank 2 is gone
        store->wait({"done"});
        return 0;
      }
      shm->wait_all(ShmComm::kReduced, step);  // rank 2 exited by now, rank 1 has yet to post
      // The next step needs rank 2, which is gone without posting it: that fails, at once.
      const auto start = std::chrono::steady_clock::now();
      int code = 20;
      try {
        shm->post(ShmComm::kPosted, shm->acquire());
        shm->wait_all(ShmComm::kPosted, step + 1);
      } catch (const c10::DistBackendError& e) {
        const bool named = std::string(e.what()).find("rank 2 (pid") != std::string::npos;
        code = named && std::chrono::steady_clock::now() - start < std::chrono::seconds(5) ? 0 : 21;
      }
      store->set("done", std::vector<uint8_t>{1});
      return code;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "rank %d: %s\n", r, e.what());
      return 30;
    }
  };
  std::vector<pid_t> children;
  for (int r = 0; r < 3; ++r) {
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) ::_exit(rank_main(r));
    children.push_back(pid);
  }
  for (int r = 0; r < 3; ++r) {
    int status = 0;
    ASSERT_EQ(::waitpid(children[r], &status, 0), children[r]);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
        << "rank " << r << ": status " << status << " (20: no error, 21: wrong or late error, 30: a wait failed)";
  }
  ::unlink(path);
}

// Rank 0's error when it waits on rank 1 in collective `seq` with `timeout`, rank 1 having only done
// `other` (its last collective's number, and what it did in it) and stayed connected.
std::string error_waiting_on(const std::function<void(ShmComm&)>& other, uint64_t seq,
                             std::chrono::milliseconds timeout) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::string error;
  std::atomic<bool> ready{false}, done{false};
  std::thread peer([&] {
    std::string why;
    auto shm = ShmComm::connect(*store, 1, 2, "memory", true, &why);
    other(*shm);
    ready = true;
    while (!done) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  });
  std::string why;
  auto shm = ShmComm::connect(*store, 0, 2, "memory", true, &why);
  while (!ready) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  try {
    shm->begin("test", seq, timeout, "same");
    shm->agree();
  } catch (const std::exception& e) {
    error = e.what();
  }
  done = true;
  peer.join();
  return error;
}

TEST(Shm, ARankThatNeverArrivesFailsTheOthersAtTheirDeadline) {
  const std::string error = error_waiting_on([](ShmComm&) {}, 0, std::chrono::milliseconds(200));
  EXPECT_NE(error.find("timed out after 200 ms waiting for rank 1"), std::string::npos) << error;
}

// A rank that failed a collective never posts again: a peer that finished that one and waits on it in
// the next fails at once, naming the failure, instead of timing out at its deadline (30 s here).
TEST(Shm, APeerThatFailedAnEarlierCollectiveFailsTheNextAtOnce) {
  const std::string error = error_waiting_on(
      [](ShmComm& shm) {
        shm.begin("test", 7, std::chrono::seconds(30), "same");
        shm.publish_failure("its peer across hosts died");
      },
      8, std::chrono::seconds(30));
  EXPECT_NE(error.find("rank 1 failed an earlier collective (seq 7): its peer across hosts died"), std::string::npos)
      << error;
}

// A one-host reduce() at 3 ranks: the root (0) waits on a slow owner (1) while a non-root (2), which
// posted all of this collective and left, fails the next one. That failure is not this collective's:
// the root finishes when the slow owner posts, and does not call seq 8 "an earlier collective".
TEST(Shm, APeerThatFailedALaterCollectiveLeavesThisOneToFinish) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::vector<std::string> errors(3);
  std::atomic<bool> failed_later{false};
  std::vector<std::thread> threads;
  for (int r = 0; r < 3; ++r) {
    threads.emplace_back([&, r] {
      try {
        std::string why;
        auto shm = ShmComm::connect(*store, r, 3, "memory", true, &why);
        if (!shm) throw std::runtime_error("no shared memory: " + why);
        shm->begin("reduce", 7, std::chrono::seconds(30), "same");
        const uint64_t step = shm->acquire();
        if (r == 1) {
          while (!failed_later) std::this_thread::sleep_for(std::chrono::milliseconds(5));
          std::this_thread::sleep_for(std::chrono::milliseconds(50));  // the root sleeps on it meanwhile
        }
        shm->post(ShmComm::kPosted, step);
        if (r == 2) {
          shm->begin("allreduce", 8, std::chrono::seconds(30), "same");
          shm->publish_failure("its peer across hosts died");
          failed_later = true;
          return;
        }
        if (r == 0) shm->wait_all(ShmComm::kPosted, step);
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  expect_no_errors(errors);
}

// A wire per level waits inside a host while its messages across hosts are in flight: the idle hook
// progresses them (backend/host/reductions/level_reductions.cpp). It runs while the wait idles, sleeps in place of
// the futex (the peer's post does not wake this rank), and the wait still ends at the post.
TEST(Shm, AWaitRunsItsIdleHookAndEndsAtThePost) {
  std::atomic<int> polls{0}, sleeps{0};
  const auto started = std::chrono::steady_clock::now();
  std::chrono::steady_clock::duration waited{};
  expect_no_errors(on_shm_ranks(2, [&](ShmComm& shm) {
    if (shm.rank() == 1) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      return shm.agree();
    }
    const ShmComm::Idle idle{[&] { ++polls; },
                             [&](std::chrono::microseconds limit) {
                               ++sleeps;
                               EXPECT_LE(limit, ShmComm::kIdleSleep);
                               std::this_thread::sleep_for(limit);
                             }};
    const ShmComm::IdleScope scope(shm, idle);
    shm.agree();
    waited = std::chrono::steady_clock::now() - started;
  }));
  EXPECT_GE(waited, std::chrono::milliseconds(100));
  EXPECT_GT(polls.load(), 0);
  // Short sleeps, again and again: 100 ms of them, where the futex would sleep 1 ms at a time unseen.
  EXPECT_GT(sleeps.load(), 10);
}

// A peer's failure still ends a wait that idles, at once rather than at the deadline (30 s here).
TEST(Shm, AWaitThatIdlesFailsAtOnceWhenAPeerFails) {
  const auto started = std::chrono::steady_clock::now();
  const auto errors = on_shm_ranks(2, [&](ShmComm& shm) {
    if (shm.rank() == 1) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      return shm.publish_failure("its peer across hosts died");
    }
    const ShmComm::Idle idle{[] {}, [](std::chrono::microseconds limit) { std::this_thread::sleep_for(limit); }};
    const ShmComm::IdleScope scope(shm, idle);
    shm.agree();
  });
  EXPECT_NE(errors[0].find("rank 1 failed this collective: its peer across hosts died"), std::string::npos)
      << errors[0];
  EXPECT_LT(std::chrono::steady_clock::now() - started, std::chrono::seconds(10));
}

TEST(Shm, AbortWakesAWaitingRank) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::string error;
  std::unique_ptr<ShmComm> waiting;
  std::thread other([&] {
    std::string why;
    auto shm = ShmComm::connect(*store, 1, 2, "memory", true, &why);
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
  });
  std::string why;
  waiting = ShmComm::connect(*store, 0, 2, "memory", true, &why);
  std::thread aborter([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    waiting->abort("abort() was called on the process group");
  });
  try {
    waiting->begin("test", 0, std::chrono::seconds(30), "same");
    waiting->agree();
  } catch (const std::exception& e) {
    error = e.what();
  }
  aborter.join();
  other.join();
  EXPECT_NE(error.find("abort() was called"), std::string::npos) << error;
}

TEST(Shm, OneRankWithSharedMemoryOffTurnsItOffForAll) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::vector<std::string> why(3);
  std::vector<char> connected(3);  // not vector<bool>: its elements share words, which threads would race on
  std::vector<std::thread> threads;
  for (int r = 0; r < 3; ++r) {
    threads.emplace_back([&, r] {
      connected[r] = ShmComm::connect(*store, r, 3, "memory", /*enabled=*/r != 1, &why[r]) != nullptr;
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < 3; ++r) {
    EXPECT_FALSE(connected[r]) << "rank " << r;
    EXPECT_NE(why[r].find("off on rank 1"), std::string::npos) << "rank " << r << ": " << why[r];
  }
}

// Connects two ranks (threads: sched_getaffinity reads the calling thread's affinity, as it reads a
// process's main thread) pinned to `cpu_of(rank)`; returns whether each one's waiters spin.
std::vector<bool> spins_when_pinned(const std::function<int(int)>& cpu_of) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::vector<int> spins(2, -1);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      cpu_set_t set;
      CPU_ZERO(&set);
      CPU_SET(cpu_of(r), &set);
      if (::pthread_setaffinity_np(::pthread_self(), sizeof set, &set) != 0) return;
      std::string why;
      auto shm = ShmComm::connect(*store, r, 2, "memory", true, &why);
      if (shm) spins[r] = shm->spins();
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(spins[0], spins[1]) << "the ranks decided differently (-1: not connected)";
  return {spins[0] == 1, spins[1] == 1};
}

std::vector<int> allowed_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  EXPECT_EQ(::sched_getaffinity(0, sizeof set, &set), 0);
  std::vector<int> cpus;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (CPU_ISSET(cpu, &set)) cpus.push_back(cpu);
  }
  return cpus;
}

TEST(ShmSpin, RanksPinnedToOneCpuNeverSpinAndRanksPinnedOnePerCpuDo) {
  const auto cpus = allowed_cpus();
  EXPECT_EQ(spins_when_pinned([&](int) { return cpus[0]; }), std::vector<bool>({false, false}));
  if (cpus.size() < 2) GTEST_SKIP() << "one CPU: no two ranks can each have their own";
  // Each rank alone sees one CPU; only the union of the two says they do not share.
  if (ShmComm::cgroup_cpu_quota("/proc/self/cgroup", "/sys/fs/cgroup") == 1) GTEST_SKIP() << "a 1-CPU cgroup quota";
  EXPECT_EQ(spins_when_pinned([&](int r) { return cpus[size_t(r)]; }), std::vector<bool>({true, true}));
}

TEST(ShmSpin, TheBudgetFollowsMeasuredWakeUpsWithinItsBounds) {
  using std::chrono::microseconds;
  auto after = [](microseconds spin, microseconds wake_up, int times) {
    for (int i = 0; i < times; ++i) spin = ShmComm::spin_after(spin, wake_up);
    return spin;
  };
  // Wake-ups of 40 us bring 200 us of spinning down to about 40; of 500 us, up to about 500.
  EXPECT_NEAR(after(microseconds(200), microseconds(40), 60).count(), 40, 8);  // in whole-microsecond steps
  EXPECT_NEAR(after(microseconds(200), microseconds(400), 60).count(), 400, 8);
  // One slow wake-up (a preempted waiter) moves it by an eighth of the difference.
  EXPECT_EQ(ShmComm::spin_after(microseconds(100), microseconds(900)).count(), 200);
  // Never outside the bounds, whatever was measured.
  EXPECT_EQ(after(microseconds(200), microseconds(0), 100), ShmComm::kMinSpin);
  EXPECT_EQ(after(microseconds(200), microseconds(1'000'000), 100), ShmComm::kMaxSpin);
}

TEST(ShmSpin, OversubscribedCountsTheUnionOfAffinitiesCappedByTheSmallestQuota) {
  EXPECT_FALSE(ShmComm::oversubscribed({"10", "01"}, {0, 0}, 64));
  EXPECT_TRUE(ShmComm::oversubscribed({"10", "10"}, {0, 0}, 64));
  EXPECT_TRUE(ShmComm::oversubscribed({"1111", "1111"}, {4, 1}, 64));
  EXPECT_FALSE(ShmComm::oversubscribed({"1111", "1111"}, {0, 2}, 64));
  EXPECT_TRUE(ShmComm::oversubscribed({"", ""}, {0, 0}, 1));  // affinity unknown: the machine's CPUs
  EXPECT_FALSE(ShmComm::oversubscribed({"", ""}, {0, 0}, 2));
}

TEST(ShmSpin, CgroupQuotaIsTheSmallestOfTheCgroupAndItsAncestorsRoundedUp) {
  char dir[] = "/tmp/cnccl-cgroup-XXXXXX";
  ASSERT_NE(::mkdtemp(dir), nullptr);
  const std::string root = dir;
  auto write = [](const std::string& path, const std::string& text) {
    FILE* f = std::fopen(path.c_str(), "w");
    ASSERT_NE(f, nullptr) << path;
    std::fputs(text.c_str(), f);
    std::fclose(f);
  };
  ASSERT_EQ(::mkdir((root + "/job").c_str(), 0700), 0);
  ASSERT_EQ(::mkdir((root + "/job/rank").c_str(), 0700), 0);
  write(root + "/self", "0::/job/rank\n");
  write(root + "/cpu.max", "max 100000\n");
  write(root + "/job/rank/cpu.max", "max 100000\n");
  EXPECT_EQ(ShmComm::cgroup_cpu_quota(root + "/self", root), 0);
  write(root + "/job/cpu.max", "150000 100000\n");  // 1.5 CPUs for the job: 2 whole ones
  EXPECT_EQ(ShmComm::cgroup_cpu_quota(root + "/self", root), 2);
  write(root + "/job/rank/cpu.max", "50000 100000\n");
  EXPECT_EQ(ShmComm::cgroup_cpu_quota(root + "/self", root), 1);
  write(root + "/self", "0::/\n");
  EXPECT_EQ(ShmComm::cgroup_cpu_quota(root + "/self", root), 0);
  write(root + "/cpu.max", "300000 100000\n");
  EXPECT_EQ(ShmComm::cgroup_cpu_quota(root + "/self", root), 3);
  EXPECT_EQ(ShmComm::cgroup_cpu_quota(root + "/absent", root), 0);
  for (const char* f : {"/job/rank/cpu.max", "/job/cpu.max", "/cpu.max", "/self"}) std::remove((root + f).c_str());
  ::rmdir((root + "/job/rank").c_str());
  ::rmdir((root + "/job").c_str());
  ::rmdir(dir);
}

}  // namespace
}  // namespace cnccl::host::testing

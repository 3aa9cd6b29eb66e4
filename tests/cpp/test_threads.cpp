// A group's threads, in one process: each rank is a thread with its own group over one HashStore,
// on each CPU engine: the host path over UCX alone (CNCCL_SHM=off) and through shared memory (its
// executor thread, UCX worker), and the composed path (cpu_engine=gloo: the issuer thread, its
// completion threads) over a double of ProcessGroupGloo's threading (gloo_double.h). Collectives are
// issued by the rank's thread and waited on by another, many in flight; a future's callback runs
// collectives of its own; abort() comes from a third thread; groups are destroyed with messages in
// flight and from a callback. Built and run under ThreadSanitizer and AddressSanitizer by
// .ci/sanitize.sh.
#include <gtest/gtest.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <atomic>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

#include "backend/process_group.h"
#include "tests/cpp/gloo_double.h"

namespace {

using Group = c10::intrusive_ptr<cnccl::ProcessGroupCNCCL>;

// The groups' CPU engine: "ucx" (shared memory off), "shm" (on, and required) or "gloo".
class Threads : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (GetParam() != "gloo" && !cnccl::ProcessGroupCNCCL::host_path_built()) {
      GTEST_SKIP() << "this build has no UCX (CNCCL_WITH_UCX=OFF), so no host path";
    }
  }
  template <typename Fn>
  void on_ranks(int world, Fn fn) {
    auto store = c10::make_intrusive<c10d::HashStore>();
    auto fabric = std::make_shared<cnccl::testing::Fabric>(world);
    std::vector<std::thread> ranks;
    std::vector<std::string> errors(world);
    for (int r = 0; r < world; ++r) {
      ranks.emplace_back([&, r] {
        try {
          auto options = c10::make_intrusive<cnccl::Options>(std::chrono::seconds(60));
          options->min_bytes = 0;
          c10::intrusive_ptr<c10d::Backend> gloo;
          if (GetParam() == "gloo") {
            gloo = c10::make_intrusive<cnccl::testing::GlooDouble>(fabric, r);
            options->cpu_engine = "gloo";
          } else {
            options->shm = GetParam() == "ucx" ? "off" : "on";
          }
          fn(r, c10::make_intrusive<cnccl::ProcessGroupCNCCL>(store, r, world, options, std::move(gloo)));
        } catch (const std::exception& e) {
          errors[r] = e.what();
        }
      });
    }
    for (auto& t : ranks) t.join();
    for (int r = 0; r < world; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
  }
};

TEST_P(Threads, ManyCollectivesInFlightWaitedFromAnotherThread) {
  constexpr int kWorld = 3, kOps = 200;
  on_ranks(kWorld, [](int rank, Group pg) {
    std::mutex mutex;
    std::deque<std::pair<c10::intrusive_ptr<c10d::Work>, std::vector<at::Tensor>>> queue;
    std::atomic<int> wrong{0};
    std::thread waiter([&] {
      for (int done = 0; done < kOps;) {
        std::unique_lock<std::mutex> lock(mutex);
        if (queue.empty()) {
          lock.unlock();
          std::this_thread::yield();
          continue;
        }
        auto [work, tensors] = queue.front();
        queue.pop_front();
        lock.unlock();
        work->wait();
        const double want = kWorld * (kWorld - 1) / 2.0 + kWorld * (done % 7);
        if (!at::equal(tensors[0], at::full_like(tensors[0], want))) ++wrong;
        ++done;
      }
    });
    for (int i = 0; i < kOps; ++i) {
      std::vector<at::Tensor> tensors{at::full({int64_t(1) << (8 + i % 10)}, float(rank + i % 7))};
      auto work = pg->allreduce(tensors);
      std::lock_guard<std::mutex> lock(mutex);
      queue.emplace_back(work, tensors);
    }
    waiter.join();
    EXPECT_EQ(wrong.load(), 0) << "rank " << rank;
    pg->barrier()->wait();
  });
}

TEST_P(Threads, FutureCallbackRunsACollectiveAndWaitsForIt) {
  // PowerSGD's pattern, nested twice: each callback allreduces on the same group and waits.
  constexpr int kWorld = 2;
  // Rank 1 starts its first allreduce only once rank 0 has attached its callback, so rank 0's
  // work cannot have completed by then: the callback runs later, on cnccl's executor thread.
  std::atomic<bool> attached{false};
  std::atomic<bool> completed_before_attach{false};
  on_ranks(kWorld, [&](int rank, Group pg) {
    std::vector<at::Tensor> first{at::full({4096}, float(rank + 1))};
    if (rank == 1) {
      while (!attached.load()) std::this_thread::yield();
    }
    auto nested = [pg](float value) {
      std::vector<at::Tensor> t{at::full({4096}, value)};
      pg->allreduce(t)->getFuture()->wait();
      EXPECT_TRUE(at::equal(t[0], at::full_like(t[0], value * kWorld)));
      return t[0][0].item<float>();
    };
    auto future = pg->allreduce(first)->getFuture();
    auto chained = future->then(
        [&, nested](c10::ivalue::Future&) {
          const float inner = nested(nested(1.0f));
          return c10::IValue(first[0][0].item<float>() + inner);
        },
        c10::FloatType::get());
    if (rank == 0) {
      completed_before_attach = future->completed();
      attached = true;
    }
    chained->wait();
    EXPECT_EQ(chained->value().toDouble(), 3.0 + kWorld * kWorld) << "rank " << rank;
    EXPECT_TRUE(at::equal(first[0], at::full_like(first[0], 3.0))) << "rank " << rank;
    pg->barrier()->wait();
  });
  EXPECT_FALSE(completed_before_attach.load()) << "rank 0's work completed before its callback was attached";
}

TEST_P(Threads, TheLastReferenceDroppedInACallbackShutsTheGroupDownOnItsOwnThread) {
  // The group's executor thread runs the callback, and then destroys the callback and with it
  // the group: it must stop its executor without joining itself (that aborted the process).
  std::atomic<bool> attached{false};
  auto ran = std::make_shared<std::atomic<bool>>(false);
  on_ranks(2, [&](int rank, Group pg) {
    std::vector<at::Tensor> t{at::ones({1024})};
    if (rank == 1) {
      while (!attached.load()) std::this_thread::yield();
      pg->allreduce(t)->wait();
      return;
    }
    auto future = pg->allreduce(t)->getFuture();
    future->addCallback([pg = std::move(pg), ran](c10::ivalue::Future&) { ran->store(true); });
    attached = true;
    future->wait();
    EXPECT_TRUE(at::equal(t[0], at::full_like(t[0], 2.0)));
  });
  // wait() returns once the future completes; its callbacks then run on the executor's thread.
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!ran->load() && std::chrono::steady_clock::now() < until) std::this_thread::yield();
  EXPECT_TRUE(ran->load());
}

TEST_P(Threads, ShutdownFromACallbackWhileTheCallerShutsTheGroupDownReturnsOnBoth) {
  // The callback's shutdown() and the caller's race: one does the joining (the caller's joins the
  // callback's thread, which must not join anything itself), both return, nothing is joined twice.
  on_ranks(2, [](int rank, Group pg) {
    std::vector<at::Tensor> t{at::ones({1024})};
    auto future = pg->allreduce(t)->getFuture();
    auto called = std::make_shared<std::atomic<bool>>(false);
    future->addCallback([raw = pg.get(), called](c10::ivalue::Future&) {
      raw->shutdown();
      called->store(true);
    });
    future->wait();
    pg->shutdown();
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (!called->load() && std::chrono::steady_clock::now() < until) std::this_thread::yield();
    EXPECT_TRUE(called->load()) << "rank " << rank << ": the callback's shutdown() did not return";
  });
}

TEST_P(Threads, AbortFromAnotherThreadEndsOutstandingWork) {
  // Waited for at once, so run on this thread (Executor::help) unless the executor's began it;
  // abort() comes while the caller waits, in either place. One chunk through shared memory, and many.
  for (int64_t n : {int64_t(1024), int64_t(1) << 20}) {
    std::atomic<bool> done{false};
    on_ranks(2, [n, &done](int rank, Group pg) {
      if (rank == 1) {
        // Never joins, but keeps its group (a peer that left would fail the work first).
        while (!done.load()) std::this_thread::yield();
        return;
      }
      std::vector<at::Tensor> tensors{at::ones({n})};
      std::thread aborter([&] {
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
        pg->abort();
      });
      try {
        pg->allreduce(tensors)->wait();
        ADD_FAILURE() << "the work completed without its peer";
      } catch (const c10::DistBackendError& e) {
        EXPECT_NE(std::string(e.what()).find("abort() was called"), std::string::npos) << n << ": " << e.what();
      }
      aborter.join();
      EXPECT_TRUE(at::equal(tensors[0], at::ones({n}))) << "an aborted collective changed the caller's tensor";
      done = true;
    });
  }
}

// A failed collective's messages may still be moving when the caller frees its tensors and then
// destroys the group: UCX must write into none of the freed buffers (the caller's tensors, the
// group's workspace) nor read them. Three ranks, 64 MiB allreduces and a 48 MiB allgather into the
// caller's tensor, all aborted at once after a delay that lands before, during and after the
// transfers; the caller's tensors go first, then the group. AddressSanitizer sees any write.
TEST_P(Threads, AGroupAbortedWithMessagesInFlightWritesIntoNothingFreed) {
  for (int delay_ms : {0, 3, 12, 40}) {
    on_ranks(3, [delay_ms](int rank, Group pg) {
      std::vector<at::Tensor> big{at::full({int64_t(1) << 24}, float(rank))};
      at::Tensor gathered = at::empty({3 << 22}), mine = at::full({int64_t(1) << 22}, float(rank));
      std::vector<c10::intrusive_ptr<c10d::Work>> works{pg->allreduce(big), pg->_allgather_base(gathered, mine),
                                                        pg->allreduce(big)};
      std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
      pg->abort();
      for (auto& work : works) {
        try {
          work->wait();
        } catch (const c10::DistBackendError&) {
        }
      }
      works.clear();
      big.clear();
      gathered.reset();
      mine.reset();
      pg.reset();  // the last reference: the group is destroyed here
    });
  }
}

INSTANTIATE_TEST_SUITE_P(Engines, Threads, ::testing::Values("ucx", "shm", "gloo"),
                         [](const auto& info) { return info.param; });

}  // namespace

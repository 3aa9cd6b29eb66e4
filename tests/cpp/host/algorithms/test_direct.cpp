// allreduce_direct and barrier_direct (backend/host/algorithms/allreduce_direct.cpp, barrier_direct.cpp)
// over the in-memory transport.
#include <gtest/gtest.h>

#include <cstring>

#include "backend/host/algorithms/algorithms.h"
#include "tests/cpp/host/transport/memory_transport.h"
#include "tests/cpp/host/values.h"

namespace cnccl::host::testing {
namespace {

void add_float(void* acc, const void* in, size_t n) {
  auto* a = static_cast<float*>(acc);
  const auto* b = static_cast<const float*>(in);
  for (size_t i = 0; i < n; ++i) a[i] += b[i];
}

TEST(DirectAlgorithms, AllreduceSumsEverywhere) {
  for (int size : world_sizes()) {
    for (size_t count : counts()) {
      std::vector<std::vector<int32_t>> data(size);
      expect_no_errors(on_ranks(size, [&](Comm& comm) {
        auto& mine = data[comm.rank()] = contribution(comm.rank(), count);
        allreduce_direct(comm, reinterpret_cast<char*>(mine.data()), count, 4, add_int32);
      }));
      for (int r = 0; r < size; ++r) {
        for (size_t i = 0; i < count; ++i) {
          ASSERT_EQ(data[r][i], sum_over_ranks(size, i)) << "size " << size << " count " << count << " rank " << r;
        }
      }
    }
  }
}

TEST(DirectAlgorithms, AllreduceAddsInRankOrderSoEveryRankHoldsTheSameBits) {
  // Float addition is not associative: 1e8 + 1 - 1e8 depends on the order. Every rank must add
  // rank 0's, then rank 1's, ... contributions, as the test does.
  const int size = 4;
  const float values[size] = {1e8f, 1.0f, -1e8f, 0.75f};
  float expected = values[0];
  for (int r = 1; r < size; ++r) expected += values[r];
  std::vector<float> result(size);
  expect_no_errors(on_ranks(size, [&](Comm& comm) {
    float x = values[comm.rank()];
    allreduce_direct(comm, reinterpret_cast<char*>(&x), 1, 4, add_float);
    result[comm.rank()] = x;
  }));
  for (int r = 0; r < size; ++r) EXPECT_EQ(std::memcmp(&result[r], &expected, 4), 0) << "rank " << r;
}

TEST(DirectAlgorithms, BarrierReturnsOnEveryRank) {
  for (int size : world_sizes()) {
    std::atomic<int> passed{0};
    expect_no_errors(on_ranks(size, [&](Comm& comm) {
      barrier_direct(comm);
      passed += 1;
    }));
    EXPECT_EQ(passed.load(), size);
  }
}

}  // namespace
}  // namespace cnccl::host::testing

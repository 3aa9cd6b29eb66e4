// reduce_scatter_ring, allgather_ring and allreduce_ring (backend/host/algorithms/*_ring.cpp) over the
// in-memory transport, at world sizes 1-5 and sizes from empty to segmented.
#include <gtest/gtest.h>

#include <atomic>

#include "backend/host/algorithms/algorithms.h"
#include "tests/cpp/host/transport/memory_transport.h"
#include "tests/cpp/host/values.h"

namespace cnccl::host::testing {
namespace {

constexpr int32_t kUnset = 0x7eadbeef;

TEST(RingAlgorithms, ReduceScatterLeavesEachRankItsPartSummed) {
  for (int size : world_sizes()) {
    for (size_t count : counts()) {
      const Parts parts = Parts::even(count, size);
      std::vector<std::vector<int32_t>> data(size);
      expect_no_errors(on_ranks(size, [&](Comm& comm) {
        auto& mine = data[comm.rank()] = contribution(comm.rank(), count);
        reduce_scatter_ring(comm, reinterpret_cast<char*>(mine.data()), parts, 4, add_int32);
      }));
      for (int r = 0; r < size; ++r) {
        for (size_t i = parts.offset[r]; i < parts.offset[r] + parts.length[r]; ++i) {
          ASSERT_EQ(data[r][i], sum_over_ranks(size, i)) << "size " << size << " count " << count << " rank " << r;
        }
      }
    }
  }
}

TEST(RingAlgorithms, ReduceScatterProducesTheFirstPartOnceBeforeSendingIt) {
  for (int size : world_sizes()) {
    const size_t count = 1001;
    const Parts parts = Parts::even(count, size);
    std::vector<std::vector<int32_t>> data(size);
    std::vector<int> produced(size, 0);
    expect_no_errors(on_ranks(size, [&](Comm& comm) {
      const int r = comm.rank();
      auto& mine = data[r] = contribution(r, count);
      const int first = (r + size - 1) % size;
      // The part produced lazily starts out unset: a ring that sent it before producing it
      // would spread the sentinel into every rank's sums.
      for (size_t i = parts.offset[first]; i < parts.offset[first] + parts.length[first]; ++i) mine[i] = kUnset;
      auto produce = [&, r](size_t offset, size_t n) {
        produced[r] += 1;
        for (size_t i = offset; i < offset + n; ++i) data[r][i] = value(r, i);
      };
      reduce_scatter_ring(comm, reinterpret_cast<char*>(mine.data()), parts, 4, add_int32, produce);
    }));
    for (int r = 0; r < size; ++r) {
      EXPECT_EQ(produced[r], 1) << "size " << size << " rank " << r;
      for (size_t i = parts.offset[r]; i < parts.offset[r] + parts.length[r]; ++i) {
        ASSERT_EQ(data[r][i], sum_over_ranks(size, i)) << "size " << size << " rank " << r;
      }
    }
  }
}

TEST(RingAlgorithms, AllgatherGivesEveryRankEveryPart) {
  for (int size : world_sizes()) {
    for (size_t count : counts()) {
      const Parts parts = Parts::even(count, size);
      std::vector<std::vector<int32_t>> data(size);
      expect_no_errors(on_ranks(size, [&](Comm& comm) {
        const int r = comm.rank();
        auto& mine = data[r] = std::vector<int32_t>(count, kUnset);
        for (size_t i = parts.offset[r]; i < parts.offset[r] + parts.length[r]; ++i) mine[i] = value(r, i);
        allgather_ring(comm, reinterpret_cast<char*>(mine.data()), parts, 4);
      }));
      for (int r = 0; r < size; ++r) {
        for (int owner = 0; owner < size; ++owner) {
          for (size_t i = parts.offset[owner]; i < parts.offset[owner] + parts.length[owner]; ++i) {
            ASSERT_EQ(data[r][i], value(owner, i)) << "size " << size << " count " << count << " rank " << r;
          }
        }
      }
    }
  }
}

TEST(RingAlgorithms, AllreduceSumsEverywhereWithAndWithoutAProducer) {
  for (int size : world_sizes()) {
    for (size_t count : counts()) {
      for (bool lazy : {false, true}) {
        std::vector<std::vector<int32_t>> data(size);
        expect_no_errors(on_ranks(size, [&](Comm& comm) {
          const int r = comm.rank();
          auto& mine = data[r] = contribution(r, count);
          Producer produce;
          if (lazy) {
            produce = [&, r](size_t offset, size_t n) {
              for (size_t i = offset; i < offset + n; ++i) data[r][i] = value(r, i);
            };
          }
          allreduce_ring(comm, reinterpret_cast<char*>(mine.data()), count, 4, add_int32, produce);
        }));
        for (int r = 0; r < size; ++r) {
          for (size_t i = 0; i < count; ++i) {
            ASSERT_EQ(data[r][i], sum_over_ranks(size, i)) << "size " << size << " count " << count << " rank " << r;
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace cnccl::host::testing

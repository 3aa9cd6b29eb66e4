// broadcast_direct, reduce_direct, gather_direct and scatter_direct (backend/host/algorithms/rooted.cpp)
// over the in-memory transport, from every root.
#include <gtest/gtest.h>

#include "backend/host/algorithms/algorithms.h"
#include "tests/cpp/host/transport/memory_transport.h"
#include "tests/cpp/host/values.h"

namespace cnccl::host::testing {
namespace {

TEST(RootedAlgorithms, BroadcastCopiesTheRootsData) {
  for (int size : world_sizes()) {
    for (size_t count : {size_t(0), size_t(1), size_t(1001)}) {
      for (int root = 0; root < size; ++root) {
        std::vector<std::vector<int32_t>> data(size);
        expect_no_errors(on_ranks(size, [&](Comm& comm) {
          auto& mine = data[comm.rank()] = contribution(comm.rank(), count);
          broadcast_direct(comm, reinterpret_cast<char*>(mine.data()), count * 4, root);
        }));
        for (int r = 0; r < size; ++r) ASSERT_EQ(data[r], contribution(root, count)) << "root " << root;
      }
    }
  }
}

TEST(RootedAlgorithms, ReduceSumsOnTheRootOnly) {
  for (int size : world_sizes()) {
    for (size_t count : {size_t(0), size_t(3), size_t(1001)}) {
      for (int root = 0; root < size; ++root) {
        std::vector<std::vector<int32_t>> data(size);
        expect_no_errors(on_ranks(size, [&](Comm& comm) {
          auto& mine = data[comm.rank()] = contribution(comm.rank(), count);
          reduce_direct(comm, reinterpret_cast<char*>(mine.data()), count, 4, root, add_int32);
        }));
        for (size_t i = 0; i < count; ++i) ASSERT_EQ(data[root][i], sum_over_ranks(size, i));
      }
    }
  }
}

TEST(RootedAlgorithms, GatherAndScatterPlaceRankIAtPartI) {
  for (int size : world_sizes()) {
    for (size_t count : {size_t(0), size_t(5)}) {
      for (int root = 0; root < size; ++root) {
        std::vector<std::vector<int32_t>> gathered(size), scattered(size);
        expect_no_errors(on_ranks(size, [&](Comm& comm) {
          const int r = comm.rank();
          const auto mine = contribution(r, count);
          gathered[r].assign(count * size, 0);
          gather_direct(comm, reinterpret_cast<const char*>(mine.data()), count * 4,
                        reinterpret_cast<char*>(gathered[r].data()), root);
          std::vector<int32_t> all;
          for (int peer = 0; peer < size; ++peer) {
            const auto part = contribution(peer, count);
            all.insert(all.end(), part.begin(), part.end());
          }
          scattered[r].assign(count, 0);
          scatter_direct(comm, reinterpret_cast<const char*>(all.data()), reinterpret_cast<char*>(scattered[r].data()),
                         count * 4, root);
        }));
        for (int peer = 0; peer < size; ++peer) {
          const auto part = contribution(peer, count);
          ASSERT_TRUE(std::equal(part.begin(), part.end(), gathered[root].begin() + count * peer)) << "root " << root;
          ASSERT_EQ(scattered[peer], part) << "root " << root;
        }
      }
    }
  }
}

}  // namespace
}  // namespace cnccl::host::testing

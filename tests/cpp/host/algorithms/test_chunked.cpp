// reduce_chunked and allgather_chunked (backend/host/algorithms/reduce_chunked.cpp) over the in-memory
// transport: every rank's contribution reaches each unit's owner in rank order, chunk by chunk, and
// the results land where the deliver mode says (every rank, through a consumer, or each owner's part
// alone in a wider type); an allgather hands every part's chunks to the consumer once each, in
// order, produced by their owner alone; and a rank that sends a piece of the wrong size fails naming
// it, never truncates.
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <mutex>
#include <string>

#include "backend/host/algorithms/algorithms.h"
#include "backend/host/transport/tags.h"
#include "tests/cpp/host/transport/memory_transport.h"
#include "tests/cpp/host/values.h"

namespace cnccl::host::testing {
namespace {

// Sums int32 contributions into int32 results (or int64 ones: `wide`), recording on each rank whether
// input q always held rank q's values.
ChunkedReduction int32_sum(const std::vector<int32_t>& mine, char* out, const Parts& parts, int size,
                           ChunkedReduction::Deliver deliver, bool wide, int* in_rank_order) {
  ChunkedReduction r{parts, 4,
                     [&mine](size_t offset, size_t n, char* dst) { std::memcpy(dst, mine.data() + offset, n * 4); },
                     [size, wide, in_rank_order](const char* const* in, char* dst, size_t first, size_t n) {
                       for (size_t j = 0; j < n; ++j) {
                         int64_t acc = 0;
                         for (int q = 0; q < size; ++q) {
                           const int32_t v = reinterpret_cast<const int32_t*>(in[q])[j];
                           if (v != value(q, first + j)) *in_rank_order = 0;
                           acc += v;
                         }
                         if (wide) {
                           reinterpret_cast<int64_t*>(dst)[j] = acc;
                         } else {
                           reinterpret_cast<int32_t*>(dst)[j] = int32_t(acc);
                         }
                       }
                     },
                     out, deliver};
  if (wide) r.out_elem = 8;
  return r;
}

TEST(ChunkedAlgorithm, AllreduceGivesEveryRankEverySumInRankOrder) {
  for (int size : world_sizes()) {
    for (size_t count : counts()) {
      std::vector<std::vector<int32_t>> out(size, std::vector<int32_t>(count, 7));
      std::vector<int> ordered(size, 1);
      expect_no_errors(on_ranks(size, [&](Comm& comm) {
        const int r = comm.rank();
        const auto mine = contribution(r, count);
        reduce_chunked(comm, int32_sum(mine, reinterpret_cast<char*>(out[r].data()), Parts::even(count, size), size,
                                       ChunkedReduction::kAll, false, &ordered[r]));
      }));
      for (int r = 0; r < size; ++r) {
        EXPECT_TRUE(ordered[r]) << "size " << size << " count " << count << " rank " << r;
        for (size_t i = 0; i < count; ++i) {
          ASSERT_EQ(out[r][i], sum_over_ranks(size, i)) << "size " << size << " count " << count << " rank " << r;
        }
      }
    }
  }
}

TEST(ChunkedAlgorithm, AConsumerTakesEveryUnitOnceAndNothingIsWrittenToOut) {
  const int size = 3;
  const size_t count = (size_t(1) << 19) + 3;  // several chunks a part
  std::vector<std::vector<int32_t>> got(size, std::vector<int32_t>(count, 0));
  std::vector<std::vector<int>> times(size, std::vector<int>(count, 0));
  std::vector<int> ordered(size, 1);
  expect_no_errors(on_ranks(size, [&](Comm& comm) {
    const int r = comm.rank();
    const auto mine = contribution(r, count);
    auto red = int32_sum(mine, nullptr, Parts::even(count, size), size, ChunkedReduction::kAll, false, &ordered[r]);
    red.consume = [&, r](size_t offset, size_t n, const char* result) {
      for (size_t j = 0; j < n; ++j) {
        got[r][offset + j] = reinterpret_cast<const int32_t*>(result)[j];
        ++times[r][offset + j];
      }
    };
    reduce_chunked(comm, red);
  }));
  for (int r = 0; r < size; ++r) {
    EXPECT_TRUE(ordered[r]) << "rank " << r;
    for (size_t i = 0; i < count; ++i) {
      ASSERT_EQ(times[r][i], 1) << "rank " << r << " unit " << i;
      ASSERT_EQ(got[r][i], sum_over_ranks(size, i)) << "rank " << r << " unit " << i;
    }
  }
}

TEST(ChunkedAlgorithm, ReduceScatterLeavesEachOwnerItsPartAloneInTheWiderType) {
  for (int size : world_sizes()) {
    for (size_t count : counts()) {
      const Parts parts = Parts::even(count, size);
      std::vector<std::vector<int64_t>> out(size);
      std::vector<int> ordered(size, 1);
      expect_no_errors(on_ranks(size, [&](Comm& comm) {
        const int r = comm.rank();
        const auto mine = contribution(r, count);
        out[r].assign(parts.length[r], -1);
        reduce_chunked(comm, int32_sum(mine, reinterpret_cast<char*>(out[r].data()), parts, size,
                                       ChunkedReduction::kOwn, true, &ordered[r]));
      }));
      for (int r = 0; r < size; ++r) {
        EXPECT_TRUE(ordered[r]) << "size " << size << " count " << count << " rank " << r;
        for (size_t j = 0; j < parts.length[r]; ++j) {
          ASSERT_EQ(out[r][j], sum_over_ranks(size, parts.offset[r] + j))
              << "size " << size << " count " << count << " rank " << r;
        }
      }
    }
  }
}

TEST(ChunkedAlgorithm, AnAllgatherHandsEveryPartsChunksToTheConsumerOnceInOrder) {
  std::vector<size_t> sizes = counts();
  sizes.push_back(size_t(3) << 18);  // 3 MiB of int32: several chunks a part
  for (int size : world_sizes()) {
    for (size_t count : sizes) {
      const Parts parts = Parts::even(count, size);
      std::vector<std::vector<int32_t>> out(size, std::vector<int32_t>(count, 7));
      std::vector<std::string> problems(size);
      expect_no_errors(on_ranks(size, [&](Comm& comm) {
        const int r = comm.rank();
        std::vector<size_t> next(size_t(size), 0);  // each part's next unit, for the order check
        allgather_chunked(
            comm, parts, 4,
            [&](size_t first, size_t n, char* dst) {
              if (first < parts.offset[r] || first + n > parts.offset[r] + parts.length[r]) {
                problems[r] = "produced units outside this rank's part";
              }
              for (size_t j = 0; j < n; ++j) reinterpret_cast<int32_t*>(dst)[j] = value(r, first + j);
            },
            [&](size_t first, size_t n, const char* piece) {
              int q = 0;
              while (q + 1 < size && first >= parts.offset[q + 1]) ++q;
              if (first != parts.offset[q] + next[q]) problems[r] = "a part's chunks came out of order or twice";
              next[q] += n;
              std::memcpy(out[r].data() + first, piece, n * 4);
            },
            tags::kSecondPhase);
        for (int q = 0; q < size; ++q) {
          if (next[q] != parts.length[q]) problems[r] = "part " + std::to_string(q) + " was not handed over whole";
        }
      }));
      for (int r = 0; r < size; ++r) {
        EXPECT_EQ(problems[r], "") << "size " << size << " count " << count << " rank " << r;
        int q = 0;
        for (size_t i = 0; i < count; ++i) {
          while (q + 1 < size && i >= parts.offset[q + 1]) ++q;
          ASSERT_EQ(out[r][i], value(q, i)) << "size " << size << " count " << count << " rank " << r << " unit " << i;
        }
      }
    }
  }
}

TEST(ChunkedAlgorithm, APieceOfTheWrongSizeFailsNamingIt) {
  const int size = 2;
  const auto errors = on_ranks(size, [&](Comm& comm) {
    // Rank 1 cuts 12 units where rank 0 cuts 10: their pieces disagree in size.
    const size_t count = comm.rank() == 0 ? 10 : 12;
    const auto mine = contribution(comm.rank(), count);
    std::vector<int32_t> out(count);
    int ordered = 1;
    reduce_chunked(comm, int32_sum(mine, reinterpret_cast<char*>(out.data()), Parts::even(count, size), size,
                                   ChunkedReduction::kAll, false, &ordered));
  });
  EXPECT_NE(errors[0].find("ranks disagree on the tensor size"), std::string::npos) << errors[0];
}

}  // namespace
}  // namespace cnccl::host::testing

// alltoall_direct (backend/host/algorithms/alltoall_direct.cpp) over the in-memory transport, with uneven
// and zero-length splits; and a size disagreement, which must fail naming it, not truncate.
// reduce_scatter_alltoall (reduce_scatter_alltoall.cpp): every contribution reaches its owner in
// rank order, whatever order the messages arrive in.
#include <gtest/gtest.h>

#include <cstring>

#include "backend/host/algorithms/algorithms.h"
#include "tests/cpp/host/transport/memory_transport.h"
#include "tests/cpp/host/values.h"

namespace cnccl::host::testing {
namespace {

// Bytes rank `from` sends rank `to`: uneven, and zero for some pairs.
size_t length(int from, int to) { return size_t((from * 3 + to * 5) % 4) * 3; }
char byte(int from, int to, size_t i) { return char(from * 31 + to * 7 + int(i)); }

TEST(AlltoallAlgorithm, EveryRankReceivesWhatEachPeerSentIt) {
  for (int size : world_sizes()) {
    std::vector<std::vector<char>> received(size);
    std::vector<std::vector<size_t>> recv_offsets(size);
    expect_no_errors(on_ranks(size, [&](Comm& comm) {
      const int r = comm.rank();
      std::vector<size_t> send_off, send_len, recv_off, recv_len;
      std::vector<char> in;
      size_t out_total = 0;
      for (int peer = 0; peer < size; ++peer) {
        send_off.push_back(in.size());
        send_len.push_back(length(r, peer));
        for (size_t i = 0; i < length(r, peer); ++i) in.push_back(byte(r, peer, i));
        recv_off.push_back(out_total);
        recv_len.push_back(length(peer, r));
        out_total += length(peer, r);
      }
      received[r].assign(out_total, 0);
      recv_offsets[r] = recv_off;
      alltoall_direct(comm, in.data(), send_off, send_len, received[r].data(), recv_off, recv_len);
    }));
    for (int r = 0; r < size; ++r) {
      for (int peer = 0; peer < size; ++peer) {
        for (size_t i = 0; i < length(peer, r); ++i) {
          ASSERT_EQ(received[r][recv_offsets[r][peer] + i], byte(peer, r, i)) << "size " << size << " rank " << r;
        }
      }
    }
  }
}

TEST(AlltoallAlgorithm, ReduceScatterHandsTheOwnerEveryContributionInRankOrder) {
  for (int size : world_sizes()) {
    for (size_t count : counts()) {
      const Parts parts = Parts::even(count, size);
      std::vector<std::vector<int32_t>> data(size);
      std::vector<int> order_ok(size, 0);
      expect_no_errors(on_ranks(size, [&](Comm& comm) {
        const int r = comm.rank();
        auto& mine = data[r] = contribution(r, count);
        // Records whether input q holds rank q's values, then sums in place into the own part.
        auto sum = [&, r](const char* const* in, char* dst, size_t first, size_t n) {
          EXPECT_EQ(first, parts.offset[r]);
          bool ok = true;
          for (int q = 0; q < size; ++q) {
            const auto* v = reinterpret_cast<const int32_t*>(in[q]);
            for (size_t j = 0; j < n; ++j) ok = ok && v[j] == value(q, parts.offset[r] + j);
          }
          order_ok[r] = ok;
          std::vector<int32_t> acc(n, 0);
          for (int q = 0; q < size; ++q) add_int32(acc.data(), in[q], n);
          copy_bytes(dst, acc.data(), n * 4);
        };
        char* base = reinterpret_cast<char*>(mine.data());
        reduce_scatter_alltoall(comm, base, parts, 4, sum, base + parts.offset[r] * 4);
      }));
      for (int r = 0; r < size; ++r) {
        EXPECT_TRUE(order_ok[r]) << "size " << size << " count " << count << " rank " << r;
        for (size_t i = parts.offset[r]; i < parts.offset[r] + parts.length[r]; ++i) {
          ASSERT_EQ(data[r][i], sum_over_ranks(size, i)) << "size " << size << " count " << count << " rank " << r;
        }
      }
    }
  }
}

TEST(AlltoallAlgorithm, ASizeDisagreementFailsNamingIt) {
  const int size = 2;
  const auto errors = on_ranks(size, [&](Comm& comm) {
    // Rank 0 sends 8 bytes where rank 1 expects 4.
    std::vector<char> in(16, 1), out(16, 0);
    const size_t send = comm.rank() == 0 ? 8 : 4;
    alltoall_direct(comm, in.data(), {0, 8}, {send, send}, out.data(), {0, 8}, {4, 4});
  });
  EXPECT_NE(errors[1].find("ranks disagree on the tensor size"), std::string::npos) << errors[1];
}

}  // namespace
}  // namespace cnccl::host::testing

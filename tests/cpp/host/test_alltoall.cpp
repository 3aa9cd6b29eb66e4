// alltoall_direct (backend/host/alltoall_direct.cpp) over the in-memory transport, with uneven
// and zero-length splits; and a size disagreement, which must fail naming it, not truncate.
#include <gtest/gtest.h>

#include "backend/host/algorithms.h"
#include "memory_transport.h"

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

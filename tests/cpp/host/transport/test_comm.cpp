// Comm (backend/host/transport/comm.cpp) over the in-memory transport: the signature headers that make
// ranks which called different collectives fail, naming both calls, even when a peer that saw
// the disagreement first has torn its transport down.
#include <gtest/gtest.h>

#include <array>

#include "backend/host/algorithms/algorithms.h"
#include "tests/cpp/host/transport/memory_transport.h"

namespace cnccl::host::testing {
namespace {

TEST(CommHeaders, RanksThatCalledDifferentCollectivesFailNamingBoth) {
  const auto errors = on_ranks(
      3, [](Comm& comm) { barrier_direct(comm); }, [](int r) { return r == 1 ? "1024 x Float" : "512 x Float"; });
  for (int r = 0; r < 3; ++r) {
    EXPECT_NE(errors[r].find("disagree"), std::string::npos) << "rank " << r << ": " << errors[r];
  }
  EXPECT_NE(errors[0].find("1024 x Float"), std::string::npos) << errors[0];
}

// A send that was delivered but reports the error UCX gives once the receiver has torn down its
// worker (the receiver failed on the disagreement and destroyed its group first).
class PeerGoneRequest final : public Request {
 public:
  bool done() const override { return true; }
  const std::string& error() const override { return error_; }
  size_t received_bytes() const override { return 0; }
  uint64_t sender_tag() const override { return 0; }
  void cancel() override {}

 private:
  std::string error_ = "Shared memory error";
};

class PeerGoneTransport final : public Transport {
 public:
  PeerGoneTransport(Fabric& fabric, int rank, int size, int gone) : inner_(fabric, rank, size), gone_(gone) {}

  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  std::unique_ptr<Request> isend(int peer, uint64_t tag, const void* data, size_t bytes) override {
    auto request = inner_.isend(peer, tag, data, bytes);
    if (peer != gone_) return request;
    return std::make_unique<PeerGoneRequest>();
  }
  std::unique_ptr<Request> irecv(int peer, uint64_t tag, uint64_t mask, void* data, size_t bytes) override {
    return inner_.irecv(peer, tag, mask, data, bytes);
  }
  bool progress() override { return inner_.progress(); }
  void wait_for_activity(std::chrono::microseconds limit) override { inner_.wait_for_activity(limit); }
  uint64_t bytes_sent() const override { return inner_.bytes_sent(); }
  std::string describe() const override { return "memory, rank " + std::to_string(gone_) + " gone"; }

 private:
  MemoryTransport inner_;
  int gone_;
};

// Every rank's error from a collective running `body`, in which rank `odd` called another
// collective and every send to rank `gone` fails after delivery.
std::vector<std::string> disagreement_with_a_peer_gone(int size, int odd, int gone,
                                                       const std::function<void(Comm&)>& body) {
  return on_ranks(
      size, body, [odd](int r) { return r == odd ? "999 x Float" : "1000 x Float"; },
      [gone](Fabric& fabric, int r, int n) { return std::make_unique<PeerGoneTransport>(fabric, r, n, gone); });
}

TEST(CommHeaders, TheOddRankNamesTheDisagreementWhenItsHeaderToAGonePeerFails) {
  // Rank 1's header to rank 2 fails; the headers rank 1 received still show the disagreement.
  const auto errors = disagreement_with_a_peer_gone(4, 1, 2, barrier_direct);
  EXPECT_NE(errors[1].find("ranks disagree"), std::string::npos) << errors[1];
  EXPECT_NE(errors[1].find("999 x Float"), std::string::npos) << errors[1];
  EXPECT_EQ(errors[1].find("transport"), std::string::npos) << errors[1];
}

TEST(CommHeaders, ARankWhoseNeighboursAgreeReportsThePeersNoticeNotTheSendError) {
  // Rank 3's neighbours (2 and 0) called what it called, so it goes on to send to the odd rank,
  // which fails. Ranks 0 and 2 saw the disagreement and sent notices, which explain the failure.
  const auto errors = disagreement_with_a_peer_gone(4, 1, 1, [](Comm& comm) {
    if (comm.rank() != 3) return;
    const char byte = 0;
    Pending send = comm.send(1, 0, &byte, 1);
    comm.wait(send);
  });
  EXPECT_NE(errors[3].find("reported: ranks disagree"), std::string::npos) << errors[3];
  EXPECT_EQ(errors[3].find("transport"), std::string::npos) << errors[3];
}

// Sends its signature headers (the 256-byte messages) as 256 'X's with no terminating NUL, as a
// corrupt or hostile peer could.
class UnterminatedHeaderTransport final : public Transport {
 public:
  UnterminatedHeaderTransport(Fabric& fabric, int rank, int size) : inner_(fabric, rank, size) {
    header_.fill('X');
  }

  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  std::unique_ptr<Request> isend(int peer, uint64_t tag, const void* data, size_t bytes) override {
    return inner_.isend(peer, tag, bytes == header_.size() ? header_.data() : data, bytes);
  }
  std::unique_ptr<Request> irecv(int peer, uint64_t tag, uint64_t mask, void* data, size_t bytes) override {
    return inner_.irecv(peer, tag, mask, data, bytes);
  }
  bool progress() override { return inner_.progress(); }
  void wait_for_activity(std::chrono::microseconds limit) override { inner_.wait_for_activity(limit); }
  uint64_t bytes_sent() const override { return inner_.bytes_sent(); }
  std::string describe() const override { return "memory, unterminated headers"; }

 private:
  MemoryTransport inner_;
  std::array<char, 256> header_{};
};

// The peer's text ends where its buffer does: reading on for a NUL would run into the next header
// (here the same rank's other one) and past the Comm.
TEST(CommHeaders, APeersHeaderWithoutATerminatorIsReadToItsEndOnly) {
  const auto errors = on_ranks(2, [](Comm& comm) { barrier_direct(comm); }, {},
                               [](Fabric& fabric, int r, int n) -> std::unique_ptr<Transport> {
                                 if (r == 1) return std::make_unique<UnterminatedHeaderTransport>(fabric, r, n);
                                 return std::make_unique<MemoryTransport>(fabric, r, n);
                               });
  const std::string xs(256, 'X');
  EXPECT_NE(errors[0].find("rank 1 called " + xs + " [peer rank 1]"), std::string::npos) << errors[0];
}

}  // namespace
}  // namespace cnccl::host::testing

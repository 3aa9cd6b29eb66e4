// Comm (backend/host/transport/comm.cpp) over the in-memory transport: the signature headers that make
// ranks which called different collectives fail, naming both calls, even when a peer that saw
// the disagreement first has torn its transport down.
#include <gtest/gtest.h>

#include <array>

#include "backend/host/algorithms/algorithms.h"
#include "backend/host/transport/tags.h"
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


// Holds this rank's notices until `release` has passed and then sends them from progress(), as UCX's TCP
// transport sends what a full socket left queued only from ucp_worker_progress (UCX 1.13,
// src/uct/tcp/tcp_ep.c, uct_tcp_ep_progress_tx): a notice's send is not done when isend returns.
class HeldNoticeTransport final : public Transport {
 public:
  HeldNoticeTransport(Fabric& fabric, int rank, int size, std::chrono::milliseconds hold)
      : inner_(fabric, rank, size), release_(Clock::now() + hold) {}

  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  std::unique_ptr<Request> isend(int peer, uint64_t tag, const void* data, size_t bytes) override {
    if (tag != tags::notice(rank())) return inner_.isend(peer, tag, data, bytes);
    auto held = std::make_unique<Held>();
    held_.push_back({peer, tag, data, bytes, &held->sent});
    return held;
  }
  std::unique_ptr<Request> irecv(int peer, uint64_t tag, uint64_t mask, void* data, size_t bytes) override {
    return inner_.irecv(peer, tag, mask, data, bytes);
  }
  bool progress() override {
    if (held_.empty() || Clock::now() < release_) return inner_.progress();
    for (auto& h : held_) {
      sent_.push_back(inner_.isend(h.peer, h.tag, h.data, h.bytes));
      *h.sent = true;
    }
    held_.clear();
    return true;
  }
  void wait_for_activity(std::chrono::microseconds limit) override { inner_.wait_for_activity(limit); }
  uint64_t bytes_sent() const override { return inner_.bytes_sent(); }
  std::string describe() const override { return "memory, notices held"; }

 private:
  // The request of a held send: done once progress() has sent it. Freed only with the Comm, which
  // keeps its notices' requests as long as itself, so the pointer in `held_` stays valid.
  struct Held final : Request {
    bool sent = false;
    bool done() const override { return sent; }
    const std::string& error() const override { return none; }
    size_t received_bytes() const override { return 0; }
    uint64_t sender_tag() const override { return 0; }
    void cancel() override {}
    std::string none;
  };
  struct Message {
    int peer;
    uint64_t tag;
    const void* data;
    size_t bytes;
    bool* sent;
  };
  MemoryTransport inner_;
  Clock::time_point release_;
  std::vector<Message> held_;
  std::vector<std::unique_ptr<Request>> sent_;
};

// A failed rank's notice that its transport cannot send at once: notify_peers returns at once, and
// the notice stays in flight (has_background: the group's idle loop polls the Comm) until it is sent,
// later than the second notify_peers once spent pushing it before it gave up. The peer learns why.
TEST(CommNotices, ANoticeNotSentAtOnceIsSentByLaterPollsWithoutBlocking) {
  const auto hold = std::chrono::milliseconds(1500);
  std::chrono::nanoseconds notify_took{0};
  bool in_flight = false, sent = false;
  const auto errors = on_ranks(
      2,
      [&](Comm& comm) {
        if (comm.rank() == 0) {
          const auto start = Clock::now();
          comm.notify_peers("its peer across hosts died");
          notify_took = Clock::now() - start;
          in_flight = comm.has_background();
          // The group's idle loop (Executor::lead).
          while (comm.has_background() && Clock::now() < start + std::chrono::seconds(20)) {
            if (!comm.poll()) comm.wait_for_activity(std::chrono::milliseconds(1));
          }
          sent = !comm.has_background();
          return;
        }
        char byte = 0;
        Pending never_sent = comm.recv(0, 0, &byte, 1);
        comm.wait(never_sent);
      },
      {}, [&](Fabric& fabric, int r, int n) { return std::make_unique<HeldNoticeTransport>(fabric, r, n, hold); });
  EXPECT_LT(notify_took, std::chrono::milliseconds(200));
  EXPECT_TRUE(in_flight);
  EXPECT_TRUE(sent);
  EXPECT_EQ(errors[0], "");
  EXPECT_NE(errors[1].find("rank 0 reported: its peer across hosts died"), std::string::npos) << errors[1];
}

}  // namespace
}  // namespace cnccl::host::testing

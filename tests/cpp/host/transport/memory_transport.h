// An in-memory Transport for testing the host algorithms without a network: ranks are threads of
// one process sharing a Fabric. A send is copied at once into the destination's queue (or into a
// receive already posted there); a receive matches tags under its mask in arrival order, and
// fails as "truncated" when the message is larger than its buffer, as UCX's tag matching does. A
// receive whose request is destroyed unmatched is withdrawn.
#pragma once

#include <c10/util/Exception.h>
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "backend/host/transport/comm.h"

namespace cnccl::host::testing {

class Fabric {
 public:
  explicit Fabric(int size) : unexpected_(size), posted_(size) {}

  struct State {
    bool done = false;
    std::string error;
    size_t received = 0;
    uint64_t tag = 0;
  };

  class MemoryRequest final : public Request {
   public:
    MemoryRequest(Fabric& fabric, std::shared_ptr<State> state) : fabric_(fabric), state_(std::move(state)) {}
    // A receive's buffer may be freed after its request: nothing may be delivered into it then.
    ~MemoryRequest() override { fabric_.cancel(state_); }
    bool done() const override {
      std::lock_guard<std::mutex> lock(fabric_.mutex_);
      return state_->done;
    }
    const std::string& error() const override { return state_->error; }
    size_t received_bytes() const override { return state_->received; }
    uint64_t sender_tag() const override { return state_->tag; }
    void cancel() override { fabric_.cancel(state_); }

   private:
    Fabric& fabric_;
    std::shared_ptr<State> state_;
  };

  std::unique_ptr<Request> send(int source, int peer, uint64_t tag, const void* data, size_t bytes) {
    auto state = std::make_shared<State>();
    std::lock_guard<std::mutex> lock(mutex_);
    auto& posted = posted_.at(peer);
    for (auto it = posted.begin(); it != posted.end(); ++it) {
      if (!matches(*it, source, tag)) continue;
      deliver(*it, tag, static_cast<const char*>(data), bytes);
      posted.erase(it);
      return finish_send(state);
    }
    const char* p = static_cast<const char*>(data);
    unexpected_.at(peer).push_back({source, tag, std::vector<char>(p, p + bytes)});
    return finish_send(state);
  }

  std::unique_ptr<Request> recv(int self, int peer, uint64_t tag, uint64_t mask, void* data, size_t bytes) {
    auto state = std::make_shared<State>();
    std::lock_guard<std::mutex> lock(mutex_);
    Posted posted{peer, tag, mask, data, bytes, state};
    auto& queue = unexpected_.at(self);
    for (auto it = queue.begin(); it != queue.end(); ++it) {
      if (!matches(posted, it->source, it->tag)) continue;
      deliver(posted, it->tag, it->data.data(), it->data.size());
      queue.erase(it);
      return std::make_unique<MemoryRequest>(*this, state);
    }
    posted_.at(self).push_back(posted);
    return std::make_unique<MemoryRequest>(*this, state);
  }

  void wait_for_activity(std::chrono::microseconds limit) {
    std::unique_lock<std::mutex> lock(mutex_);
    activity_.wait_for(lock, limit);
  }

 private:
  struct Message {
    int source;
    uint64_t tag;
    std::vector<char> data;
  };
  struct Posted {
    int source;  // < 0: any
    uint64_t tag, mask;
    void* data;
    size_t bytes;
    std::shared_ptr<State> state;
  };

  static bool matches(const Posted& p, int source, uint64_t tag) {
    return (p.source < 0 || p.source == source) && (tag & p.mask) == (p.tag & p.mask);
  }

  void deliver(Posted& p, uint64_t tag, const char* data, size_t bytes) {
    if (bytes > p.bytes) {
      p.state->error = "message truncated";
    } else if (bytes) {
      std::memcpy(p.data, data, bytes);
    }
    p.state->received = bytes;
    p.state->tag = tag;
    p.state->done = true;
    activity_.notify_all();
  }

  std::unique_ptr<Request> finish_send(const std::shared_ptr<State>& state) {
    state->done = true;
    return std::make_unique<MemoryRequest>(*this, state);
  }

  void cancel(const std::shared_ptr<State>& state) {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& posted : posted_) posted.remove_if([&](const Posted& p) { return p.state == state; });
  }

  mutable std::mutex mutex_;
  std::condition_variable activity_;
  std::vector<std::deque<Message>> unexpected_;  // by destination
  std::vector<std::list<Posted>> posted_;        // by destination
};

class MemoryTransport final : public Transport {
 public:
  MemoryTransport(Fabric& fabric, int rank, int size) : fabric_(fabric), rank_(rank), size_(size) {}

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::unique_ptr<Request> isend(int peer, uint64_t tag, const void* data, size_t bytes) override {
    sent_ += bytes;
    return fabric_.send(rank_, peer, tag, data, bytes);
  }
  std::unique_ptr<Request> irecv(int peer, uint64_t tag, uint64_t mask, void* data, size_t bytes) override {
    return fabric_.recv(rank_, peer, tag, mask, data, bytes);
  }
  bool progress() override { return false; }
  void wait_for_activity(std::chrono::microseconds limit) override { fabric_.wait_for_activity(limit); }
  uint64_t bytes_sent() const override { return sent_; }
  std::string describe() const override { return "memory"; }

 private:
  Fabric& fabric_;
  const int rank_, size_;
  uint64_t sent_ = 0;
};

using TransportOnFabric = std::function<std::unique_ptr<Transport>(Fabric&, int rank, int size)>;

// Runs body(comm) on `size` threads, one Comm per rank over one Fabric, inside one collective
// (begin ... end) named `op` with every rank's `signature(rank)`. Returns each rank's error
// message ("" when it succeeded). `transport` wraps the fabric differently (a failing peer).
inline std::vector<std::string> on_ranks(int size, const std::function<void(Comm&)>& body,
                                         const std::function<std::string(int)>& signature = {},
                                         const TransportOnFabric& transport = {}) {
  Fabric fabric(size);
  std::vector<std::string> errors(size);
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      try {
        Comm comm(transport ? transport(fabric, r, size) : std::make_unique<MemoryTransport>(fabric, r, size),
                  "memory");
        comm.begin("test", 0, std::chrono::seconds(30), signature ? signature(r) : "same");
        body(comm);
        comm.end();
      } catch (const c10::Error& e) {
        // The message alone: the backtrace names source paths, which tests must not match.
        errors[r] = e.what_without_backtrace();
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  return errors;
}

inline void expect_no_errors(const std::vector<std::string>& errors) {
  for (size_t r = 0; r < errors.size(); ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
}

// The sizes every algorithm test covers: empty, fewer elements than ranks (zero-length parts),
// counts that do not split evenly, and one large enough for the ring's segmenting.
inline const std::vector<size_t>& counts() {
  static const std::vector<size_t> all{0, 1, 2, 7, 1000, 1001, (size_t(1) << 19) + 3};
  return all;
}
inline const std::vector<int>& world_sizes() {
  static const std::vector<int> all{1, 2, 3, 4, 5};
  return all;
}

}  // namespace cnccl::host::testing

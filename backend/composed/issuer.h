// Issues an engine's collectives from one thread, in call order, each once every rank has shown
// the same signature (one small allgather on the engine itself). It gives gloo what cnccl's host
// path gets from its headers (docs/design.md, "Agreement"): ranks that disagree fail at once,
// naming both calls, where gloo alone hangs, aborts the process on a size mismatch or mixes
// dtypes silently; a rank that never arrives fails after the timeout, naming a peer; abort() and
// shutdown() end outstanding works at once; a group that failed stays failed and says why.
#pragma once

#include <torch/csrc/distributed/c10d/Backend.hpp>

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>

namespace cnccl::composed {

class Issuer {
 public:
  // `peer_exited(r)`: why rank r is known gone ("its process (pid N) exited"), or empty: a failed
  // agreement names that peer rather than the ring's neighbour, which may be alive.
  Issuer(c10::intrusive_ptr<c10d::Backend> engine, std::string group_name,
         std::function<std::string(int)> peer_exited = {});
  ~Issuer();
  Issuer(const Issuer&) = delete;
  Issuer& operator=(const Issuer&) = delete;

  using Issue = std::function<c10::intrusive_ptr<c10d::Work>()>;

  // Queues `issue` (which calls the engine, or the composition over it); the returned work
  // completes with the engine's work, or fails naming `name`, `seq` and the group.
  // `signature` is what every rank must agree on ("16384 x Float, SUM, fp16 wire").
  c10::intrusive_ptr<c10d::Work> submit(c10d::OpType type, const char* name, uint64_t seq, std::string signature,
                                        std::vector<at::Tensor> outputs, std::chrono::milliseconds timeout,
                                        Issue issue);
  // Ends every outstanding work with an error naming `why`; later submissions fail the same way.
  void abort(const std::string& why);
  // abort(why), then joins every thread the issuer started and releases the engine, on the calling
  // thread. Returns once the job in flight, if any, has ended: at most its timeout, as its wait on
  // peers is bounded by it, and once gloo has run the callbacks of what it was given.
  void close(const std::string& why);

  struct State;

 private:
  std::shared_ptr<State> state_;
  // Started here, joined by close(), as are the completion threads the state starts.
  std::thread thread_;
  std::atomic<bool> closed_{false};
};

}  // namespace cnccl::composed

// The store a group keeps its keys in: fresh for each group made, though the store it was given may hold
// the keys of an earlier group of the same name (docs/design.md, "A fresh store for every group").
#pragma once

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include <chrono>
#include <string>

namespace cnccl {

// The group's keys under a prefix that only the ranks making this group share; its type marks a store
// already made so (group_store returns one as it is).
class GroupStore : public c10d::PrefixStore {
 public:
  GroupStore(const std::string& token, c10::intrusive_ptr<c10d::Store> store)
      : c10d::PrefixStore("cnccl/" + token, std::move(store)) {}
};

// Collective over `store`'s ranks: each draws a token, and the ranks agree on the tokens they all drew,
// so that no rank reads a value a process of an earlier group left under the same key. Returns `store`
// itself when it is already a GroupStore. Throws a DistBackendError naming the ranks not seen to join
// after `timeout`, or naming a rank whose `settings` (Config::engine_settings) differ from this one's.
c10::intrusive_ptr<c10d::Store> group_store(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                            std::chrono::milliseconds timeout, const std::string& group_name,
                                            const std::string& settings = "");

}  // namespace cnccl

// docs/design.md, "A fresh store for every group".
#include "backend/group_store.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <random>
#include <thread>
#include <vector>

#include "backend/errors.h"
#include "backend/signature.h"

namespace cnccl {
namespace {

std::string hex64(uint64_t v) {
  char text[17];
  std::snprintf(text, sizeof text, "%016llx", static_cast<unsigned long long>(v));
  return text;
}

uint64_t draw_token() {
  std::random_device device;
  const uint64_t clock = uint64_t(std::chrono::steady_clock::now().time_since_epoch().count());
  return ((uint64_t(device()) << 32) ^ device()) ^ (uint64_t(::getpid()) << 40) ^ clock;
}

std::vector<uint8_t> bytes_of(const std::string& s) { return {s.begin(), s.end()}; }
std::string text_of(const std::vector<uint8_t>& b) { return {b.begin(), b.end()}; }

std::string list(const std::vector<int>& ranks) {
  std::string out;
  for (int r : ranks) out += (out.empty() ? "" : ", ") + std::to_string(r);
  return out;
}

}  // namespace

c10::intrusive_ptr<c10d::Store> group_store(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                            std::chrono::milliseconds timeout, const std::string& group_name,
                                            const std::string& settings) {
  if (dynamic_cast<GroupStore*>(store.get())) return store;
  const std::string token = hex64(draw_token());
  if (size == 1) return c10::make_intrusive<GroupStore>(token, store);
  std::vector<std::string> tokens, views;
  for (int r = 0; r < size; ++r) {
    tokens.push_back("cnccl/join/token/" + std::to_string(r));
    views.push_back("cnccl/join/view/" + std::to_string(r));
  }
  const auto start = std::chrono::steady_clock::now();
  const auto deadline = start + timeout;
  auto fail = [&](const std::string& why) {
    const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start);
    throw errors::backend_error("cnccl: rank " + std::to_string(rank) + " of group '" + group_name + "' waited " +
                                std::to_string(waited.count()) + " ms (the group's timeout) for " + why);
  };
  // Every key read here may hold an earlier group's value until its rank writes this group's: a rank
  // posts the hash of the tokens it read, and the ranks are joined once every rank posted the same
  // hash. A rank posts only a view that holds its own new token, so an equal hash from every rank
  // means every rank's new token is in it.
  auto wait_for = [&](const std::vector<std::string>& keys, const char* what) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    try {
      store->wait(keys, std::max(left, std::chrono::milliseconds(1)));
    } catch (const std::exception&) {
      std::vector<int> missing;
      for (int r = 0; r < size; ++r) {
        try {
          if (!store->check({keys[r]})) missing.push_back(r);
        } catch (const std::exception&) {
          missing.push_back(r);
        }
      }
      fail("rank(s) " + list(missing) + " to " + what + " (they have not called init_process_group/new_group " +
           "for this group, or failed before)");
    }
  };
  // A token carries its rank's engine settings: once joined, every rank has read the same ones.
  store->set(tokens[rank], bytes_of(token + "|" + settings));
  std::string posted;
  auto pause = std::chrono::milliseconds(1);
  while (true) {
    wait_for(tokens, "start creating it");
    std::string view;
    const std::vector<std::vector<uint8_t>> drawn = store->multiGet(tokens);
    for (const auto& t : drawn) view += text_of(t) + "/";
    const std::string hash = hex64(fnv1a(view));
    if (hash != posted) {
      store->set(views[rank], bytes_of(hash));
      posted = hash;
    }
    wait_for(views, "agree on its members");
    const std::vector<std::vector<uint8_t>> seen = store->multiGet(views);
    std::vector<int> behind;
    for (int r = 0; r < size; ++r) {
      if (text_of(seen[r]) != hash) behind.push_back(r);
    }
    if (behind.empty()) {
      for (int r = 0; r < size; ++r) {
        const std::string value = text_of(drawn[r]);
        const size_t bar = value.find('|');
        const std::string theirs = bar == std::string::npos ? "none (another version of cnccl)" : value.substr(bar + 1);
        if (theirs != settings) {
          throw errors::backend_error("cnccl: the ranks of group '" + group_name + "' would build different engines " +
                                      "(CNCCL_CPU_ENGINE, CNCCL_CUDA_ENGINE / Options): rank " + std::to_string(rank) +
                                      " has " + settings + "; rank " + std::to_string(r) + " has " + theirs);
        }
      }
      return c10::make_intrusive<GroupStore>(hash, store);
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      fail("rank(s) " + list(behind) + " to agree on its members: their keys still hold what an earlier group " +
           "of this name left in the store");
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::milliseconds(50));
  }
}

}  // namespace cnccl

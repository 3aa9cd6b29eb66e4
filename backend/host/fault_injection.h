// Faults the fault tests inject at a named point (tests/python/test_faults.py): a rank that SIGKILLs
// itself there, so that a survivor's view of a death mid-transfer is tested where it happens rather
// than wherever a timer lands. Read once per transport from the environment; unset, they cost one
// comparison per message.
#pragma once

#include <csignal>
#include <cstdint>
#include <cstdlib>
#include <string>

namespace cnccl::host::fault_injection {

// `variable` = "<rank>:<n>": the n-th (from 1) event of its kind on that group rank kills it.
// 0 (never) where unset or meant for another rank.
inline uint64_t kill_at(const char* variable, int rank) {
  const char* value = std::getenv(variable);
  if (!value) return 0;
  const std::string text(value);
  const size_t colon = text.find(':');
  if (colon == std::string::npos || std::stoi(text.substr(0, colon)) != rank) return 0;
  return std::stoull(text.substr(colon + 1));
}

// Counts one event; kills this process at the chosen one.
inline void count(uint64_t& seen, uint64_t kill_at) {
  if (kill_at && ++seen == kill_at) std::raise(SIGKILL);
}

// The UCX transport: sends of at least 64 KiB, counted once posted (a rendezvous is in flight).
constexpr const char* kLargeSend = "CNCCL_FAULT_SIGKILL_AT_LARGE_SEND";
constexpr size_t kLargeSendBytes = size_t(64) << 10;
// Shared memory: steps posted (kPosted), counted once this rank's contributions are published.
constexpr const char* kShmStep = "CNCCL_FAULT_SIGKILL_AT_SHM_STEP";

}  // namespace cnccl::host::fault_injection

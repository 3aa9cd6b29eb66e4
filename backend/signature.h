#pragma once
// What ranks compare before a collective moves data (docs/design.md, "Agreement"): the text
// "op(signature)" in a fixed-size header, on every channel (UCX headers, shared-memory slots, the
// gloo engine's allgather).

#include <cstdint>
#include <cstdio>
#include <string>

namespace cnccl {

// A hash every build computes alike (ranks may run different builds of the same version).
inline uint64_t fnv1a(const std::string& text) {
  uint64_t h = 14695981039346656037ull;
  for (unsigned char c : text) h = (h ^ c) * 1099511628211ull;
  return h;
}

// `text` in at most `bytes` - 1 characters. Too long for that (a coalesced call's list), its end
// gives way to a hash of the whole text: two calls that differ only past the cut must still
// disagree, before any of their tensors is written.
inline std::string fit_signature(const std::string& text, size_t bytes) {
  if (text.size() < bytes) return text;
  char digest[24];
  const int n = std::snprintf(digest, sizeof digest, " ... #%016llx", static_cast<unsigned long long>(fnv1a(text)));
  return text.substr(0, bytes - 1 - size_t(n)) + digest;
}

// The text a peer wrote into a fixed-size buffer, up to its first NUL or the buffer's end: a peer's
// bytes are not trusted to be terminated.
inline std::string peer_text(const char* buffer, size_t bytes) {
  size_t n = 0;
  while (n < bytes && buffer[n] != '\0') ++n;
  return std::string(buffer, n);
}

}  // namespace cnccl

// Test data for the host algorithm tests: small integers, so sums are exact in any order.
#pragma once

#include <cstdint>
#include <vector>

namespace cnccl::host::testing {

inline int32_t value(int rank, size_t i) { return int32_t((i * 7 + size_t(rank) * 13) % 1009) - 500; }

inline std::vector<int32_t> contribution(int rank, size_t count) {
  std::vector<int32_t> v(count);
  for (size_t i = 0; i < count; ++i) v[i] = value(rank, i);
  return v;
}

inline int32_t sum_over_ranks(int size, size_t i) {
  int32_t s = 0;
  for (int r = 0; r < size; ++r) s += value(r, i);
  return s;
}

inline void add_int32(void* acc, const void* in, size_t n) {
  auto* a = static_cast<int32_t*>(acc);
  const auto* b = static_cast<const int32_t*>(in);
  for (size_t i = 0; i < n; ++i) a[i] += b[i];
}

}  // namespace cnccl::host::testing

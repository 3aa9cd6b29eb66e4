// What the CPU codec's path tests share: the vector paths this processor has, a guard that restores the
// dispatch, and bit comparisons (compress/codec.h, set_cpu_path).
#pragma once

#include <cmath>
#include <cstring>
#include <vector>

#include "compress/codec.h"

namespace cnccl::compress::testing {

inline std::vector<CpuPath> vector_paths() {
  std::vector<CpuPath> out;
  for (CpuPath path : kCpuPaths) {
    if (path != CpuPath::kScalar && cpu_path_supported(path)) out.push_back(path);
  }
  return out;
}

// The scalar path, then the vector ones.
inline std::vector<CpuPath> all_paths() {
  std::vector<CpuPath> out = vector_paths();
  out.insert(out.begin(), CpuPath::kScalar);
  return out;
}

// Restores the dispatch whatever a test does.
struct PathGuard {
  CpuPath saved = cpu_path();
  ~PathGuard() { set_cpu_path(saved); }
};

template <typename T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0);
}

// The same bits, except that any NaN equals any NaN: which operand's payload an add of two NaNs
// keeps depends on the order the compiler gives a commutative add, in the scalar kernels too.
template <typename T>
bool same_values(const std::vector<T>& a, const std::vector<T>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::isnan(a[i]) && std::isnan(b[i])) continue;
    if (std::memcmp(&a[i], &b[i], sizeof(T)) != 0) return false;
  }
  return true;
}

}  // namespace cnccl::compress::testing

#include <algorithm>

#include "backend/host/algorithms/algorithms.h"

namespace cnccl::host {

Parts Parts::even(size_t count, int parts) {
  Parts p;
  const size_t base = count / parts, extra = count % parts;
  size_t at = 0;
  for (int i = 0; i < parts; ++i) {
    const size_t len = base + (size_t(i) < extra ? 1 : 0);
    p.offset.push_back(at);
    p.length.push_back(len);
    at += len;
  }
  return p;
}

Parts Parts::equal(size_t each, int parts) {
  Parts p;
  for (int i = 0; i < parts; ++i) {
    p.offset.push_back(each * i);
    p.length.push_back(each);
  }
  return p;
}

size_t Parts::max_length() const { return length.empty() ? 0 : *std::max_element(length.begin(), length.end()); }

}  // namespace cnccl::host

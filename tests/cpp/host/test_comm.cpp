// Comm (backend/host/comm.cpp) over the in-memory transport: the signature headers that make
// ranks which called different collectives fail, naming both calls.
#include <gtest/gtest.h>

#include "backend/host/algorithms.h"
#include "memory_transport.h"

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

}  // namespace
}  // namespace cnccl::host::testing

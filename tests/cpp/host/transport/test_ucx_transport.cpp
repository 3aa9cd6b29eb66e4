// The UCX transport's own settings (backend/host/transport/ucx_transport.cpp): rendezvous is turned
// off only where UCX has nothing but TCP between ranks; the transport itself runs under the Python
// suites, between processes.
#include <gtest/gtest.h>

#include "backend/host/transport/ucx_transport.h"

namespace cnccl::host::testing {
namespace {

TEST(UcxTransport, RendezvousIsTurnedOffOnlyWhereEveryLaneIsTcp) {
  for (const char* tls : {"tcp", "tcp,self", "self,tcp"}) EXPECT_TRUE(tcp_on_every_lane(tls)) << tls;
  // UCX's default and "all" bring shared memory and cma on the host (and RDMA where there is any); the
  // others name a lane that is not TCP, or leave one in.
  for (const char* tls : {static_cast<const char*>(nullptr), "", "all", "sm,tcp", "tcp,cma", "posix,sysv,tcp",
                          "rc,tcp", "^rc", "^sm", "tcp,", "tcpx"}) {
    EXPECT_FALSE(tcp_on_every_lane(tls)) << (tls ? tls : "unset");
  }
}

}  // namespace
}  // namespace cnccl::host::testing

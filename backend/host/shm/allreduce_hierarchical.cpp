// Hierarchical allreduce (docs/design.md, "Shared memory"): only each rank's part crosses hosts.
#include "backend/host/shm/shm_algorithms.h"
#include "backend/host/shm/shm_comm.h"
#include "backend/policy.h"

namespace cnccl::host {

void allreduce_hierarchical(ShmComm& shm, Comm& across, const ChunkedReduction& local, const Reducer& reduce) {
  char* mine = local.out + local.parts.offset[shm.rank()] * local.elem;
  ChunkedReduction scatter = local;
  scatter.deliver = ChunkedReduction::kOwn;
  scatter.out = mine;
  reduce_shm(shm, scatter);
  const size_t count = local.parts.length[shm.rank()];
  // Between hosts the part is already in the wire type: the ring, unless the part is latency-bound.
  if (count * local.elem > size_t(kDirectAllreduceMaxBytes)) {
    allreduce_ring(across, mine, count, local.elem, reduce);
  } else {
    allreduce_direct(across, mine, count, local.elem, reduce);
  }
  across.end();
  allgather_shm(shm, local.out, local.parts, local.elem);
}

}  // namespace cnccl::host

#include "backend/host/algorithms/algorithms.h"
#include "backend/host/transport/tags.h"

namespace cnccl::host {

void allreduce_ring(Comm& comm, char* data, size_t count, size_t elem, const Reducer& reduce,
                    const Producer& produce) {
  const Parts parts = Parts::even(count, comm.size());
  reduce_scatter_ring(comm, data, parts, elem, reduce, produce, 0);
  allgather_ring(comm, data, parts, elem, tags::kSecondPhase);
}

}  // namespace cnccl::host

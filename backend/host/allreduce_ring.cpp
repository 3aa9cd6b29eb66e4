#include "backend/host/algorithms.h"

namespace cnccl::host {

void allreduce_ring(Comm& comm, char* data, size_t count, size_t elem, const Reducer& reduce) {
  const Parts parts = Parts::even(count, comm.size());
  reduce_scatter_ring(comm, data, parts, elem, reduce, 0);
  allgather_ring(comm, data, parts, elem, uint32_t(comm.size()));
}

}  // namespace cnccl::host

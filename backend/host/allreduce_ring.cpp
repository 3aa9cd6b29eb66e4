#include "backend/host/algorithms.h"

namespace cnccl::host {

void allreduce_ring(Comm& comm, char* data, size_t count, size_t elem, const Reducer& reduce) {
  const Parts parts = Parts::even(count, comm.size());
  reduce_scatter_ring(comm, data, parts, elem, reduce, 0);
  // The reduce-scatter uses slots below 1 << 15 (at most 16 segments x (size - 1) steps).
  allgather_ring(comm, data, parts, elem, uint32_t(1) << 15);
}

}  // namespace cnccl::host

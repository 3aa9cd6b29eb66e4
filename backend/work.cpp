#include "backend/work.h"

namespace cnccl {

HostWork::HostWork(int rank, c10d::OpType op, uint64_t seq, std::vector<at::Tensor> outputs)
    : c10d::Work(rank, op), seq_(seq), outputs_(std::move(outputs)),
      future_(c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()))) {}

void HostWork::complete() {
  future_->markCompleted(c10::IValue(outputs_));
  finish();
}

void HostWork::fail(std::exception_ptr error) {
  future_->setError(error);
  finish(error);
}

int HostWork::sourceRank() const {
  const int source = source_rank_.load();
  TORCH_CHECK(source >= 0, "cnccl: sourceRank() is only available on a completed receive from any source");
  return source;
}

}  // namespace cnccl

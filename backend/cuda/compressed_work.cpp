#include "backend/cuda/compressed_work.h"

#include <ATen/cuda/CUDAContext.h>

namespace cnccl::cuda {

CompressedWork::CompressedWork(int rank, c10d::OpType type, std::vector<c10::intrusive_ptr<c10d::Work>> inner,
                               c10::intrusive_ptr<c10::ivalue::Future> future,
                               std::shared_ptr<at::cuda::CUDAEvent> restored, std::vector<at::Tensor> outputs)
    : c10d::Work(rank, type), inner_(std::move(inner)), future_(std::move(future)), restored_(std::move(restored)),
      outputs_(std::move(outputs)) {}

bool CompressedWork::isCompleted() {
  for (const auto& w : inner_) {
    if (!w->isCompleted()) return false;
  }
  return restored_->query();
}

bool CompressedWork::isSuccess() const { return exception() == nullptr; }

std::exception_ptr CompressedWork::exception() const {
  for (const auto& w : inner_) {
    if (auto e = w->exception()) return e;
  }
  return nullptr;
}

bool CompressedWork::wait(std::chrono::milliseconds timeout) {
  // The inner waits raise NCCL's errors and apply its blocking-wait timeout, if configured.
  for (const auto& w : inner_) w->wait(timeout);
  restored_->block(at::cuda::getCurrentCUDAStream(restored_->device_index()));
  return true;
}

void CompressedWork::synchronize() { wait(); }

void CompressedWork::abort() {
  for (const auto& w : inner_) w->abort();
}

}  // namespace cnccl::cuda

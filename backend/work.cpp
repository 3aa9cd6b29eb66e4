#include "backend/work.h"

#include <ATen/record_function.h>

#include <unordered_map>

namespace cnccl {
namespace {

// String literals: a profiler range keeps a view of its name until it closes.
const char* range_name(c10d::OpType type) {
  switch (type) {
    case c10d::OpType::BROADCAST: return "cnccl:broadcast";
    case c10d::OpType::ALLREDUCE: return "cnccl:all_reduce";
    case c10d::OpType::ALLREDUCE_COALESCED: return "cnccl:all_reduce_coalesced";
    case c10d::OpType::REDUCE: return "cnccl:reduce";
    case c10d::OpType::ALLGATHER: return "cnccl:all_gather";
    case c10d::OpType::_ALLGATHER_BASE: return "cnccl:all_gather_into_tensor";
    case c10d::OpType::ALLGATHER_COALESCED: return "cnccl:all_gather_coalesced";
    case c10d::OpType::GATHER: return "cnccl:gather";
    case c10d::OpType::SCATTER: return "cnccl:scatter";
    case c10d::OpType::REDUCE_SCATTER: return "cnccl:reduce_scatter";
    case c10d::OpType::_REDUCE_SCATTER_BASE: return "cnccl:reduce_scatter_tensor";
    case c10d::OpType::ALLTOALL_BASE: return "cnccl:all_to_all_single";
    case c10d::OpType::ALLTOALL: return "cnccl:all_to_all";
    case c10d::OpType::SEND: return "cnccl:send";
    case c10d::OpType::RECV: return "cnccl:recv";
    case c10d::OpType::RECVANYSOURCE: return "cnccl:recv_any_source";
    case c10d::OpType::BARRIER: return "cnccl:barrier";
    case c10d::OpType::COALESCED: return "cnccl:coalesced";
    default: return "cnccl:collective";
  }
}

}  // namespace

void profile_collective(c10d::OpType type, const std::vector<at::Tensor>& inputs, const std::string& wire,
                        const c10::intrusive_ptr<c10::ivalue::Future>& future) {
  // The range keeps pointers to its inputs until it ends, on another thread: they live beside it.
  struct Range {
    at::RecordFunction function{at::RecordScope::USER_SCOPE};
    std::vector<c10::IValue> args;
    std::unordered_map<std::string, c10::IValue> kwargs;
  };
  auto range = std::make_shared<Range>();
  if (!range->function.isActive()) return;
  // Completed on another thread, as torch's own collectives' ranges are.
  range->function._setAsync();
  range->args.assign(inputs.begin(), inputs.end());
  range->kwargs.emplace("wire", wire);
  range->function.before(range_name(type), &range->args, &range->kwargs);
  future->addCallback([range](c10::ivalue::Future&) { range->function.end(); });
}

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

bool HostWork::wait(std::chrono::milliseconds timeout) {
  // Only an unbounded wait: a helping thread is bound by the collective's own timeout instead.
  if (help_ && timeout == kNoTimeout && !isCompleted()) help_();
  return c10d::Work::wait(timeout);
}

int HostWork::sourceRank() const {
  const int source = source_rank_.load();
  TORCH_CHECK(source >= 0, "cnccl: sourceRank() is only available on a completed receive from any source");
  return source;
}

WorkList::WorkList(int rank, c10d::OpType op, std::vector<c10::intrusive_ptr<c10d::Work>> works)
    : c10d::Work(rank, op), works_(std::move(works)) {}

bool WorkList::isCompleted() {
  bool done = true;
  for (const auto& w : works_) done = w->isCompleted() && done;
  return done || exception();
}

std::exception_ptr WorkList::exception() const {
  for (const auto& w : works_) {
    if (auto e = w->exception()) return e;
  }
  return nullptr;
}

bool WorkList::wait(std::chrono::milliseconds timeout) {
  for (const auto& w : works_) w->wait(timeout);
  return true;
}

void WorkList::synchronize() {
  for (const auto& w : works_) w->synchronize();
}

void WorkList::abort() {
  for (const auto& w : works_) w->abort();
}

}  // namespace cnccl

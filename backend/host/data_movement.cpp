// The host path's collectives that move data as it is: allgather in all its forms, broadcast,
// gather, scatter, all_to_all and barrier. Each makes its Call and one Step per tensor.
#include "backend/host/host_path.h"
#include "backend/host/shm/shm_algorithms.h"
#include "backend/host/staging.h"
#include "backend/host/transport/comm.h"

namespace cnccl::host {

HostPath::Step HostPath::allgather_step(const at::Tensor& input, const std::vector<at::Tensor>& outputs, char* out) {
  const size_t bytes = input.nbytes();
  const int size = size_, rank = rank_;
  Step step;
  step.workspace_bytes = out ? 0 : bytes * size;
  step.on_shm = all_on_shm();
  step.pre = [=](const Buffers& b) { pack(input, (out ? out : b.workspace) + bytes * rank); };
  step.algorithm = [=, this](const Buffers& b) {
    if (all_on_shm()) return allgather_shm(*shm_, out ? out : b.workspace, Parts::equal(bytes, size), 1);
    allgather_ring(*comm_, out ? out : b.workspace, Parts::equal(bytes, size), 1);
  };
  step.post = [=](const Buffers& b) {
    for (size_t r = 0; r < outputs.size(); ++r) unpack(b.workspace + bytes * r, outputs[r]);
  };
  return step;
}

c10::intrusive_ptr<c10d::Work> HostPath::allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                                   std::vector<at::Tensor>& inputs,
                                                   const c10d::AllgatherOptions& opts) {
  Call call = calls::allgather(outputs, inputs, opts, group());
  Step step = allgather_step(inputs[0], outputs[0]);
  return submit(std::move(call), {std::move(step)});
}

c10::intrusive_ptr<c10d::Work> HostPath::_allgather_base(at::Tensor& output, at::Tensor& input,
                                                         const c10d::AllgatherOptions& opts) {
  Call call = calls::allgather_into_tensor(output, input, opts, group());
  // A contiguous output is the algorithm's buffer itself; any other is unpacked into.
  Step step = allgather_step(input, {}, output.is_contiguous() ? static_cast<char*>(output.data_ptr()) : nullptr);
  if (!output.is_contiguous()) {
    step.post = [output](const Buffers& b) { unpack(b.workspace, output); };
  }
  return submit(std::move(call), {std::move(step)});
}

c10::intrusive_ptr<c10d::Work> HostPath::allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                             std::vector<at::Tensor>& inputs,
                                                             const c10d::AllgatherOptions& opts) {
  Call call = calls::allgather_coalesced(outputs, inputs, opts, group());
  std::vector<Step> steps;
  for (size_t i = 0; i < inputs.size(); ++i) {
    std::vector<at::Tensor> from_each_rank;
    for (int r = 0; r < size_; ++r) from_each_rank.push_back(outputs[r][i]);
    steps.push_back(allgather_step(inputs[i], from_each_rank));
  }
  return submit(std::move(call), std::move(steps));
}

c10::intrusive_ptr<c10d::Work> HostPath::allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                         std::vector<at::Tensor>& inputs,
                                                                         const c10d::AllgatherOptions& opts) {
  Call call = calls::allgather_into_tensor_coalesced(outputs, inputs, opts, group());
  std::vector<Step> steps;
  for (size_t i = 0; i < inputs.size(); ++i) {
    Step step = allgather_step(inputs[i], {});
    step.post = [output = outputs[i]](const Buffers& b) { unpack(b.workspace, output); };
    steps.push_back(std::move(step));
  }
  return submit(std::move(call), std::move(steps));
}

c10::intrusive_ptr<c10d::Work> HostPath::broadcast(std::vector<at::Tensor>& tensors,
                                                   const c10d::BroadcastOptions& opts) {
  Call call = calls::broadcast(tensors, opts, group());
  const at::Tensor t = tensors[0];
  const int root = int(opts.rootRank);
  const bool is_root = rank_ == root;
  Step step;
  step.workspace_bytes = t.nbytes();
  step.pre = [=](const Buffers& b) {
    if (is_root) pack(t, b.workspace);
  };
  step.on_shm = all_on_shm();
  step.algorithm = [=, this](const Buffers& b) {
    if (all_on_shm()) return broadcast_shm(*shm_, b.workspace, t.nbytes(), root);
    broadcast_direct(*comm_, b.workspace, t.nbytes(), root);
  };
  step.post = [=](const Buffers& b) {
    if (!is_root) unpack(b.workspace, t);
  };
  return submit(std::move(call), {std::move(step)});
}

c10::intrusive_ptr<c10d::Work> HostPath::gather(std::vector<std::vector<at::Tensor>>& outputs,
                                                std::vector<at::Tensor>& inputs, const c10d::GatherOptions& opts) {
  Call call = calls::gather(outputs, inputs, opts, group());
  const at::Tensor in = inputs[0];
  const std::vector<at::Tensor> outs = call.outputs;
  const int root = int(opts.rootRank);
  const size_t bytes = in.nbytes();
  Step step;
  step.workspace_bytes = bytes * (rank_ == root ? size_ : 1);
  step.staging_bytes = bytes;
  step.pre = [=](const Buffers& b) { pack(in, b.staging); };
  step.algorithm = [=, this](const Buffers& b) { gather_direct(*comm_, b.staging, bytes, b.workspace, root); };
  step.post = [=](const Buffers& b) {
    for (size_t i = 0; i < outs.size(); ++i) unpack(b.workspace + bytes * i, outs[i]);
  };
  return submit(std::move(call), {std::move(step)});
}

c10::intrusive_ptr<c10d::Work> HostPath::scatter(std::vector<at::Tensor>& outputs,
                                                 std::vector<std::vector<at::Tensor>>& inputs,
                                                 const c10d::ScatterOptions& opts) {
  Call call = calls::scatter(outputs, inputs, opts, group());
  const at::Tensor out = outputs[0];
  const int root = int(opts.rootRank);
  const std::vector<at::Tensor> ins = rank_ == root ? inputs[0] : std::vector<at::Tensor>{};
  const size_t bytes = out.nbytes();
  Step step;
  step.workspace_bytes = bytes;
  step.staging_bytes = bytes * ins.size();
  step.pre = [=](const Buffers& b) {
    for (size_t i = 0; i < ins.size(); ++i) pack(ins[i], b.staging + bytes * i);
  };
  step.algorithm = [=, this](const Buffers& b) { scatter_direct(*comm_, b.staging, b.workspace, bytes, root); };
  step.post = [=](const Buffers& b) { unpack(b.workspace, out); };
  return submit(std::move(call), {std::move(step)});
}

c10::intrusive_ptr<c10d::Work> HostPath::alltoall_base(at::Tensor& output, at::Tensor& input,
                                                       std::vector<int64_t>& output_split_sizes,
                                                       std::vector<int64_t>& input_split_sizes,
                                                       const c10d::AllToAllOptions& opts) {
  AlltoallLayout l;
  Call call = calls::alltoall_single(output, input, output_split_sizes, input_split_sizes, opts, group(), &l);
  Step step;
  step.workspace_bytes = output.nbytes();
  step.staging_bytes = input.nbytes();
  step.pre = [input](const Buffers& b) { pack(input, b.staging); };
  step.algorithm = [this, l](const Buffers& b) {
    alltoall_direct(*comm_, b.staging, l.send_off, l.send_len, b.workspace, l.recv_off, l.recv_len);
  };
  step.post = [output](const Buffers& b) { unpack(b.workspace, output); };
  return submit(std::move(call), {std::move(step)});
}

c10::intrusive_ptr<c10d::Work> HostPath::alltoall(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                                  const c10d::AllToAllOptions& opts) {
  Call call = calls::alltoall(outputs, inputs, opts, group());
  AlltoallLayout l;
  size_t in_total = 0, out_total = 0;
  for (int i = 0; i < size_; ++i) {
    l.send_off.push_back(in_total);
    l.send_len.push_back(inputs[i].nbytes());
    in_total += inputs[i].nbytes();
    l.recv_off.push_back(out_total);
    l.recv_len.push_back(outputs[i].nbytes());
    out_total += outputs[i].nbytes();
  }
  Step step;
  step.workspace_bytes = out_total;
  step.staging_bytes = in_total;
  step.pre = [inputs, l](const Buffers& b) {
    for (size_t i = 0; i < inputs.size(); ++i) pack(inputs[i], b.staging + l.send_off[i]);
  };
  step.algorithm = [this, l](const Buffers& b) {
    alltoall_direct(*comm_, b.staging, l.send_off, l.send_len, b.workspace, l.recv_off, l.recv_len);
  };
  step.post = [outputs, l](const Buffers& b) {
    for (size_t i = 0; i < outputs.size(); ++i) unpack(b.workspace + l.recv_off[i], outputs[i]);
  };
  return submit(std::move(call), {std::move(step)});
}

c10::intrusive_ptr<c10d::Work> HostPath::barrier(const c10d::BarrierOptions& opts) {
  Step step;
  // With shared memory the funnel's signature agreement already waits for every rank.
  step.algorithm = [this](const Buffers&) {
    if (!all_on_shm()) barrier_direct(*comm_);
  };
  return submit(calls::barrier(opts, group()), {std::move(step)});
}

}  // namespace cnccl::host

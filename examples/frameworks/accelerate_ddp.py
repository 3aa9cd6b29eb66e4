"""Hugging Face Accelerate's DDP on backend="cnccl": create the process group, then the Accelerator.

Launch: torchrun --nproc_per_node=2 examples/frameworks/accelerate_ddp.py [--backend gloo --hook bf16] [--out FILE]

Accelerate does not take a third-party backend name on CPU: `InitProcessGroupKwargs(backend="cnccl")`
fails with "Your assigned backend cnccl is not available, please use gloo", because
`PartialState._prepare_backend` (accelerate/state.py) sets `backend = "gloo"` for a multi-CPU run and
`PartialState.__init__` then refuses any other name it was given. What works, on CPU and GPU alike, is
the group Accelerate finds already made: `dist.init_process_group("cnccl")` first, then
`Accelerator(cpu=True)` (since accelerate 1.13 a CPU run needs `cpu=True` or ACCELERATE_USE_CPU=1).
`prepare` wraps the model in DDP on the default group, which is cnccl's; `accelerator.state.backend`
still reports the "gloo" it chose. With `--backend gloo --hook bf16|fp16` it runs the same training on
gloo with Accelerate's own comm-hook setting (DistributedDataParallelKwargs(comm_hook=...)).
"""

import os
import sys

import torch
import torch.distributed as dist
from accelerate import Accelerator
from accelerate.utils import DDPCommunicationHookType, DistributedDataParallelKwargs

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

HOOKS = {"fp16": DDPCommunicationHookType.FP16, "bf16": DDPCommunicationHookType.BF16}


def main():
    args = common.arguments(HOOKS).parse_args()
    dist.init_process_group(args.backend)
    handlers = [DistributedDataParallelKwargs(comm_hook=HOOKS[args.hook])] if args.hook else []
    accelerator = Accelerator(cpu=True, kwargs_handlers=handlers)
    assert accelerator.num_processes == dist.get_world_size() and dist.get_backend() == args.backend
    net = common.model()
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    data = torch.utils.data.DataLoader(common.dataset(dist.get_rank()), batch_size=32)
    # The loader is each rank's own already: Accelerate must not shard it again.
    model, opt = accelerator.prepare(net, opt)
    steps = 0
    while steps < args.steps:
        for x, y in data:
            loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            accelerator.backward(loss)
            opt.step()
            steps += 1
            if steps == args.steps:
                break
    accelerator.print(f"loss {loss.item():.4f} on {dist.get_backend()}")
    common.save(args.out, accelerator.unwrap_model(model).parameters(), loss=loss.item())
    accelerator.end_training()


if __name__ == "__main__":
    main()

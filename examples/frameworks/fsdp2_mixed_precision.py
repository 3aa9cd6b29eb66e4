"""FSDP2 with the mixed precision most recipes use (bf16 parameters, fp32 gradient reduction) on
backend="cnccl" with a bf16 wire and fp32 sums: half the bytes of the fp32 reduce-scatter, the same result.

Launch: torchrun --nproc_per_node=2 examples/frameworks/fsdp2_mixed_precision.py
            [--backend gloo] [--reduce-dtype fp32|bf16] [--steps N] [--out FILE]

With MixedPrecisionPolicy(param_dtype=bfloat16, reduce_dtype=float32) (torchtitan's default) every
local gradient is a bf16 value that FSDP2 casts to fp32 before its reduce-scatter: on a bf16 wire it
travels exactly, and with accumulate="fp32" the ranks' values are summed in fp32 and never rounded to
bf16, so cnccl returns what an fp32 reduce-scatter returns while sending half its bytes (at two ranks
bit for bit: each element is one fp32 add of values scaled by a power of two). A bf16 reduce-scatter
(reduce_dtype=bfloat16) sends as few bytes but rounds the sums to bf16. `--backend gloo` runs the fp32
or bf16 reduce-scatter on gloo for comparison (gloo has no AVG: FSDP2 then sums and divides).
"""

import os
import sys

import torch
import torch.distributed as dist
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def counters(backend):
    """cnccl's bytes sent, and what the same collectives would have sent uncompressed."""
    if backend != "cnccl":
        return 0, 0
    import cnccl

    stats = cnccl.stats()
    return stats["bytes_sent"], stats["bytes_uncompressed"]


def main():
    parser = common.arguments()
    parser.add_argument("--reduce-dtype", choices=sorted(DTYPES), default="fp32")
    args = parser.parse_args()
    if args.backend == "cnccl":
        import cnccl

        options = cnccl.Options(wire_dtype="bf16", accumulate="fp32", min_bytes=0)
        dist.init_process_group("cnccl", pg_options=options)
    else:
        dist.init_process_group(args.backend)
    model = common.model()
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=DTYPES[args.reduce_dtype])
    for layer in [m for m in model if isinstance(m, torch.nn.Linear)] + [model]:
        # Parameters stay gathered from forward to backward: the backward's only collectives are then
        # the gradients' reduce-scatters, whose bytes are counted below.
        fully_shard(layer, mp_policy=policy, reshard_after_forward=False)
    model.set_force_sum_reduction_for_comms(args.backend == "gloo")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    data = torch.utils.data.DataLoader(common.dataset(dist.get_rank()), batch_size=32)
    grads, sent, uncompressed = [], 0, 0
    for step, (x, y) in zip(range(args.steps), data):
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        before = counters(args.backend)
        loss.backward()
        after = counters(args.backend)
        sent += after[0] - before[0]
        uncompressed += after[1] - before[1]
        grads.append([p.grad.full_tensor().float() for p in model.parameters()])
        opt.step()
    params = [p.full_tensor() for p in model.parameters()]
    if dist.get_rank() == 0:
        saved = f", the reduce-scatters sent {sent} of {uncompressed} bytes" if uncompressed else ""
        print(f"loss {loss.item():.4f} on {dist.get_backend()}, reduce_dtype {args.reduce_dtype}{saved}")
    common.save(args.out, params, grads=grads, reduce_scatter_bytes=(sent, uncompressed))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

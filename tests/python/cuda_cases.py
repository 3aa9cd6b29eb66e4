"""cnccl on CUDA tensors, world size 1 on one GPU (run by test_cuda.py; needs a GPU).

Oracles: one cnccl group serves both device types, so each CUDA result is compared with the same
group's result on the CPU copy (host path, CPU codec): at world size 1 both are cast then restore,
which must agree bit for bit. DDP on cnccl is compared with DDP on nccl + the seed hooks.
"""

import copy

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP

import cnccl
from harness import case, gloo_group
from models import Block, train

R = dist.ReduceOp
OPS = {"SUM": R.SUM, "AVG": R.AVG, "PREMUL_SUM": R.PREMUL_SUM, "MIN": R.MIN, "MAX": R.MAX}
N = 300_001  # odd: the vector kernels' scalar tail runs too


def premul(factor):
    return dist._make_nccl_premul_sum(factor)


def op_of(name):
    return premul(0.37) if name == "PREMUL_SUM" else OPS[name]


class Context:
    def __init__(self, rank, world):
        assert world == 1, "the CUDA cases run at world size 1 (one GPU)"
        self.device = torch.device("cuda", 0)
        torch.cuda.set_device(self.device)
        self.groups = {
            "fp16": dist.new_group(backend="cnccl", pg_options=cnccl.Options(wire_dtype="fp16", min_bytes=0)),
            "bf16": dist.new_group(backend="cnccl", pg_options=cnccl.Options(wire_dtype="bf16", min_bytes=0)),
            "none": dist.new_group(backend="cnccl", pg_options=cnccl.Options(wire_dtype="none")),
            "default": dist.group.WORLD,
            "world-sum": dist.new_group(backend="cnccl", pg_options=cnccl.Options(sum_scaling="world", min_bytes=0)),
            "fp64": dist.new_group(backend="cnccl", pg_options=cnccl.Options(compress_fp64=True, min_bytes=0)),
        }
        self.nccl = dist.new_group(backend="nccl")
        self.gloo = gloo_group()
        self.gen = torch.Generator().manual_seed(7)

    def data(self, n, dtype=torch.float32):
        x = torch.randn(n, generator=self.gen, dtype=torch.float64) * 3
        x[:: 97] *= 1e4  # some values beyond fp16's range once summed, some tiny
        x[1::101] *= 1e-6
        return x.to(dtype)


def same(a, b, what):
    a, b = a.cpu(), b.cpu()
    assert a.dtype == b.dtype and a.shape == b.shape, f"{what}: {a.dtype}{tuple(a.shape)} vs {b.dtype}{tuple(b.shape)}"
    equal = torch.equal(a, b) or torch.equal(a.isnan(), b.isnan()) and torch.equal(a[~a.isnan()], b[~b.isnan()])
    assert equal, f"{what}: max diff {(a.double() - b.double()).abs().nan_to_num().max().item()}"


@case
def allreduce_matches_cpu_codec_every_op_wire_option(ctx):
    for gname, g in ctx.groups.items():
        for dtype in (torch.float32, torch.float64, torch.float16):
            for opname in OPS:
                x = ctx.data(N, dtype)
                gpu, cpu = x.to(ctx.device), x.clone()
                dist.all_reduce(gpu, op=op_of(opname), group=g)
                dist.all_reduce(cpu, op=op_of(opname), group=g)
                same(gpu, cpu, f"allreduce {gname} {dtype} {opname}")


@case
def reduce_scatter_matches_cpu_codec(ctx):
    for gname, g in ctx.groups.items():
        for opname in OPS:
            x = ctx.data(N)
            out_gpu, out_cpu = torch.empty(N, device=ctx.device), torch.empty(N)
            dist.reduce_scatter_tensor(out_gpu, x.to(ctx.device), op=op_of(opname), group=g)
            dist.reduce_scatter_tensor(out_cpu, x.clone(), op=op_of(opname), group=g)
            same(out_gpu, out_cpu, f"reduce_scatter_tensor {gname} {opname}")
            out_gpu.zero_()
            dist.reduce_scatter(out_gpu, [x.to(ctx.device)], op=op_of(opname), group=g)
            same(out_gpu, out_cpu, f"reduce_scatter (list) {gname} {opname}")


@case
def coalesced_forms_mix_compressed_and_plain(ctx):
    g = ctx.groups["default"]  # 64 KiB threshold: the small tensor passes through, exactly
    xs = [ctx.data(N), ctx.data(100), ctx.data(N, torch.float16)]
    gpu = [x.to(ctx.device) for x in xs]
    before = cnccl.stats(g)["compressed_collectives"]
    dist.all_reduce_coalesced(gpu, op=R.AVG, group=g)
    assert cnccl.stats(g)["compressed_collectives"] == before + 1
    for i, x in enumerate(xs):
        cpu = x.clone()
        dist.all_reduce(cpu, op=R.AVG, group=g)
        same(gpu[i], cpu, f"allreduce_coalesced tensor {i}")
    outs = [torch.empty(N, device=ctx.device), torch.empty(100, device=ctx.device)]
    # Without device=, the manager takes torch's fast path: one reduce_scatter_tensor_coalesced call.
    with dist._coalescing_manager(group=g, async_ops=True) as cm:
        for o, x in zip(outs, xs[:2]):
            dist.reduce_scatter_tensor(o, x.to(ctx.device), op=R.SUM, group=g)
    cm.wait()
    for o, x in zip(outs, xs[:2]):
        cpu = torch.empty_like(x)
        dist.reduce_scatter_tensor(cpu, x.clone(), group=g)
        same(o, cpu, "reduce_scatter_tensor_coalesced")


@case
def stats_prove_16bit_wire_on_cuda(ctx):
    g = ctx.groups["fp16"]
    s0 = cnccl.stats(g)
    dist.all_reduce(torch.ones(1 << 20, device=ctx.device), group=g)
    s1 = cnccl.stats(g)
    assert s1["compressed_collectives"] - s0["compressed_collectives"] == 1
    assert s1["bytes_sent"] - s0["bytes_sent"] == 2 << 20
    assert s1["bytes_uncompressed"] - s0["bytes_uncompressed"] == 4 << 20


@case
def streams_producer_and_consumer_on_side_streams(ctx):
    g = ctx.groups["fp16"]
    producer, consumer = torch.cuda.Stream(), torch.cuda.Stream()
    for _ in range(20):
        x = ctx.data(1 << 22)
        expected = x.clone()
        dist.all_reduce(expected, group=g)
        with torch.cuda.stream(producer):
            big = torch.randn(2048, 2048, device=ctx.device)
            for _ in range(4):
                big = big @ big / 2048  # keeps the producer busy so ordering bugs show
            t = x.to(ctx.device, non_blocking=False) + big.sum() * 0
        consumer.wait_stream(producer)
        with torch.cuda.stream(consumer):
            work = dist.all_reduce(t, group=g, async_op=True)
            work.wait()
            doubled = t * 2  # consumes the restored tensor on the consumer stream
        torch.cuda.current_stream().wait_stream(consumer)
        same(doubled, expected * 2, "allreduce across producer/consumer streams")
        fut = dist.all_reduce(t, group=g, async_op=True).get_future()
        fut.wait()
        same(fut.value()[0], t, "future holds the caller's tensor")


@case
def many_async_works_in_flight(ctx):
    g = ctx.groups["bf16"]
    xs = [ctx.data(int(n)) for n in torch.randint(1, 1 << 20, (64,), generator=ctx.gen)]
    gpu = [x.to(ctx.device) for x in xs]
    works = [dist.all_reduce(t, op=R.AVG, group=g, async_op=True) for t in gpu]
    for w in works:
        w.wait()
    for i, x in enumerate(xs):
        cpu = x.clone()
        dist.all_reduce(cpu, op=R.AVG, group=g)
        same(gpu[i], cpu, f"async allreduce {i}")


@case
def passthrough_collectives_reach_nccl(ctx):
    g = ctx.groups["fp16"]
    x = torch.arange(10, device=ctx.device, dtype=torch.float32)
    dist.broadcast(x, 0, group=g)
    out = torch.empty(10, device=ctx.device)
    dist.all_gather_into_tensor(out, x, group=g)
    same(out, x, "all_gather_into_tensor")
    i = torch.arange(5, device=ctx.device)
    dist.all_reduce(i, op=R.MAX, group=g)
    same(i, torch.arange(5), "int allreduce passes through")
    out = torch.empty(10, device=ctx.device)
    dist.all_to_all_single(out, x, group=g)
    same(out, x, "all_to_all_single")


@case
def ddp_matches_nccl_with_seed_hooks(ctx):
    for wire, hook in (("fp16", default_hooks.fp16_compress_hook), ("bf16", default_hooks.bf16_compress_hook)):
        torch.manual_seed(0)
        base = Block().to(ctx.device)
        ref = DDP(copy.deepcopy(base), process_group=ctx.nccl)
        ref.register_comm_hook(ctx.nccl, hook)
        ours = DDP(copy.deepcopy(base), process_group=ctx.groups[wire])
        before = cnccl.stats(ctx.groups[wire])["compressed_collectives"]
        ref_grads, ref_params = train(ref, ref.module, 5, ctx.device)
        our_grads, our_params = train(ours, ours.module, 5, ctx.device)
        assert cnccl.stats(ctx.groups[wire])["compressed_collectives"] > before, "DDP's buckets were not compressed"
        for step, (a, b) in enumerate(zip(ref_grads, our_grads)):
            for i, (ga, gb) in enumerate(zip(a, b)):
                same(gb, ga, f"{wire} step {step} grad {i}")
        for i, (pa, pb) in enumerate(zip(ref_params, our_params)):
            same(pb, pa, f"{wire} param {i}")


@case
def fsdp2_trains_on_cnccl_and_its_reduce_scatter_ops_compress(ctx):
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard

    g = ctx.groups["fp16"]
    torch.manual_seed(0)
    base = Block().to(ctx.device)
    model = copy.deepcopy(base)
    for layer in (model.mlp, model):
        fully_shard(layer, mesh=DeviceMesh.from_group(g, "cuda"))
    _, params = train(model, model, 3, ctx.device)
    ref = copy.deepcopy(base)
    _, ref_params = train(ref, ref, 3, ctx.device)
    for i, (p, r) in enumerate(zip(params, ref_params)):
        same(p.full_tensor() if hasattr(p, "full_tensor") else p, r, f"fsdp2 param {i}")
    # FSDP2 skips its reduce-scatter at world size 1, so its ops are exercised directly.
    for op in (R.AVG, premul(0.5), R.SUM):
        x = ctx.data(N)
        out_gpu, out_cpu = torch.empty(N, device=ctx.device), torch.empty(N)
        before = cnccl.stats(g)["compressed_collectives"]
        dist.reduce_scatter_tensor(out_gpu, x.to(ctx.device), op=op, group=g)
        assert cnccl.stats(g)["compressed_collectives"] == before + 1
        dist.reduce_scatter_tensor(out_cpu, x, op=op, group=g)
        same(out_gpu, out_cpu, f"FSDP-style reduce_scatter {op}")

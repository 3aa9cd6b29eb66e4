"""CUDA tensors at 2, 3 and 4 ranks sharing one GPU, through cuda_engine=gloo (gloo stages CUDA tensors
through host memory; NCCL refuses two ranks on one device), so that one GPU runs the owners' sums, the
chunked all-to-alls and the gathers of frames with several ranks' bytes. Skips, naming why, without a GPU.

Oracles: each group has cpu_engine=gloo too, so the same group computes the same call on CPU tensors with
cnccl's CPU kernels over the same engine; a CUDA result must equal that CPU result bit for bit, and the
CPU suites hold those to the emulation of wire_formats.py (test_accumulate, test_scaling, test_mx,
test_nvfp4). The fp32 sums and pow2 frames are also compared with that emulation here. The one exception
is accumulate=wire past two ranks, where the engine's own 16-bit adds round in an order of its choosing:
there both results are held to the bound of (world - 1) roundings of the wire type on the sum of
magnitudes.
"""

import copy

import pytest
import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP

import cnccl
from harness import CASE_TIMEOUT, Cases, cached_job, check_case, everyones, gloo_group
from models import Block, train
from wire_formats import framed_allreduce, framed_owner_sum, rank_order_sum

case = Cases()
WORLD_SIZES = [2, 3, 4]
R = dist.ReduceOp
SEED = 0x5EED_0000_0000_0003
# name: the group's Options fields (besides cuda_engine=gloo, cpu_engine=gloo, min_bytes=0)
WIRES = {
    "fp16": dict(wire_dtype="fp16"),
    "bf16": dict(wire_dtype="bf16"),
    "fp16-fp32sum": dict(wire_dtype="fp16", accumulate="fp32"),
    "bf16-fp32sum": dict(wire_dtype="bf16", accumulate="fp32"),
    "fp16-sr": dict(wire_dtype="fp16", accumulate="fp32", rounding="sr", sr_seed=SEED),
    "fp16-pow2": dict(wire_dtype="fp16", accumulate="fp32", scaling="pow2"),
    "bf16-pow2": dict(wire_dtype="bf16", accumulate="fp32", scaling="pow2"),
    "e4m3": dict(wire_dtype="e4m3", accumulate="fp32", scaling="pow2"),
    "e5m2": dict(wire_dtype="e5m2", accumulate="fp32", scaling="pow2"),
    "mxfp8": dict(wire_dtype="mxfp8", accumulate="fp32"),
    "mxfp8_e5m2": dict(wire_dtype="mxfp8_e5m2", accumulate="fp32"),
    "mxfp4": dict(wire_dtype="mxfp4", accumulate="fp32"),
    "mxfp8-floor": dict(wire_dtype="mxfp8", accumulate="fp32", mx_scale="floor"),
    "mxfp4-floor": dict(wire_dtype="mxfp4", accumulate="fp32", mx_scale="floor"),
    "mxfp8-sr": dict(wire_dtype="mxfp8", accumulate="fp32", rounding="sr", sr_seed=SEED),
    "mxfp4-sr": dict(wire_dtype="mxfp4", accumulate="fp32", rounding="sr", sr_seed=SEED),
    "nvfp4": dict(wire_dtype="nvfp4", accumulate="fp32"),
    "nvfp4-sr": dict(wire_dtype="nvfp4", accumulate="fp32", rounding="sr", sr_seed=SEED),
}
UNIT_ROUNDOFF = {"fp16": 2.0**-11, "bf16": 2.0**-8}
SIZES = [1, 5_040, 100_003]  # one element; a size every world divides; one none here divides


class Context:
    def __init__(self, rank, world):
        self.rank, self.world = rank, world
        self.device = torch.device("cuda", 0)  # every rank on the one GPU
        torch.cuda.set_device(self.device)
        self.gloo = gloo_group()
        self.gen = torch.Generator().manual_seed(41 + rank)
        self.groups = {}

    def group(self, name, **extra):
        key = (name, tuple(sorted(extra.items())))
        if key not in self.groups:
            self.groups[key] = dist.new_group(backend="cnccl", timeout=CASE_TIMEOUT, pg_options=cnccl.Options(
                cuda_engine="gloo", cpu_engine="gloo", min_bytes=0, **WIRES[name], **extra))
        return self.groups[key]

    def data(self, n):
        """In range of every wire once summed over 4 ranks, with magnitudes across decades and a few zeros."""
        x = torch.randn(n, generator=self.gen) * torch.pow(10.0, torch.empty(n).uniform_(-3, 2, generator=self.gen))
        x[::1009] = 0.0
        return x


def exact_in_rank_order(name, wire):
    return "fp32sum" in name or name.endswith("-sr") or wire not in UNIT_ROUNDOFF


def check_same(got, want, what):
    bad = (got.view(torch.int32) != want.view(torch.int32)).nonzero()
    assert bad.numel() == 0, (f"{what}: {bad.numel()} of {got.numel()} elements differ, first at {bad[0].item()}: "
                              f"{got[bad[0]].item()!r} != {want[bad[0]].item()!r}")


def check_within_wire_bound(got, contributions, wire, world, what):
    """accumulate=wire: each of the world - 1 adds rounds to the wire type, so |got - exact| is at most
    (world - 1) * u * (sum of the contributions' magnitudes), u the wire's unit roundoff; the contributions
    are the inputs already cast to the wire (their casts are the same on both devices)."""
    cast = torch.stack([c.to(getattr(torch, "float16" if wire == "fp16" else "bfloat16")).double() for c in contributions])
    exact, magnitude = cast.sum(0), cast.abs().sum(0)
    excess = (got.double() - exact).abs() - (world - 1) * UNIT_ROUNDOFF[wire] * magnitude
    assert excess.max().item() <= 0, f"{what}: {(excess > 0).sum().item()} elements past the bound"


def allreduce_both(ctx, g, x, op):
    on_cpu, on_gpu = x.clone(), x.to(ctx.device)
    dist.all_reduce(on_cpu, op=op, group=g)
    dist.all_reduce(on_gpu, op=op, group=g)
    return on_cpu, on_gpu.cpu()


def reduce_scatter_both(ctx, g, x, op):
    n = x.numel() // ctx.world
    on_cpu, on_gpu = torch.empty(n), torch.empty(n, device=ctx.device)
    dist.reduce_scatter_tensor(on_cpu, x, op=op, group=g)
    dist.reduce_scatter_tensor(on_gpu, x.to(ctx.device), op=op, group=g)
    return on_cpu, on_gpu.cpu()


def compare(ctx, name, got_cpu, got_gpu, inputs, what):
    wire = WIRES[name]["wire_dtype"]
    if ctx.world == 2 or exact_in_rank_order(name, wire):
        check_same(got_gpu, got_cpu, what)  # two ranks: one add, rounded once, in either order
    else:
        check_within_wire_bound(got_gpu, inputs, wire, ctx.world, what + " (GPU)")
        check_within_wire_bound(got_cpu, inputs, wire, ctx.world, what + " (CPU)")


@case
def every_wire_allreduce_and_reduce_scatter_equal_the_cpu_path(ctx):
    for name in WIRES:
        g = ctx.group(name)
        for op in (R.SUM, R.AVG):
            for n in SIZES:
                x = ctx.data(n)
                got_cpu, got_gpu = allreduce_both(ctx, g, x, op)
                # AVG's scale is applied as a multiply by fp32(1 / world) before the cast (docs/design.md).
                pre = 1.0 / ctx.world if op == R.AVG else 1.0
                compare(ctx, name, got_cpu, got_gpu, [v * pre for v in everyones(x, ctx.gloo)],
                        f"allreduce {name} {op} n={n}")
                x = ctx.data(n * ctx.world)
                got_cpu, got_gpu = reduce_scatter_both(ctx, g, x, op)
                parts = [v.chunk(ctx.world)[ctx.rank] * pre for v in everyones(x, ctx.gloo)]
                compare(ctx, name, got_cpu, got_gpu, parts, f"reduce_scatter {name} {op} n={n}")


@case
def fp32_sums_and_frames_equal_the_emulation(ctx):
    """Directly, besides through the CPU path: the owner's fp32 sum in rank order, rounded once to the wire
    (allreduce) or not at all (reduce_scatter), and pow2 frames (wire_formats.framed_*)."""
    for name, wire in (("fp16-fp32sum", "fp16"), ("bf16-fp32sum", "bf16")):
        x = ctx.data(100_003)
        t = x.to(ctx.device)
        dist.all_reduce(t, group=ctx.group(name))
        want = rank_order_sum(everyones(x, ctx.gloo), wire).to(getattr(torch, "float16" if wire == "fp16" else "bfloat16"))
        check_same(t.cpu(), want.float(), f"allreduce {name}")
    for name, wire in (("fp16-pow2", "fp16"), ("e4m3", "e4m3"), ("e5m2", "e5m2")):
        x = ctx.data(100_003)
        t = x.to(ctx.device)
        dist.all_reduce(t, group=ctx.group(name))
        check_same(t.cpu(), framed_allreduce(everyones(x, ctx.gloo), wire, 1.0), f"allreduce {name}")
        x = ctx.data(5_040 * ctx.world)
        out = torch.empty(5_040, device=ctx.device)
        dist.reduce_scatter_tensor(out, x.to(ctx.device), group=ctx.group(name))
        parts = [v.chunk(ctx.world)[ctx.rank] for v in everyones(x, ctx.gloo)]
        check_same(out.cpu(), framed_owner_sum(parts, wire, 1.0), f"reduce_scatter {name}")


@case(budget=240)
def sizes_past_the_chunked_all_to_all(ctx):
    """Past 8 MiB of frames the all-to-all to the owners goes in chunks (docs/design.md, "Memory")."""
    for name, wire_bytes in (("fp16-fp32sum", 2), ("e4m3", 1), ("mxfp8", 1), ("nvfp4-sr", 0.5)):
        n = int((9 << 20) / wire_bytes) + 12_345
        x = ctx.data(n)
        got_cpu, got_gpu = allreduce_both(ctx, ctx.group(name), x, R.SUM)
        check_same(got_gpu, got_cpu, f"allreduce {name} n={n}")


@case
def empty_odd_and_strided_tensors_behave_as_on_the_cpu(ctx):
    for name in WIRES:
        g = ctx.group(name)
        empty = torch.empty(0, device=ctx.device)
        dist.all_reduce(empty, group=g)  # an MX wire's empty frames have no bytes
        out = torch.empty(0, device=ctx.device)
        dist.reduce_scatter_tensor(out, torch.empty(0, device=ctx.device), group=g)
        assert empty.numel() == 0 and out.numel() == 0, name
        exact = ctx.world == 2 or exact_in_rank_order(name, WIRES[name]["wire_dtype"])
        for n in (7, 33, 1_025):
            got_cpu, got_gpu = allreduce_both(ctx, g, ctx.data(n), R.SUM)
            if exact:
                check_same(got_gpu, got_cpu, f"allreduce {name} n={n}")
        base = ctx.data(2_002)
        outcomes = []
        for t in (base.clone()[::2], base.to(ctx.device)[::2]):
            try:
                dist.all_reduce(t, group=g)
                outcomes.append(("ok", t.cpu()))
            except Exception as e:  # noqa: BLE001 - the CPU path's outcome, whatever it is, is the oracle
                outcomes.append((type(e).__name__, str(e).split(" on ")[0]))
        (cpu_kind, cpu_what), (gpu_kind, gpu_what) = outcomes
        assert cpu_kind == gpu_kind, f"{name} strided: CPU {cpu_kind} {cpu_what}, GPU {gpu_kind} {gpu_what}"
        if cpu_kind == "ok" and exact:
            check_same(gpu_what, cpu_what, f"{name} strided")


@case(min_world=2, only=(lambda world, engine: world == 2, "DDP bit for bit at two ranks (one add, rounded once)"))
def ddp_on_one_gpu_matches_gloo_with_the_bf16_hook(ctx):
    """As the CPU parity test (test_parity.py) at two ranks: DDP on cnccl's bf16 wire equals DDP on gloo with
    bf16_compress_hook, both on the one GPU."""
    torch.manual_seed(0)
    base = Block().to(ctx.device)
    ref = DDP(copy.deepcopy(base), process_group=ctx.gloo)
    ref.register_comm_hook(ctx.gloo, default_hooks.bf16_compress_hook)
    g = ctx.group("bf16")
    ours = DDP(copy.deepcopy(base), process_group=g)
    before = cnccl.stats(g)["compressed_collectives"]
    ref_grads, ref_params = train(ref, ref.module, 4, ctx.device)
    our_grads, our_params = train(ours, ours.module, 4, ctx.device)
    assert cnccl.stats(g)["compressed_collectives"] > before, "DDP's buckets were not compressed"
    for step, (a, b) in enumerate(zip(ref_grads, our_grads)):
        for i, (ga, gb) in enumerate(zip(a, b)):
            check_same(gb.cpu(), ga.cpu(), f"step {step} grad {i}")
    for i, (pa, pb) in enumerate(zip(ref_params, our_params)):
        check_same(pb.cpu(), pa.cpu(), f"param {i}")


@case
def what_gloo_cannot_do_on_cuda_is_refused_by_name(ctx):
    g = ctx.group("fp16")
    x = ctx.data(1_000).to(ctx.device)
    with pytest.raises(ValueError, match="allreduce_coalesced on CUDA tensors with cuda_engine=gloo"):
        cnccl.backend(g).allreduce_coalesced([x, x.clone()], dist.AllreduceCoalescedOptions())
    with pytest.raises(ValueError, match="send on CUDA tensors with cuda_engine=gloo: gloo's point-to-point"):
        dist.send(x, (ctx.rank + 1) % ctx.world, group=g)
    # torch's manager sends the calls of its body as one allreduce_coalesced, in a window on `device`.
    with pytest.raises(ValueError, match="allreduce_coalesced on CUDA tensors with cuda_engine=gloo"):
        with dist._coalescing_manager(group=g, device=ctx.device):
            dist.all_reduce(x, group=g)
    g._start_coalescing(ctx.device)  # a window, as torch's batch_isend_irecv opens one
    with pytest.raises(ValueError, match="broadcast on CUDA tensors with cuda_engine=gloo: gloo has no coalescing"):
        dist.broadcast(x, 0, group=g)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(ValueError, match="cuda_engine=gloo.*CUDA graph"):
        with torch.cuda.stream(side), torch.cuda.graph(graph):
            dist.all_reduce(x, group=g)
    torch.cuda.synchronize()
    # The group goes on after the refusals.
    got_cpu, got_gpu = allreduce_both(ctx, g, ctx.data(1_000), R.SUM)
    if ctx.world == 2:
        check_same(got_gpu, got_cpu, "after the refusals")


@case
def telemetry_counts_equal_the_cpu_census(ctx):
    """The CUDA kernels count on the GPU what the CPU kernels count on the host, call for call."""
    for name in ("fp16-fp32sum", "e4m3", "mxfp8", "nvfp4-sr"):
        g = ctx.group(name, telemetry="counts")
        x = ctx.data(50_000)
        x[5::701] = float("inf")
        x[9::907] = 1e30  # past every wire's range
        counted = []
        for device in ("cuda", "cpu"):
            before = cnccl.stats(g)
            t = x.to(device)
            dist.all_reduce(t, group=g)
            torch.cuda.synchronize()
            after = cnccl.stats(g)
            counted.append({k: after[k] - before[k] for k in ("cast_nonfinite", "cast_saturated")})
        assert counted[0] == counted[1] and counted[0]["cast_nonfinite"] > 0, f"{name}: GPU {counted[0]}, CPU {counted[1]}"


@case
def the_group_says_gloo_carries_cuda_tensors(ctx):
    config = cnccl.config(ctx.group("fp16"))
    assert config["cuda_engine"] == "gloo" and config["cpu_engine"] == "gloo", config


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU on this machine")
@pytest.mark.parametrize("world_size", WORLD_SIZES)
@pytest.mark.parametrize("name", case.names())
def test_cuda_ranks(name, world_size):
    check_case(cached_job(__name__, world_size), name, world_size, case)

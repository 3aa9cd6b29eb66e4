"""cnccl on CUDA tensors, world size 1 on one GPU: one job as configured by default,\none with TORCH_NCCL_BLOCKING_WAIT=1. Skips, naming why, without a GPU.

Oracles are plain torch ops on the GPU, written here: at world size 1 NCCL's reduction of one rank is
that rank's value, so a compressed result must be exactly `(x * fp32(f)).to(wire).to(dtype) * post`, and
a tensor that passes through must be exactly what NCCL computes on it (`x`, or `x * f` in x's dtype for
PREMUL_SUM). Race windows are widened: the input is produced after a GPU sleep on the caller's stream,
and the caching allocator is made to hand out memory right after each call.
DDP on cnccl is compared with DDP on NCCL (the engine cnccl composes) + the seed hooks.
"""

import copy
import os

import pytest
import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP

import cnccl
from cnccl import _C
from harness import Cases, cached_job, check_case, gloo_group
from models import Block, train
from wire_formats import (ANY_OWNER, CONTRIBUTION, FRAME_DTYPE, RESULT, framed_allreduce, framed_owner_sum, random_bits,
                          stochastic_round)

case = Cases()

R = dist.ReduceOp
FACTOR = 0.37
OPS = ["SUM", "AVG", "PREMUL_SUM", "PREMUL_SUM tensor", "MIN", "MAX"]
N = 300_001  # odd: the vector kernels' scalar tail runs too
WIRES = {"fp16": torch.float16, "bf16": torch.bfloat16}
# The engine cnccl composes: the legacy ProcessGroupNCCL ("nccl-legacy" in torch 2.15, "nccl" before).
NCCL = "nccl-legacy" if "nccl-legacy" in dist.Backend.backend_list else "nccl"
SLEEP_CYCLES = 20_000_000  # ~10 ms on a current GPU


def op_of(name, device, dtype=torch.float32):
    if name == "PREMUL_SUM":
        return dist._make_nccl_premul_sum(FACTOR)
    if name == "PREMUL_SUM tensor":  # in the input's dtype, as NCCL's PreMulSum takes it
        return dist._make_nccl_premul_sum(torch.tensor([FACTOR], dtype=dtype, device=device))
    return {"SUM": R.SUM, "AVG": R.AVG, "MIN": R.MIN, "MAX": R.MAX}[name]


def fp32(v):
    return torch.tensor(v, dtype=torch.float32).item()


class Context:
    def __init__(self, rank, world):
        assert world == 1, "the CUDA cases run at world size 1 (one GPU)"
        self.device = torch.device("cuda", 0)
        torch.cuda.set_device(self.device)
        # name -> (group, wire dtype or None, compresses fp64, min_bytes)
        self.groups = {
            "fp16": (dist.new_group(backend="cnccl", pg_options=cnccl.Options(wire_dtype="fp16", min_bytes=0)),
                     torch.float16, False, 0),
            "bf16": (dist.new_group(backend="cnccl", pg_options=cnccl.Options(wire_dtype="bf16", min_bytes=0)),
                     torch.bfloat16, False, 0),
            "none": (dist.new_group(backend="cnccl", pg_options=cnccl.Options(wire_dtype="none")), None, False, 0),
            "default": (dist.group.WORLD, torch.float16, False, 65536),
            "fp64": (dist.new_group(backend="cnccl", pg_options=cnccl.Options(compress_fp64=True, min_bytes=0)),
                     torch.float16, True, 0),
            # fp32 sums: an all-to-all, the sum kernel and an allgather (reduce_scatter: the all-to-all
            # and the sum as its restore). One rank's sum is its own 16-bit value: the wire's result.
            "fp16-acc32": (dist.new_group(backend="cnccl", pg_options=cnccl.Options(
                wire_dtype="fp16", min_bytes=0, accumulate="fp32")), torch.float16, False, 0),
        }
        self.nccl = dist.new_group(backend=NCCL)
        self.gloo = gloo_group()
        self.gen = torch.Generator().manual_seed(7)

    def data(self, n, dtype=torch.float32):
        x = torch.randn(n, generator=self.gen, dtype=torch.float64) * 3
        x[::97] *= 1e4  # beyond fp16's range once some are summed; scaled back in range by AVG/PREMUL
        x[1::101] *= 1e-6  # fp16 subnormals
        return x.to(dtype).to(self.device)


def expected(x, op_name, group_name, ctx):
    """What cnccl must give for x at world size 1, in plain torch on the GPU."""
    _, wire, fp64, min_bytes = ctx.groups[group_name]
    factor = FACTOR if op_name.startswith("PREMUL") else 1.0
    compressed = wire is not None and x.nbytes >= min_bytes and (
        x.dtype == torch.float32 or (x.dtype == torch.float64 and fp64))
    if compressed:
        return (x * fp32(factor)).to(wire).to(x.dtype)
    if factor != 1.0:  # NCCL's PreMulSum: the factor in x's dtype, one multiply rounded in x's dtype
        return x * torch.tensor(factor, dtype=x.dtype, device=x.device)
    return x.clone()


def same(got, want, what):
    assert got.dtype == want.dtype and got.shape == want.shape, f"{what}: {got.dtype}{tuple(got.shape)} vs {want.dtype}"
    ok = torch.equal(got.isnan(), want.isnan()) and torch.equal(got[~got.isnan()], want[~want.isnan()])
    assert ok, f"{what}: max diff {(got.double() - want.double()).abs().nan_to_num().max().item()}"


def late(x):
    """x, produced on the caller's stream only after a GPU sleep: a cast not ordered after it reads garbage."""
    torch.cuda._sleep(SLEEP_CYCLES)
    return x * 1


def churn(like):
    """Allocations right after a call: the caching allocator must not hand out buffers still in use."""
    return [torch.full_like(like, float("nan")) for _ in range(4)]


@case
def allreduce_every_op_wire_dtype_sync_and_async(ctx):
    for gname, (g, _, _, _) in ctx.groups.items():
        for dtype in (torch.float32, torch.float64, torch.float16):
            for op_name in OPS:
                for async_op in (False, True):
                    x = ctx.data(N, dtype)
                    t = late(x)
                    work = dist.all_reduce(t, op=op_of(op_name, ctx.device, dtype), group=g, async_op=async_op)
                    junk = churn(t)
                    if async_op:
                        work.wait()
                    # Synchronous: the current stream already sees the result, with no wait.
                    doubled = t * 2
                    what = f"allreduce {gname} {dtype} {op_name} {'async' if async_op else 'sync'}"
                    same(doubled, expected(x, op_name, gname, ctx) * 2, what)
                    del junk


def passes_through(x, group_name, ctx):
    _, wire, fp64, min_bytes = ctx.groups[group_name]
    return not (wire is not None and x.nbytes >= min_bytes and
                (x.dtype == torch.float32 or (x.dtype == torch.float64 and fp64)))


def nccl_reduce_scatter(x, op_name, ctx):
    """What torch's ProcessGroupNCCL gives: an uncompressed call is passed to it as it came. At world
    size 1, NCCL 2.28.9's reduce-scatter with a PreMulSum of a Python number was seen on an H200 not
    to equal x times the factor (its allreduce does), so the engine itself is the oracle there."""
    out = torch.empty_like(x)
    dist.reduce_scatter_tensor(out, x.clone(), op=op_of(op_name, ctx.device), group=ctx.nccl)
    return out


@case
def reduce_scatter_forms(ctx):
    for gname, (g, _, _, _) in ctx.groups.items():
        for op_name in OPS:
            x = ctx.data(N)
            if passes_through(x, gname, ctx):
                want = nccl_reduce_scatter(x, op_name, ctx)
            else:
                want = expected(x, op_name, gname, ctx)
            out = torch.empty(N, device=ctx.device)
            dist.reduce_scatter_tensor(out, late(x), op=op_of(op_name, ctx.device), group=g)
            junk = churn(out)
            same(out, want, f"reduce_scatter_tensor {gname} {op_name}")
            out = torch.empty(N, device=ctx.device)
            dist.reduce_scatter(out, [late(x)], op=op_of(op_name, ctx.device), group=g)
            same(out, want, f"reduce_scatter (list) {gname} {op_name}")
            outs = [torch.empty(N, device=ctx.device), torch.empty(N, device=ctx.device)]
            with dist._coalescing_manager(group=g, async_ops=True) as cm:
                for o in outs:
                    dist.reduce_scatter_tensor(o, late(x), op=op_of(op_name, ctx.device), group=g)
            cm.wait()
            for o in outs:
                same(o, want, f"reduce_scatter_tensor_coalesced {gname} {op_name}")
            del junk


@case
def coalesced_allreduce_mixes_compressed_and_plain(ctx):
    g = ctx.groups["default"][0]  # 64 KiB threshold: the small tensor passes through, exactly
    xs = [ctx.data(N), ctx.data(100)]
    ts = [late(x) for x in xs]
    before = cnccl.stats(g)["compressed_collectives"]
    dist.all_reduce_coalesced(ts, op=R.AVG, group=g)
    assert cnccl.stats(g)["compressed_collectives"] == before + 1
    for i, (t, x) in enumerate(zip(ts, xs)):
        same(t, expected(x, "AVG", "default", ctx), f"allreduce_coalesced tensor {i}")


@case
def future_holds_the_restored_callers_tensor(ctx):
    g = ctx.groups["fp16"][0]
    x = ctx.data(N)
    t = late(x)
    fut = dist.all_reduce(t, group=g, async_op=True).get_future()
    junk = churn(t)
    value = fut.wait()[0]
    assert value.data_ptr() == t.data_ptr(), "the future holds the caller's own tensor"
    same(value, expected(x, "SUM", "fp16", ctx), "future value")
    del junk


@case
def block_current_stream_orders_a_consumer(ctx):
    g = ctx.groups["bf16"][0]
    x = ctx.data(N)
    t = late(x)
    work = dist.all_reduce(t, group=g, async_op=True)
    work.block_current_stream()
    same(t * 1, expected(x, "SUM", "bf16", ctx), "after block_current_stream")


@case
def producer_and_consumer_on_other_streams(ctx):
    g = ctx.groups["fp16"][0]
    producer, consumer = torch.cuda.Stream(), torch.cuda.Stream()
    for _ in range(10):
        x = ctx.data(1 << 22)
        with torch.cuda.stream(producer):
            t = late(x)
        consumer.wait_stream(producer)
        with torch.cuda.stream(consumer):
            work = dist.all_reduce(t, group=g, async_op=True)
            junk = churn(t)
            work.wait()
            doubled = t * 2  # consumes the restored tensor on the consumer stream
        torch.cuda.current_stream().wait_stream(consumer)
        same(doubled, expected(x, "SUM", "fp16", ctx) * 2, "allreduce across producer/consumer streams")
        del junk


@case
def many_async_works_in_flight(ctx):
    g = ctx.groups["bf16"][0]
    xs = [ctx.data(int(n)) for n in torch.randint(1, 1 << 20, (64,), generator=ctx.gen)]
    ts = [late(x) for x in xs]
    works = [dist.all_reduce(t, op=R.AVG, group=g, async_op=True) for t in ts]
    junk = [churn(t) for t in ts]
    for w in works:
        w.wait()
    for i, (t, x) in enumerate(zip(ts, xs)):
        same(t, expected(x, "AVG", "bf16", ctx), f"async allreduce {i}")
    del junk


@case
def cuda_graph_capture(ctx):
    g = ctx.groups["fp16"][0]
    x = ctx.data(N)
    static = x.clone()
    dist.all_reduce(static.clone(), group=g)  # the communicator exists before the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side), torch.cuda.graph(graph):
        dist.all_reduce(static, op=dist._make_nccl_premul_sum(FACTOR), group=g)
    for _ in range(2):
        static.copy_(x)
        graph.replay()
        torch.cuda.synchronize()
        same(static, expected(x, "PREMUL_SUM", "fp16", ctx), "replayed capture")
    # A CUDA tensor factor is read by the kernels on the device: captured, each replay reads its value then.
    factor = torch.tensor([FACTOR], device=ctx.device)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(side), torch.cuda.graph(graph):
        dist.all_reduce(static, op=dist._make_nccl_premul_sum(factor), group=g)
    for value in (FACTOR, 2.5):
        factor.fill_(value)
        static.copy_(x)
        graph.replay()
        torch.cuda.synchronize()
        same(static, (x * fp32(value)).to(torch.float16).float(), f"replayed capture, tensor factor {value}")


@case
def stats_prove_16bit_wire_on_cuda(ctx):
    g = ctx.groups["fp16"][0]
    s0 = cnccl.stats(g)
    dist.all_reduce(torch.ones(1 << 20, device=ctx.device), group=g)
    s1 = cnccl.stats(g)
    assert s1["compressed_collectives"] - s0["compressed_collectives"] == 1
    assert s1["bytes_sent"] - s0["bytes_sent"] == 2 << 20
    assert s1["bytes_uncompressed"] - s0["bytes_uncompressed"] == 4 << 20


@case
def stochastic_rounding_on_the_gpu_equals_the_cpu_emulation(ctx):
    # A fresh group numbers its stochastic reductions from 0. At world size 1 the sum of one 16-bit
    # contribution is on the wire's grid already: its own rounding leaves it.
    seed = 0xC0FFEE_0000_1234
    for wire in WIRES:
        g = dist.new_group(backend="cnccl", pg_options=cnccl.Options(
            wire_dtype=wire, min_bytes=0, accumulate="fp32", rounding="sr", sr_seed=seed))
        x = ctx.data(N)
        host = x.cpu()
        for seq, op in enumerate((R.SUM, R.AVG)):
            t = late(x)
            dist.all_reduce(t, op=op, group=g)
            contribution = stochastic_round(host, random_bits(0, N, seed, seq, 0, CONTRIBUTION), wire)
            summed = stochastic_round(contribution.float(), random_bits(0, N, seed, seq, ANY_OWNER, RESULT), wire)
            assert torch.equal(summed, contribution)
            same(t.cpu(), contribution.float(), f"allreduce sr {wire} seq {seq}")
        out = torch.empty(N, device=ctx.device)
        dist.reduce_scatter_tensor(out, late(x), group=g)
        same(out.cpu(), stochastic_round(host, random_bits(0, N, seed, 2, 0, CONTRIBUTION), wire).float(),
             f"reduce_scatter sr {wire}")


@case
def pow2_frames_on_the_gpu_equal_the_cpu_emulation(ctx):
    """Frames are CUDA kernels on the tensor's device (compress/cuda/frames.cu): NCCL moves them as bytes,
    and the bits are the emulation's (wire_formats.py), fp8 included, on any GPU architecture; a tensor
    of 4M elements sends its fp16 frames to the owners in eight chunks."""
    for wire in FRAME_DTYPE:
        g = dist.new_group(backend="cnccl", pg_options=cnccl.Options(
            wire_dtype=wire, min_bytes=0, accumulate="fp32", scaling="pow2"))
        for n in (N, (1 << 22) + 5) if wire == "fp16" else (N,):
            x = ctx.data(n)
            host = x.cpu()
            for op, pre in ((R.SUM, 1.0), (R.AVG, 1.0)):
                t = late(x)
                dist.all_reduce(t, op=op, group=g)
                same(t.cpu(), framed_allreduce([host], wire, pre), f"allreduce pow2 {wire} {op} {n}")
            out = torch.empty(n, device=ctx.device)
            dist.reduce_scatter_tensor(out, late(x), group=g)
            same(out.cpu(), framed_owner_sum([host], wire, 1.0), f"reduce_scatter pow2 {wire} {n}")


@case
def frames_on_the_gpu_equal_the_cpu_kernels(ctx):
    """Power-of-two frames, MX and NVFP4 blocks are CUDA kernels on the tensor's device: their bytes equal
    the CPU kernels' (which test_frames.cpp holds to an ATen emulation, test_mx.py and test_nvfp4.py to
    torchao), the block wires' rounded stochastically too, a frame's decoding too, a header outside
    [-126, 126] (NVFP4's: a part scale below 2^-120) decodes its frame as NaN, and the collectives' results
    equal the blocks' emulation."""
    half = (N + 1) // 2  # two rows, the second one short
    for wire in (*FRAME_DTYPE, "mxfp8", "mxfp8_e5m2", "mxfp4", "nvfp4"):
        blocks_wire = wire.startswith("mx") or wire == "nvfp4"
        x = ctx.data(N)
        x[7] = float("inf")
        host = x.cpu()
        rows = [host[:half], host[half:]]
        for source in (torch.float32, torch.float64):
            for sr_seed in ((None, 21) if blocks_wire else (None,)):
                for rule in ("floor", "rceil"):  # rceil last: the default, which the collectives below use
                    on_cpu = _C._encode_frames([r.to(source) for r in rows], half, 0.5, wire, rule, sr_seed=sr_seed)
                    on_gpu = _C._encode_frames([r.to(ctx.device, source) for r in rows], half, 0.5, wire, rule,
                                               sr_seed=sr_seed)
                    assert torch.equal(on_gpu.cpu(), on_cpu), \
                        f"{wire} {source} {rule} sr_seed {sr_seed}: {int((on_gpu.cpu() != on_cpu).sum())} bytes differ"
        same(_C._decode_frames(on_gpu, half, wire).cpu(), _C._decode_frames(on_cpu, half, wire), f"decode {wire}")
        if not wire.startswith("mx"):
            bad = on_gpu.clone()
            # exponent 127; NVFP4: the part scale 2^-121
            bad[1, :4] = torch.tensor([0, 0, 0, 3] if wire == "nvfp4" else [127, 0, 0, 0], dtype=torch.uint8)
            decoded = _C._decode_frames(bad, half, wire).cpu()
            assert decoded[1].isnan().all(), f"{wire}: a bad header's frame"
            # Row 0 decodes as on the CPU, NaN where it is: e4m3 has no inf, so the inf in it comes back NaN.
            good = _C._decode_frames(on_cpu, half, wire)[0]
            assert torch.equal(decoded[0].isnan(), good.isnan()), f"{wire}: row 0's NaNs differ from the CPU decode's"
            if not blocks_wire:
                continue

        g = dist.new_group(backend="cnccl", pg_options=cnccl.Options(wire_dtype=wire, min_bytes=0, accumulate="fp32"))

        def blocks(v):  # one rank: its contribution through the blocks, as the owner decodes it
            return _C._decode_frames(_C._encode_frames([v], N, 1.0, wire), N, wire)[0]

        t = late(x)
        dist.all_reduce(t, group=g)
        same(t.cpu(), blocks(blocks(x.cpu())), f"allreduce {wire}")
        out = torch.empty(N, device=ctx.device)
        dist.reduce_scatter_tensor(out, late(x), group=g)
        same(out.cpu(), blocks(x.cpu()), f"reduce_scatter {wire}")


@case
def an_empty_tensor_on_every_wire_with_min_bytes_zero(ctx):
    """As on the CPU path: an empty tensor's collective does nothing, on every wire (an MX frame of no values
    has no bytes, and the frame kernels' checks took its [ranks, 0] buffer for a misaligned one; an NVFP4
    frame of none is its header)."""
    for wire in ("fp16", "bf16", "e4m3", "e5m2", "mxfp8", "mxfp8_e5m2", "mxfp4", "nvfp4"):
        extra = dict(scaling="pow2") if wire in ("e4m3", "e5m2") else {}
        g = dist.new_group(backend="cnccl", pg_options=cnccl.Options(wire_dtype=wire, min_bytes=0, accumulate="fp32",
                                                                     **extra))
        empty = torch.empty(0, device=ctx.device)
        dist.all_reduce(empty, group=g)
        out = torch.empty(0, device=ctx.device)
        dist.reduce_scatter_tensor(out, torch.empty(0, device=ctx.device), group=g)
        torch.cuda.synchronize()
        assert empty.numel() == 0 and out.numel() == 0, wire


@case
def counters_that_cannot_be_made_turn_counting_off_not_the_collective(ctx):
    """The telemetry counters' allocation failing (CNCCL_FAULT_CUDA_COUNTERS=1) leaves the collective to run,
    counting nothing on that device."""
    os.environ["CNCCL_FAULT_CUDA_COUNTERS"] = "1"
    try:
        g = dist.new_group(backend="cnccl", pg_options=cnccl.Options(wire_dtype="fp16", min_bytes=0))
        x = ctx.data(N)
        x[3] = float("inf")
        t = late(x)
        dist.all_reduce(t, group=g)
        torch.cuda.synchronize()
        same(t, expected(x, "SUM", "fp16", ctx), "allreduce without counters")
        stats = cnccl.stats(g)
        assert stats["compressed_collectives"] == 1 and stats["cast_nonfinite"] == 0, stats
    finally:
        del os.environ["CNCCL_FAULT_CUDA_COUNTERS"]


@case
def the_kernels_count_what_their_casts_meet(ctx):
    """Telemetry on CUDA (docs/design.md, "Telemetry"): the kernels of every kind of wire count, on the GPU,
    what the CPU's census counts for the same calls on the same composition over gloo (the CPU kernels):
    an inf and a NaN, values past fp16's largest and, in a frame whose exponent the inf set to 0, past
    e4m3's; MX elements saturated under FLOOR; the block wires' stochastic rounding and NVFP4's blocks."""
    x = ctx.data(N)
    x[3], x[5] = float("inf"), float("nan")
    x[10:40] = 1e6
    configs = [dict(wire_dtype="fp16"), dict(wire_dtype="bf16", accumulate="fp32", rounding="sr"),
               dict(wire_dtype="fp16", accumulate="fp32", scaling="pow2"),
               dict(wire_dtype="e4m3", accumulate="fp32", scaling="pow2"),
               dict(wire_dtype="mxfp8", accumulate="fp32", mx_scale="floor"), dict(wire_dtype="mxfp4", accumulate="fp32"),
               dict(wire_dtype="mxfp4", accumulate="fp32", rounding="sr"), dict(wire_dtype="nvfp4", accumulate="fp32"),
               dict(wire_dtype="nvfp4", accumulate="fp32", rounding="sr")]
    for fields in configs:
        counted = {}
        for device, engine in (("cuda", {}), ("cpu", {"cpu_engine": "gloo"})):
            g = dist.new_group(backend="cnccl", pg_options=cnccl.Options(min_bytes=0, telemetry="counts", **fields,
                                                                         **engine))
            t = x.clone() if device == "cuda" else x.cpu()
            dist.all_reduce(t, group=g)
            dist.reduce_scatter_tensor(torch.empty_like(t), x.to(device), group=g)
            torch.cuda.synchronize()
            stats = cnccl.stats(g)
            counted[device] = (stats["cast_nonfinite"], stats["cast_saturated"])
        assert counted["cuda"] == counted["cpu"] and counted["cpu"][0] > 0, f"{fields}: {counted}"


@case
def non_finite_inputs_come_back_non_finite_on_every_wire(ctx):
    """An inf and a NaN in the input: both places are non-finite after the allreduce on every wire, so
    that a loss scaler sees the overflow."""
    wires = [{"wire_dtype": w} for w in ("fp16", "bf16")]
    wires += [{"wire_dtype": w, "accumulate": "fp32", "scaling": "pow2"} for w in ("fp16", "bf16", "e4m3", "e5m2")]
    wires += [{"wire_dtype": w, "accumulate": "fp32"} for w in ("mxfp8", "mxfp8_e5m2", "mxfp4", "nvfp4")]
    for fields in wires:
        g = dist.new_group(backend="cnccl", pg_options=cnccl.Options(min_bytes=0, **fields))
        x = ctx.data(N)
        x[3], x[N - 2] = float("inf"), float("nan")
        t = late(x)
        dist.all_reduce(t, group=g)
        assert not t[[3, N - 2]].isfinite().any().item(), f"{fields}: {t[[3, N - 2]].tolist()}"


@case
def passthrough_collectives_reach_nccl(ctx):
    g = ctx.groups["fp16"][0]
    x = torch.arange(10, device=ctx.device, dtype=torch.float32)
    dist.broadcast(x, 0, group=g)
    out = torch.empty(10, device=ctx.device)
    dist.all_gather_into_tensor(out, x, group=g)
    same(out, x, "all_gather_into_tensor")
    i = torch.arange(5, device=ctx.device)
    dist.all_reduce(i, op=R.MAX, group=g)
    same(i, torch.arange(5, device=ctx.device), "int allreduce passes through")
    out = torch.empty(10, device=ctx.device)
    dist.all_to_all_single(out, x, group=g)
    same(out, x, "all_to_all_single")


@case
def ddp_matches_nccl_with_seed_hooks(ctx):
    for wire, hook in (("fp16", default_hooks.fp16_compress_hook), ("bf16", default_hooks.bf16_compress_hook)):
        torch.manual_seed(0)
        base = Block().to(ctx.device)
        ref = DDP(copy.deepcopy(base), process_group=ctx.nccl)  # NCCL: the engine cnccl composes
        ref.register_comm_hook(ctx.nccl, hook)
        g = ctx.groups[wire][0]
        ours = DDP(copy.deepcopy(base), process_group=g)
        before = cnccl.stats(g)["compressed_collectives"]
        ref_grads, ref_params = train(ref, ref.module, 5, ctx.device)
        our_grads, our_params = train(ours, ours.module, 5, ctx.device)
        assert cnccl.stats(g)["compressed_collectives"] > before, "DDP's buckets were not compressed"
        for step, (a, b) in enumerate(zip(ref_grads, our_grads)):
            for i, (ga, gb) in enumerate(zip(a, b)):
                same(gb, ga, f"{wire} step {step} grad {i}")
        for i, (pa, pb) in enumerate(zip(ref_params, our_params)):
            same(pb, pa, f"{wire} param {i}")


@case
def fsdp2_trains_on_cnccl_and_its_reduce_scatter_ops_compress(ctx):
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard

    g = ctx.groups["fp16"][0]
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
    for op_name in ("AVG", "PREMUL_SUM", "SUM"):
        x = ctx.data(N)
        out = torch.empty(N, device=ctx.device)
        before = cnccl.stats(g)["compressed_collectives"]
        dist.reduce_scatter_tensor(out, x, op=op_of(op_name, ctx.device), group=g)
        assert cnccl.stats(g)["compressed_collectives"] == before + 1
        same(out, expected(x, op_name, "fp16", ctx), f"FSDP-style reduce_scatter {op_name}")


def refused_before_anything_is_queued(ctx, g, pattern, reduce_scatter=True):
    """The group's CUDA fp32 allreduce (and reduce_scatter) raise a ValueError matching `pattern` and leave
    the tensor as it was; its CPU tensors still sum. Returns the CUDA tensor and its value."""
    x = ctx.data(N)
    before = x.clone()
    calls = [lambda: dist.all_reduce(x, group=g)]
    if reduce_scatter:
        calls.append(lambda: dist.reduce_scatter_tensor(torch.empty_like(x), x, group=g))
    for call in calls:
        with pytest.raises(ValueError, match=pattern):
            call()
    assert torch.equal(x, before)
    y = torch.ones(1000)
    dist.all_reduce(y, group=g)
    assert torch.equal(y, torch.ones(1000))
    return x, before


@case
def a_wire_per_level_is_refused_on_cuda_tensors_by_name(ctx):
    """NCCL decides how CUDA tensors' sums cross hosts: inter_host_wire cannot apply, and says so before
    anything is queued; the group's CPU tensors still sum (one host: with wire_dtype alone)."""
    g = dist.new_group(backend="cnccl", pg_options=cnccl.Options(
        wire_dtype="fp16", inter_host_wire="mxfp8", accumulate="fp32", min_bytes=0))
    refused_before_anything_is_queued(ctx, g, r"inter_host_wire=mxfp8 .* applies to CPU tensors' host path only: "
                                              r"on CUDA tensors NCCL decides the topology")


@case
def block_wires_round_on_the_gpu_as_the_cpu_path_does(ctx):
    """NVFP4, and the block wires' stochastic rounding, on CUDA tensors: allreduce and reduce_scatter give
    the bits the same composition gives CPU tensors over gloo with the CPU kernels, under the same seed and
    the same calls of a new group's path (so the same sequence numbers in the dithers)."""
    x = ctx.data(N)
    for fields in (dict(wire_dtype="nvfp4"), dict(wire_dtype="nvfp4", rounding="sr"),
                   dict(wire_dtype="mxfp4", rounding="sr"), dict(wire_dtype="mxfp8", rounding="sr")):
        got = {}
        for device, engine in (("cuda", {}), ("cpu", {"cpu_engine": "gloo"})):
            g = dist.new_group(backend="cnccl", pg_options=cnccl.Options(
                accumulate="fp32", min_bytes=0, sr_seed=0x5EED, **fields, **engine))
            t = x.to(device)
            dist.all_reduce(t, group=g)
            out = torch.empty_like(t)
            dist.reduce_scatter_tensor(out, x.to(device), group=g)
            got[device] = (t.cpu(), out.cpu())
            assert cnccl.stats(g)["compressed_collectives"] == 2, fields
        same(got["cuda"][0], got["cpu"][0], f"allreduce {fields}")
        same(got["cuda"][1], got["cpu"][1], f"reduce_scatter {fields}")


@case
def rotation_is_refused_on_cuda_tensors_by_name(ctx):
    """rotation=hadamard runs on the host path only: its group refuses CUDA tensors' fp32 reductions before
    anything is queued; its CPU tensors still sum."""
    g = dist.new_group(backend="cnccl", pg_options=cnccl.Options(wire_dtype="fp16", rotation="hadamard", min_bytes=0))
    refused_before_anything_is_queued(ctx, g, r"rotation=hadamard .* runs on the host path only", reduce_scatter=False)


ENVS = {"default": {}, "blocking-wait": {"TORCH_NCCL_BLOCKING_WAIT": "1"}}


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU on this machine")
@pytest.mark.parametrize("env", list(ENVS))
@pytest.mark.parametrize("name", case.names())
def test_cuda(name, env):
    check_case(cached_job(__name__, 1, env=ENVS[env]), name, 1, case)

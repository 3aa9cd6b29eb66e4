"""scaling=pow2 and the 8-bit wires (docs/design.md, "Numerics"), at 2, 3 and 4 ranks, on every CPU
engine: over UCX (also where the ranks share memory: frames have no shared-memory form) and over gloo
(the composed path, as on NCCL). Every result is compared bit for bit with an emulation in plain torch
and Python's own frexp (wire_formats.py): each part's values scaled in fp32, a power-of-two exponent
from their amax, the scaled values rounded to the wire; the owner decodes every rank's frame, adds
them in fp32 in rank order, and (allreduce) frames that sum again with its own exponent."""


import torch
import torch.distributed as dist
import pytest

import cnccl
from cnccl import _C
from harness import CASE_TIMEOUT, CPU_ENGINES, Cases, check_case, engine_of, everyones, gloo_group, share, shared_job
from wire_formats import (FRAME_DTYPE as DTYPE, FRAME_HALF_SUBNORMAL_STEP as HALF_SUBNORMAL_STEP, FRAME_UNIT as UNIT,
                          frame_exponent as exponent, framed_allreduce as allreduce, framed_owner_sum as owner_sum)

R = dist.ReduceOp
SIZES = [1, 5_040, 100_003]

case = Cases()
WORLD_SIZES = [2, 3, 4]
share(__name__, CPU_ENGINES, WORLD_SIZES)


class Context:
    def __init__(self, rank, world):
        self.rank, self.world = rank, world
        self.engine = engine_of()
        self.gloo = gloo_group()
        self.pow2 = {w: self.group(w, "pow2") for w in DTYPE}
        self.none = {w: self.group(w, "none") for w in ("fp16", "bf16")}
        self.gen = torch.Generator().manual_seed(17 + rank)

    @staticmethod
    def group(wire, scaling):
        return dist.new_group(backend="cnccl", timeout=CASE_TIMEOUT, pg_options=cnccl.Options(
            wire_dtype=wire, min_bytes=0, accumulate="fp32", scaling=scaling))

    def all_inputs(self, t):
        return everyones(t, self.gloo)


def pre_scale(op, world):
    return 1.0 / world if op == R.AVG else 1.0


def first_difference(got, want):
    bad = (got != want) & ~(got.isnan() & want.isnan())
    where = bad.nonzero()
    return None if where.numel() == 0 else f"{where.numel()} elements differ, first at {where[0].item()}: " \
                                           f"{got[where[0]].item()!r} != {want[where[0]].item()!r}"


def gaussian(ctx, n, sigma=1.0):
    return torch.randn(n, generator=ctx.gen) * sigma


@case
def the_groups_report_their_scaling(ctx):
    for w, g in ctx.pow2.items():
        config = cnccl.config(g)
        assert config["scaling"] == "pow2" and config["wire_dtype"] == w, config
    assert cnccl.config(ctx.none["fp16"])["scaling"] == "none"


@case
def allreduce_equals_its_emulation_on_every_wire(ctx):
    for wire, g in ctx.pow2.items():
        for op in (R.SUM, R.AVG):
            for n in SIZES:
                # Eight decades between ranks and within each part: some values fall below the frame's
                # range (to the wire's subnormals or zero), exactly as the emulation says.
                x = gaussian(ctx, n) * torch.pow(10.0, torch.empty(n).uniform_(-4, 4, generator=ctx.gen))
                want = allreduce(ctx.all_inputs(x), wire, pre_scale(op, ctx.world))
                t = x.clone()
                dist.all_reduce(t, op=op, group=g)
                problem = first_difference(t, want)
                assert problem is None, f"{wire} {op} n={n}: {problem}"


@case
def reduce_scatter_equals_its_emulation_on_every_wire(ctx):
    for wire, g in ctx.pow2.items():
        for op in (R.SUM, R.AVG):
            for n in SIZES:
                x = gaussian(ctx, n * ctx.world, sigma=1e-3)
                parts = [v.chunk(ctx.world)[ctx.rank] for v in ctx.all_inputs(x)]
                want = owner_sum(parts, wire, pre_scale(op, ctx.world))
                out = torch.empty(n)
                dist.reduce_scatter_tensor(out, x, op=op, group=g)
                problem = first_difference(out, want)
                assert problem is None, f"reduce_scatter_tensor {wire} {op} n={n}: {problem}"
                listed = torch.empty(n)
                dist.reduce_scatter(listed, list(x.chunk(ctx.world)), op=op, group=g)
                assert torch.equal(listed, want), f"reduce_scatter {wire} {op} n={n}"


@case
def calls_past_eight_mib_of_frames_give_the_same_bits(ctx):
    """On the composed path (cpu_engine=gloo) these go to the owners in eight column chunks of the frames
    (docs/design.md, "Numerics", Memory): the emulation's bits, as every other path's."""
    n = 4_200_003
    x = gaussian(ctx, n) * torch.pow(10.0, torch.empty(n).uniform_(-4, 4, generator=ctx.gen))
    t = x.clone()
    dist.all_reduce(t, op=R.AVG, group=ctx.pow2["fp16"])
    problem = first_difference(t, allreduce(ctx.all_inputs(x), "fp16", pre_scale(R.AVG, ctx.world)))
    assert problem is None, f"allreduce: {problem}"
    each = n // ctx.world
    x = gaussian(ctx, each * ctx.world)
    parts = [v.chunk(ctx.world)[ctx.rank] for v in ctx.all_inputs(x)]
    out = torch.empty(each)
    dist.reduce_scatter_tensor(out, x, group=ctx.pow2["bf16"])
    problem = first_difference(out, owner_sum(parts, "bf16", 1.0))
    assert problem is None, f"reduce_scatter_tensor: {problem}"


@case
def coalesced_and_empty_tensors_are_framed_alike(ctx):
    xs = [gaussian(ctx, n) for n in (0, 7, 40_000)]
    for wire in ("fp16", "e4m3"):
        wants = [allreduce(ctx.all_inputs(x), wire, 1.0) for x in xs]
        ts = [x.clone() for x in xs]
        dist.all_reduce_coalesced(ts, group=ctx.pow2[wire])
        for i, (t, want) in enumerate(zip(ts, wants)):
            assert torch.equal(t, want), f"{wire} tensor {i}: {first_difference(t, want)}"


@case
def well_ranged_values_give_the_bits_of_scaling_none(ctx):
    """A power of two is exact: where no value overflows or falls among the subnormals, pow2 changes
    nothing. Positive values in [0.01, 100] keep every sum out of both."""
    n = 100_003
    x = torch.pow(10.0, torch.empty(n).uniform_(-2, 2, generator=ctx.gen))
    for wire in ("fp16", "bf16"):
        scaled, plain = x.clone(), x.clone()
        dist.all_reduce(scaled, group=ctx.pow2[wire])
        dist.all_reduce(plain, group=ctx.none[wire])
        assert torch.equal(scaled, plain), f"{wire}: {first_difference(scaled, plain)}"
        scaled, plain = torch.empty(n // ctx.world), torch.empty(n // ctx.world)
        dist.reduce_scatter_tensor(scaled, x[:n // ctx.world * ctx.world], group=ctx.pow2[wire])
        dist.reduce_scatter_tensor(plain, x[:n // ctx.world * ctx.world], group=ctx.none[wire])
        assert torch.equal(scaled, plain), f"reduce_scatter {wire}: {first_difference(scaled, plain)}"


def relative_error(got, exact):
    return ((got.double() - exact).norm() / exact.norm()).item()


@case
def tiny_gradients_keep_the_precision_of_one_rounding(ctx):
    """sigma = 1e-7, below fp16's normal range (6.1e-5): unscaled, most values round to zero or to a few
    subnormal steps. Framed, the error is at most 1.5x that of rounding the exact sum once to fp16
    precision at its own scale (each contribution and the sum round once: about sqrt(2)x)."""
    n = 200_000
    x = gaussian(ctx, n, sigma=1e-7)
    exact = sum(v.double() for v in ctx.all_inputs(x))
    k = exponent(exact.float(), "fp16")
    best = relative_error((exact.float() * 2.0**k).half().float() * 2.0**-k, exact)
    scaled, plain = x.clone(), x.clone()
    dist.all_reduce(scaled, group=ctx.pow2["fp16"])
    dist.all_reduce(plain, group=ctx.none["fp16"])
    ours, unscaled = relative_error(scaled, exact), relative_error(plain, exact)
    assert ours <= 1.5 * best, f"pow2 {ours:.3g} vs one rounding {best:.3g}"
    assert unscaled > 0.1 and unscaled > 100 * ours, f"unscaled {unscaled:.3g}, pow2 {ours:.3g}"


@case
def sums_past_the_largest_fp16_value_stay_finite(ctx):
    """Values near +-3.3e4 on every rank: their sum passes 65504, fp16's largest value. Unscaled it
    becomes inf; the owner frames its sum with its own exponent, and the sum comes back finite."""
    n = 10_000
    sign = torch.where(torch.arange(n) % 2 == 0, 1.0, -1.0)
    x = sign * (3.3e4 + torch.rand(n, generator=ctx.gen) * 100)
    scaled, plain = x.clone(), x.clone()
    dist.all_reduce(scaled, group=ctx.pow2["fp16"])
    dist.all_reduce(plain, group=ctx.none["fp16"])
    assert scaled.isfinite().all(), scaled[:4]
    want = allreduce(ctx.all_inputs(x), "fp16", 1.0)
    assert torch.equal(scaled, want), first_difference(scaled, want)
    assert plain.isinf().all(), plain[:4]


@case
def fp8_error_is_within_its_bound(ctx):
    """Each contribution and the allreduce's sum round once to the 8-bit wire: |error| <=
    u8 * (sum |x| + |sum x|) plus, where a value lands among the subnormals, half a subnormal step
    at its frame's scale; (1 + 4 u8) covers the fp32 adds and the second-order terms."""
    n = 100_003
    x = gaussian(ctx, n)
    inputs = ctx.all_inputs(x)
    exact = sum(v.double() for v in inputs)
    magnitude = sum(v.double().abs() for v in inputs)
    c = -(-n // ctx.world)
    for wire in ("e4m3", "e5m2"):
        u = UNIT[wire]
        t = x.clone()
        dist.all_reduce(t, group=ctx.pow2[wire])
        subnormal = torch.empty(n, dtype=torch.float64)
        for p in range(ctx.world):
            part = slice(p * c, (p + 1) * c)
            steps = [2.0**-exponent(v[part], wire) for v in inputs]
            owner = 2.0**-exponent(owner_sum([v[part] for v in inputs], wire, 1.0), wire)
            subnormal[part] = HALF_SUBNORMAL_STEP[wire] * (sum(steps) + owner)
        bound = u * (magnitude + exact.abs()) * (1 + 4 * u) + subnormal
        excess = (t.double() - exact).abs() - bound
        assert (excess <= 0).all(), f"{wire}: {int((excess > 0).sum())} elements past the bound, worst by " \
                                    f"{excess.max().item():.3g}"


@case
def an_fp8_wire_moves_at_most_three_eighths_of_an_fp32_ring(ctx):
    """One byte an element each way (an all-to-all of the frames, then their allgather), plus a 4-byte
    exponent a frame and the signature headers; through shared memory, bytes published."""
    g = ctx.pow2["e4m3"]
    n = 1 << 20
    before = cnccl.stats(g)
    dist.all_reduce(torch.ones(n), group=g)
    after = cnccl.stats(g)
    assert after["bytes_sent"] - before["bytes_sent"] == n, "one byte an element on the wire"
    if ctx.engine == "gloo":
        return  # gloo does not report its transport's bytes
    sent = after["transport_bytes_sent"] - before["transport_bytes_sent"]
    fp32_ring = 2 * (ctx.world - 1) / ctx.world * 4 * n
    frames = 2 * (ctx.world - 1) / ctx.world * n
    if ctx.engine == "shm":
        # Through shared memory an owner publishes its frame once, and every peer reads it there.
        frames = (ctx.world - 1) / ctx.world * n + n / ctx.world
    assert frames <= sent <= frames + 2 * 256 + 64, f"sent {sent}, expected {frames:.0f}"
    assert sent <= 3 / 8 * fp32_ring


@case
def min_and_max_on_an_fp8_wire_are_exact(ctx):
    x = gaussian(ctx, 5_000)
    inputs = ctx.all_inputs(x)
    for op, want in ((R.MAX, torch.stack(inputs).amax(0)), (R.MIN, torch.stack(inputs).amin(0))):
        t = x.clone()
        dist.all_reduce(t, op=op, group=ctx.pow2["e4m3"])
        assert torch.equal(t, want), f"{op}: {first_difference(t, want)}"


@case
def non_finite_inputs_come_back_non_finite(ctx):
    """An inf on rank 0 and a NaN on the last rank, in different parts: every wire, scaled or not, must
    return a non-finite value there on every rank (e4m3 has no inf: NaN), or a loss scaler would miss
    the overflow. The rest of each part is compared bit for bit with the emulation."""
    n = 5_040
    x = gaussian(ctx, n)
    if ctx.rank == 0:
        x[3] = float("inf")
    if ctx.rank == ctx.world - 1:
        x[n - 2] = float("nan")
    inputs = ctx.all_inputs(x)
    for scaling, groups in (("pow2", ctx.pow2), ("none", ctx.none)):
        for wire, g in groups.items():
            t = x.clone()
            dist.all_reduce(t, group=g)
            assert not t[[3, n - 2]].isfinite().any(), f"{scaling} {wire}: {t[[3, n - 2]].tolist()}"
            if scaling == "pow2":
                want = allreduce(inputs, wire, 1.0)
                assert first_difference(t, want) is None, f"{wire}: {first_difference(t, want)}"


def test_a_thread_that_flushes_subnormals_gets_the_same_bits():
    """torch.set_flush_denormal(True) sets FTZ and DAZ on the calling thread, and a group's threads take
    its creator's settings: the CPU kernels must still read fp32 subnormals and decode values times 2^-k,
    and MX blocks' 2^-127 scale and NVFP4's 2^-120 part scale, into them, as the definition and the CUDA
    kernels do."""
    v = torch.randn(128, generator=torch.Generator().manual_seed(12)) * 2.0**-125
    v[64:] *= 2.0**-20  # fp32 subnormals; every value decodes to one
    for wire in (*DTYPE, "mxfp8", "mxfp8_e5m2", "mxfp4", "nvfp4"):
        frame = _C._encode_frames([v], 128, 1.0, wire)
        decoded = _C._decode_frames(frame, 128, wire)
        assert decoded.count_nonzero() > 0, wire
        if not torch.set_flush_denormal(True):
            pytest.skip("this processor cannot flush subnormals")
        try:
            flushed = _C._encode_frames([v], 128, 1.0, wire)
            flushed_decoded = _C._decode_frames(flushed, 128, wire)
        finally:
            torch.set_flush_denormal(False)
        assert torch.equal(flushed, frame) and torch.equal(flushed_decoded, decoded), wire


@pytest.mark.parametrize("engine", CPU_ENGINES)
@pytest.mark.parametrize("world_size", WORLD_SIZES)
@pytest.mark.parametrize("name", case.names())
def test_scaling(name, world_size, engine):
    check_case(shared_job(__name__, world_size, engine), name, world_size, case)

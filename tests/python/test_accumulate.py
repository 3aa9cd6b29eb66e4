"""accumulate=fp32 and rounding=sr (docs/design.md, "Numerics"), at 2, 3 and 4 ranks, on every CPU engine: through
shared memory, over UCX alone (an all-to-all to each part's owner, then an allgather) and over gloo
(the composed path: the same all-to-all and allgather as on NCCL). What it computes, bit for bit,
against an emulation written here with plain torch: each rank's value scaled in fp32 and cast to the
wire type; every rank's 16-bit value added in fp32 in rank order; an allreduce rounds that sum once
to the wire type and restores it, a reduce_scatter writes the fp32 sum itself, never rounded to 16
bits. At two ranks the allreduce equals the wire path's; at four the wire path's 16-bit adds are
further from the exact sum. With rounding=sr every rounding is stochastic, with Philox bits computed
here in numpy (wire_formats.py)."""


import pytest
import torch
import torch.distributed as dist

import cnccl
from harness import CASE_TIMEOUT, CPU_ENGINES, Cases, check_case, engine_of, everyones, gloo_group, share, shared_job
from wire_formats import (ANY_OWNER, CONTRIBUTION, RESULT, mixed_magnitudes, random_bits, rank_order_sum,
                          stochastic_round)

R = dist.ReduceOp
WIRES = {"fp16": torch.float16, "bf16": torch.bfloat16}
# One element; a size every world divides; one no world here divides (the last part is short, or
# padded on the composed path); and a bandwidth-bound size.
SIZES = [1, 5_040, 100_003, 1_000_003]
SEED = 0x5EED_0000_0000_0001  # both key words in use

case = Cases()
WORLD_SIZES = [2, 3, 4]
share(__name__, CPU_ENGINES, WORLD_SIZES)


class Context:
    def __init__(self, rank, world):
        self.rank, self.world = rank, world
        self.engine = engine_of()
        self.gloo = gloo_group()

        def group(wire, accumulate):
            return dist.new_group(backend="cnccl", timeout=CASE_TIMEOUT,
                                  pg_options=cnccl.Options(wire_dtype=wire, min_bytes=0, accumulate=accumulate))

        self.fp32 = {w: group(w, "fp32") for w in WIRES}
        self.wire = {w: group(w, "wire") for w in WIRES}
        self.sr = {w: self.stochastic_group(w) for w in WIRES}
        self.sr_seq = dict.fromkeys(WIRES, 0)  # stochastic reductions of non-empty tensors so far, per group
        self.gen = torch.Generator().manual_seed(31 + rank)

    @staticmethod
    def stochastic_group(wire):
        return dist.new_group(backend="cnccl", timeout=CASE_TIMEOUT, pg_options=cnccl.Options(
            wire_dtype=wire, min_bytes=0, accumulate="fp32", rounding="sr", sr_seed=SEED))

    def gaussian(self, n):
        return mixed_magnitudes(self.gen, n, 4)

    def all_inputs(self, t):
        return everyones(t, self.gloo)


def pre_scale(op, world):
    # Where cnccl applies the scales (docs/design.md): AVG divides before the cast.
    return 1.0 / world if op == R.AVG else 1.0


def first_difference(got, want):
    bad = (got != want).nonzero()
    return None if bad.numel() == 0 else f"{bad.numel()} elements differ, first at {bad[0].item()}: " \
                                         f"{got[bad[0]].item()!r} != {want[bad[0]].item()!r}"


@case
def the_groups_report_their_accumulation(ctx):
    for w in WIRES:
        assert cnccl.config(ctx.fp32[w])["accumulate"] == "fp32", cnccl.config(ctx.fp32[w])
        assert cnccl.config(ctx.wire[w])["accumulate"] == "wire", cnccl.config(ctx.wire[w])


@case
def allreduce_is_the_fp32_sum_in_rank_order_rounded_once(ctx):
    for wire, w in WIRES.items():
        for op in (R.SUM, R.AVG):
            for n in SIZES:
                x = ctx.gaussian(n)
                want = rank_order_sum(ctx.all_inputs(x), wire, pre_scale(op, ctx.world)).to(w).float()
                t = x.clone()
                dist.all_reduce(t, op=op, group=ctx.fp32[wire])
                problem = first_difference(t, want)
                assert problem is None, f"{wire} {op} n={n}: {problem}"


@case
def coalesced_allreduce_sums_each_tensor_the_same_way(ctx):
    xs = [ctx.gaussian(n) for n in (100_003, 7, 4_000)]
    wants = [rank_order_sum(ctx.all_inputs(x), "bf16", 1.0).to(torch.bfloat16).float() for x in xs]
    ts = [x.clone() for x in xs]
    dist.all_reduce_coalesced(ts, group=ctx.fp32["bf16"])
    for i, (t, want) in enumerate(zip(ts, wants)):
        assert torch.equal(t, want), f"tensor {i}: {first_difference(t, want)}"


@case
def reduce_scatter_writes_the_fp32_sum_unrounded(ctx):
    for wire in WIRES:
        for op in (R.SUM, R.AVG):
            for n in SIZES[:3]:
                x = ctx.gaussian(n * ctx.world)
                parts = [v.chunk(ctx.world)[ctx.rank] for v in ctx.all_inputs(x)]
                want = rank_order_sum(parts, wire, pre_scale(op, ctx.world))
                out = torch.empty(n)
                dist.reduce_scatter_tensor(out, x, op=op, group=ctx.fp32[wire])
                problem = first_difference(out, want)
                assert problem is None, f"reduce_scatter_tensor {wire} {op} n={n}: {problem}"
                listed = torch.empty(n)
                dist.reduce_scatter(listed, list(x.chunk(ctx.world)), op=op, group=ctx.fp32[wire])
                assert torch.equal(listed, want), f"reduce_scatter {wire} {op} n={n}"
    # Past fp16's largest value (65504) the sum is still exact: it is never rounded to 16 bits.
    out = torch.empty(1000)
    dist.reduce_scatter_tensor(out, torch.full((1000 * ctx.world,), 40000.0), group=ctx.fp32["fp16"])
    assert torch.equal(out, torch.full_like(out, 40000.0 * ctx.world)), out[:3]


@case
def every_rank_holds_the_same_bytes(ctx):
    """Also with stochastic rounding: an owner's sum is rounded with bits no rank's own."""
    x = ctx.gaussian(1_000_003)
    for wire in WIRES:
        for name, g in (("fp32", ctx.fp32[wire]), ("sr", ctx.sr[wire])):
            t = x.clone()
            dist.all_reduce(t, group=g)
            ctx.sr_seq[wire] += name == "sr"
            bits = [other.view(torch.int32) for other in ctx.all_inputs(t)]
            differing = [r for r, b in enumerate(bits) if not torch.equal(b, t.view(torch.int32))]
            assert not differing, f"{wire} {name}: ranks {differing} differ"


@case
def two_ranks_equal_the_wire_path_and_four_are_closer_to_the_exact_sum(ctx):
    """At two ranks one fp32 add rounded once is the 16-bit add (docs/design.md). At four, 16-bit
    adds round at every hop: further from the exact sum on the same inputs (the negative control, gloo's
    ring), except on the host path, whose wire path at this size already sums in fp32 in rank order
    (through shared memory, and over UCX the chunked all-to-all)."""
    n = 1_000_003
    x = torch.randn(n, generator=ctx.gen)
    exact = sum(v.double() for v in ctx.all_inputs(x))
    for wire in WIRES:
        ours, theirs = x.clone(), x.clone()
        dist.all_reduce(ours, group=ctx.fp32[wire])
        dist.all_reduce(theirs, group=ctx.wire[wire])
        if ctx.world == 2 or ctx.engine != "gloo":
            assert torch.equal(ours, theirs), f"{wire}: {first_difference(ours, theirs)}"
            continue
        err_fp32 = ((ours.double() - exact).norm() / exact.norm()).item()
        err_wire = ((theirs.double() - exact).norm() / exact.norm()).item()
        if ctx.world == 4:
            # The goal is 0.8; the simulation there gives 0.76 (fp16) and 0.75 (bf16).
            assert err_fp32 <= 0.8 * err_wire, f"{wire}: fp32 {err_fp32:.3g} vs wire {err_wire:.3g}"
        else:
            assert err_fp32 < err_wire, f"{wire}: fp32 {err_fp32:.3g} vs wire {err_wire:.3g}"


@case
def bytes_sent_are_a_rings(ctx):
    """An all-to-all of the 16-bit parts and their allgather: 2(n-1)/n of the 16-bit tensor per rank,
    as a ring; through shared memory each rank publishes its contributions and its part's result."""
    g = ctx.fp32["fp16"]
    n = 1 << 20
    before = cnccl.stats(g)
    dist.all_reduce(torch.ones(n), group=g)
    after = cnccl.stats(g)
    assert after["bytes_sent"] - before["bytes_sent"] == 2 * n
    if ctx.engine == "gloo":
        return  # gloo does not report its transport's bytes
    sent = after["transport_bytes_sent"] - before["transport_bytes_sent"]
    per_element = 2 if ctx.engine == "shm" else 2 * 2 * (ctx.world - 1) / ctx.world
    headers, uneven = 2 * 256, 64
    assert per_element * n <= sent <= per_element * n + headers + uneven, f"sent {sent}, expected {per_element * n}"


def stochastic_sum(inputs, wire, pre, seq, first=0, round_result=True):
    """rounding=sr (compress/stochastic.h): each rank's contribution rounded stochastically with its own
    bits, the fp32 sum in rank order, and (allreduce) that sum rounded stochastically with the
    owners' bits. `first` is the index of inputs' element 0 in the collective's tensor."""
    n = inputs[0].numel()
    acc = None
    for q, x in enumerate(inputs):
        cast = stochastic_round(x * pre, random_bits(first, n, SEED, seq, q, CONTRIBUTION), wire).float()
        acc = cast if acc is None else acc + cast
    if not round_result:
        return acc
    return stochastic_round(acc, random_bits(first, n, SEED, seq, ANY_OWNER, RESULT), wire).float()


@case
def stochastic_rounding_equals_its_emulation_bit_for_bit(ctx):
    # 300_007 takes several shared-memory chunks (at most 131_072 elements of one rank's part a
    # chunk) and several ring steps, so a dither offset wrong past the first chunk shows.
    for wire in WIRES:
        for op in (R.SUM, R.AVG):
            for n in SIZES[:3] + ([300_007] if op == R.SUM else []):
                x = ctx.gaussian(n)
                pre = pre_scale(op, ctx.world)
                want = stochastic_sum(ctx.all_inputs(x), wire, pre, ctx.sr_seq[wire])
                t = x.clone()
                dist.all_reduce(t, op=op, group=ctx.sr[wire])
                ctx.sr_seq[wire] += 1
                problem = first_difference(t, want)
                assert problem is None, f"allreduce {wire} {op} n={n}: {problem}"
                x = ctx.gaussian(n * ctx.world)
                inputs = ctx.all_inputs(x)
                parts = [v.chunk(ctx.world)[ctx.rank] for v in inputs]
                want = stochastic_sum(parts, wire, pre, ctx.sr_seq[wire], first=n * ctx.rank, round_result=False)
                out = torch.empty(n)
                dist.reduce_scatter_tensor(out, x, op=op, group=ctx.sr[wire])
                ctx.sr_seq[wire] += 1
                problem = first_difference(out, want)
                assert problem is None, f"reduce_scatter_tensor {wire} {op} n={n}: {problem}"


@case
def calls_past_four_mib_of_stage_sum_the_same_way(ctx):
    """On the composed path (cpu_engine=gloo) these go to the owners in four chunks through one buffer
    (docs/design.md, "Numerics", Memory): the same bits, dithers included, as every other path's."""
    n = 2_200_003
    x = ctx.gaussian(n)
    t = x.clone()
    dist.all_reduce(t, group=ctx.fp32["fp16"])
    problem = first_difference(t, rank_order_sum(ctx.all_inputs(x), "fp16", 1.0).to(torch.float16).float())
    assert problem is None, f"allreduce: {problem}"
    t = x.clone()
    want = stochastic_sum(ctx.all_inputs(x), "bf16", 1.0, ctx.sr_seq["bf16"])
    dist.all_reduce(t, group=ctx.sr["bf16"])
    ctx.sr_seq["bf16"] += 1
    problem = first_difference(t, want)
    assert problem is None, f"stochastic allreduce: {problem}"
    each = n // ctx.world
    x = ctx.gaussian(each * ctx.world)
    parts = [v.chunk(ctx.world)[ctx.rank] for v in ctx.all_inputs(x)]
    out = torch.empty(each)
    dist.reduce_scatter_tensor(out, x, op=R.AVG, group=ctx.fp32["bf16"])
    problem = first_difference(out, rank_order_sum(parts, "bf16", 1.0 / ctx.world))
    assert problem is None, f"reduce_scatter_tensor: {problem}"
    want = stochastic_sum(parts, "fp16", 1.0, ctx.sr_seq["fp16"], first=each * ctx.rank, round_result=False)
    dist.reduce_scatter_tensor(out, x, group=ctx.sr["fp16"])
    ctx.sr_seq["fp16"] += 1
    problem = first_difference(out, want)
    assert problem is None, f"stochastic reduce_scatter_tensor: {problem}"


@case
def stochastic_rounding_is_unbiased_where_nearest_even_is_not(ctx):
    n = 1 << 20
    for wire in WIRES:
        step = 2.0**-10 if wire == "fp16" else 2.0**-7
        x = torch.full((n,), 1.0 + 0.3 * step)  # nearest-even rounds every contribution down to 1
        exact = ctx.world * x[0].double().item()
        sr, rne = x.clone(), x.clone()
        dist.all_reduce(sr, group=ctx.sr[wire])
        ctx.sr_seq[wire] += 1
        dist.all_reduce(rne, group=ctx.fp32[wire])
        # Each contribution's rounding has variance <= step^2 / 4, the sum's <= (its spacing)^2 / 4.
        spacing = step * 2.0 ** torch.tensor(exact).log2().floor().item()
        sigma = ((ctx.world * step**2 + spacing**2) / 4 / n) ** 0.5
        assert abs(sr.double().mean().item() - exact) < 6 * sigma, (wire, sr.double().mean().item(), exact, sigma)
        assert abs(rne.double().mean().item() - exact) > 6 * sigma, (wire, rne.double().mean().item(), exact)


@case
def stochastic_rounding_reproduces_and_each_reduction_draws_anew(ctx):
    x = ctx.gaussian(50_000)
    fresh = Context.stochastic_group("bf16")  # the same seed, its own sequence numbers from 0
    again = [x.clone(), x.clone()]
    for t in again:
        dist.all_reduce(t, group=fresh)
    want = stochastic_sum(ctx.all_inputs(x), "bf16", 1.0, 0)
    assert torch.equal(again[0], want), "the first reduction of a group with this seed"
    assert (again[0] != again[1]).float().mean() > 0.2, "the second reduction drew the same bits"
    assert cnccl.config(fresh)["rounding"] == "sr" and cnccl.config(fresh)["sr_seed"] == SEED, cnccl.config(fresh)


@pytest.mark.parametrize("engine", CPU_ENGINES)
@pytest.mark.parametrize("world_size", WORLD_SIZES)
@pytest.mark.parametrize("name", case.names())
def test_accumulate(name, world_size, engine):
    check_case(shared_job(__name__, world_size, engine), name, world_size, case)

"""The host path through shared memory (docs/design.md, "Shared memory"), at 2, 3 and 4 ranks with
CNCCL_SHM=on: what it computes, bit for bit, against an emulation written here. A compressed sum is
each rank's value scaled in fp32 and cast to the wire type, those 16-bit values added in fp32 in
rank order, and that sum rounded once to the wire type; the restore widens it and applies the
post-scale. Uncompressed reductions apply the op in rank order in the tensor's own dtype. At two
ranks that is the seed hook's 16-bit add exactly; at more ranks it is closer to the exact sum than
16-bit adds. The collective, compression, parity and reliability suites also run on this path
(harness.CPU_ENGINES)."""

import os

import pytest
import torch
import torch.distributed as dist

import cnccl
from harness import (CASE_TIMEOUT, Cases, cached_job, check_case, engine_env, everyones, gloo_group,
                     separate_hosts_unavailable, share, shared_job)
from wire_formats import mixed_magnitudes, rank_order_sum

pytestmark = pytest.mark.needs_host_path

R = dist.ReduceOp
WIRES = {"fp16": torch.float16, "bf16": torch.bfloat16}
# One-shot (a single exchange), a few chunks, and many chunks with uneven parts.
SIZES = [5_000, 100_000, 1_000_003]

case = Cases()
WORLD_SIZES = [2, 3, 4]
share(__name__, ["shm"], WORLD_SIZES)


class Context:
    def __init__(self, rank, world):
        self.rank, self.world = rank, world
        self.gloo = gloo_group()
        self.groups = {w: dist.new_group(backend="cnccl", timeout=CASE_TIMEOUT,
                                         pg_options=cnccl.Options(wire_dtype=w, min_bytes=0)) for w in WIRES}
        self.groups["none"] = dist.new_group(backend="cnccl", timeout=CASE_TIMEOUT,
                                             pg_options=cnccl.Options(wire_dtype="none"))
        self.fp32_sums = dist.new_group(backend="cnccl", timeout=CASE_TIMEOUT,
                                        pg_options=cnccl.Options(wire_dtype="bf16", min_bytes=0, accumulate="fp32"))
        # The same settings, with results restored from a workspace after the last chunk instead of
        # straight into the tensor (docs/design.md, "Where an allreduce's results land").
        self.untouched = {w: dist.new_group(backend="cnccl", timeout=CASE_TIMEOUT, pg_options=cnccl.Options(
            wire_dtype=w, min_bytes=0, untouched_on_failure=True)) for w in ("fp16", "none")}
        self.gen = torch.Generator().manual_seed(77 + rank)

    def gaussian(self, n):
        return mixed_magnitudes(self.gen, n, 3)

    def all_inputs(self, t):
        return everyones(t, self.gloo)


def emulate_sum(inputs, wire, pre, post):
    """cast(x * pre) per rank, an fp32 sum in rank order, one rounding, widened, times post."""
    return rank_order_sum(inputs, wire, pre).to(WIRES[wire]).float() * post


def scales(op, world):
    # Where cnccl applies the scales (docs/design.md): AVG and PREMUL_SUM scale before the cast.
    return {R.SUM: (1.0, 1.0), R.AVG: (1.0 / world, 1.0)}[op]


@case
def the_group_runs_on_shared_memory(ctx):
    for g in ctx.groups.values():
        assert cnccl.config(g)["cpu_transport"] == "shm", cnccl.config(g)
        assert cnccl.config(g)["shm"] == "on", cnccl.config(g)


@case
def results_straight_into_the_tensor_equal_those_restored_after_the_last_chunk(ctx):
    """Every dtype and op the path takes, one-shot and chunked, contiguous and strided (which always
    takes the workspace), fp32 and fp64 compressed and not: the same bits either way."""
    ops = {torch.float32: (R.SUM, R.AVG, R.MAX), torch.float64: (R.SUM, R.AVG), torch.int32: (R.SUM, R.AVG, R.MIN),
           torch.int64: (R.SUM, R.PRODUCT)}
    for wire in ("fp16", "none"):
        for dtype, dtype_ops in ops.items():
            for op in dtype_ops:
                for n in SIZES:
                    x = ctx.gaussian(2 * n)
                    x = (x * 50).to(dtype) if not dtype.is_floating_point else x.to(dtype)
                    if op == R.PRODUCT:
                        x = x.remainder(3) + 1
                    for t in (x[:n].clone(), x.clone()[::2]):
                        direct, kept = t.clone(), t.clone()
                        dist.all_reduce(direct, op=op, group=ctx.groups[wire])
                        dist.all_reduce(kept, op=op, group=ctx.untouched[wire])
                        assert torch.equal(direct, kept), f"{wire} {dtype} {op} n={n} strided={not t.is_contiguous()}"


@case
def allreduce_is_the_fp32_sum_in_rank_order_rounded_once(ctx):
    for wire in WIRES:
        for op in (R.SUM, R.AVG):
            for n in SIZES:
                x = ctx.gaussian(n)
                want = emulate_sum(ctx.all_inputs(x), wire, *scales(op, ctx.world))
                t = x.clone()
                dist.all_reduce(t, op=op, group=ctx.groups[wire])
                bad = (t != want).nonzero()
                assert bad.numel() == 0, f"{wire} {op} n={n}: {bad.numel()} elements differ, first {bad[:3].tolist()}"


@case
def reduce_scatter_is_the_fp32_sum_in_rank_order_rounded_once(ctx):
    for wire in WIRES:
        for n in SIZES:
            x = ctx.gaussian(n * ctx.world)
            inputs = [v.chunk(ctx.world)[ctx.rank] for v in ctx.all_inputs(x)]
            want = emulate_sum(inputs, wire, 1.0, 1.0)
            out = torch.empty(n)
            dist.reduce_scatter_tensor(out, x, group=ctx.groups[wire])
            assert torch.equal(out, want), f"{wire} n={n}"


@case
def two_ranks_equal_16bit_adds_and_more_ranks_are_closer_to_the_exact_sum(ctx):
    n = 200_000
    x = ctx.gaussian(n)
    inputs = ctx.all_inputs(x)
    exact = sum(v.double() for v in inputs)
    for wire, w in WIRES.items():
        t = x.clone()
        dist.all_reduce(t, group=ctx.groups[wire])
        sixteen = inputs[0].to(w)
        for v in inputs[1:]:
            sixteen = sixteen + v.to(w)  # torch adds 16-bit tensors with one rounding per add
        if ctx.world == 2:
            assert torch.equal(t, sixteen.float()), wire
        else:
            ours, adds = (t.double() - exact).norm(), (sixteen.double() - exact).norm()
            assert ours < adds, f"{wire}: error {ours:.4g} is not below 16-bit adds' {adds:.4g}"


@case
def uncompressed_reductions_apply_the_op_in_rank_order(ctx):
    big = [3e7, 1.0, -3e7, 0.75][ctx.rank % 4]
    for n in (1, 70_001, 1_000_003):
        x = torch.full((n,), big) * (1 + torch.arange(n) % 3)
        inputs = ctx.all_inputs(x)
        want = inputs[0].clone()
        for v in inputs[1:]:
            want += v
        t = x.clone()
        dist.all_reduce(t, group=ctx.groups["none"])
        assert torch.equal(t, want), f"n={n}"
        i = torch.randint(-50, 50, (n,), generator=ctx.gen, dtype=torch.int64)
        lo = i.clone()
        dist.all_reduce(lo, op=R.MIN, group=ctx.groups["none"])
        assert torch.equal(lo, torch.stack(ctx.all_inputs(i)).min(0).values)
        # Every root where the reduce takes several chunks; one that moves with n elsewhere.
        for root in range(ctx.world) if n > 1_000_000 else [n % ctx.world]:
            r = x.clone()
            dist.reduce(r, root, group=ctx.groups["none"])
            assert torch.equal(r, want if ctx.rank == root else x), f"reduce n={n} root {root}"


@case
def every_rank_holds_the_same_bytes(ctx):
    x = ctx.gaussian(1_000_003)
    for wire in WIRES:
        t = x.clone()
        dist.all_reduce(t, group=ctx.groups[wire])
        everyone = ctx.all_inputs(t)
        for r, other in enumerate(everyone):
            assert torch.equal(other.view(torch.int32), t.view(torch.int32)), f"{wire}: rank {r} differs"


@pytest.mark.parametrize("world_size", WORLD_SIZES)
@pytest.mark.parametrize("name", case.names())
def test_shm(name, world_size):
    check_case(shared_job(__name__, world_size, "shm"), name, world_size, case)


# Four ranks on two simulated hosts (each pair in an IPC namespace of its own, as on two machines;
# between them only TCP, as between machines): allreduce is hierarchical. Inside each host the
# shared-memory sum (fp32 in rank order, rounded once) at each part's owner; across hosts the
# owners' 16-bit sums added over UCX (two hosts: one 16-bit add); inside each host the parts'
# allgather.
hosts = Cases()
HOSTS = 2


@hosts
def allreduce_sums_inside_each_host_then_across(ctx):
    for g in ctx.groups.values():
        assert cnccl.config(g)["cpu_transport"] == f"shm within each host, ucx across {HOSTS} hosts", cnccl.config(g)
    per_host = ctx.world // HOSTS
    for wire, w in WIRES.items():
        for op in (R.SUM, R.AVG):
            pre, post = scales(op, ctx.world)
            for n in SIZES:
                x = ctx.gaussian(n)
                inputs = ctx.all_inputs(x)
                host_sums = [emulate_sum(inputs[h * per_host:(h + 1) * per_host], wire, pre, 1.0).to(w)
                             for h in range(HOSTS)]
                want = (host_sums[0] + host_sums[1]).float() * post
                t = x.clone()
                dist.all_reduce(t, op=op, group=ctx.groups[wire])
                assert torch.equal(t, want), f"{wire} {op} n={n}"


@hosts
def fp32_sums_across_hosts_are_one_rank_order_sum(ctx):
    # Not hierarchical: the hosts' 16-bit sums would be added in 16 bits. Every contribution goes to
    # its part's owner, whichever host it is on.
    for n in SIZES:
        x = ctx.gaussian(n)
        want = emulate_sum(ctx.all_inputs(x), "bf16", 1.0, 1.0)
        t = x.clone()
        dist.all_reduce(t, group=ctx.fp32_sums)
        assert torch.equal(t, want), f"n={n}"


@hosts
def uncompressed_and_other_collectives_work_across_hosts(ctx):
    for n in (1, 70_001, 1_000_003):
        i = torch.randint(-50, 50, (n,), generator=ctx.gen, dtype=torch.int64)
        total = i.clone()
        dist.all_reduce(total, group=ctx.groups["none"])
        assert torch.equal(total, torch.stack(ctx.all_inputs(i)).sum(0)), f"n={n}"
    x = torch.full((1000,), float(ctx.rank))
    gathered = torch.empty(1000 * ctx.world)
    dist.all_gather_into_tensor(gathered, x, group=ctx.groups["fp16"])
    assert torch.equal(gathered, torch.arange(ctx.world).float().repeat_interleave(1000))
    out = torch.empty(70_000)
    dist.reduce_scatter_tensor(out, torch.ones(70_000 * ctx.world), group=ctx.groups["none"])
    assert torch.equal(out, torch.full_like(out, ctx.world))
    dist.barrier(group=ctx.groups["fp16"])


@pytest.mark.parametrize("name", hosts.names())
def test_shm_on_two_hosts(name):
    why = separate_hosts_unavailable()
    if why:
        if os.environ.get("CNCCL_REQUIRE_NETNS") == "1":
            pytest.fail(f"CNCCL_REQUIRE_NETNS=1 but {why}")
        pytest.skip(why)
    env = dict(engine_env("shm"), CNCCL_TEST_CASES="hosts", UCX_TLS="tcp")
    check_case(cached_job(__name__, 4, env=env, hosts=HOSTS), name, 4, hosts)

"""10,000 mixed asynchronous collectives on 2 ranks: every result checked
exactly, and after warm-up no growth in resident memory (< 64 MiB), threads or file descriptors.

Inputs are small integers, so compressed sums and averages are exact on either wire and every
result can be compared bit for bit with one computed locally from both ranks' inputs.
"""

import math
import os
import random
import sys

import pytest
import torch
import torch.distributed as dist

import cnccl
from harness import Cases, check_case, engine_env, gloo_group, run_job

case = Cases()

R = dist.ReduceOp
TOTAL, WARMUP, BATCH = 10_000, 1_000, 8
MAX_ELEMS = (8 << 20) // 4


class Context:
    def __init__(self, rank, world):
        self.rank, self.world = rank, world
        self.gloo = gloo_group()
        self.groups = [dist.group.WORLD, dist.new_group(backend="cnccl", pg_options=cnccl.Options(wire_dtype="bf16")),
                       dist.new_group(backend="cnccl", pg_options=cnccl.Options(wire_dtype="none"))]


# ((k + 7i + 3·rank) mod 17) - 8 for element k of op i's input from `rank`: a window into one table,
# since computing it afresh for every rank's input of every op was most of this test's time.
PERIOD = 17
PATTERN = (torch.arange(MAX_ELEMS + PERIOD) % PERIOD - 8).float()


def data(n, i, rank):
    start = (7 * i + 3 * rank) % PERIOD
    return PATTERN[start:start + n]


def resources():
    with open("/proc/self/status") as f:
        rss = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS"))
    return rss, len(os.listdir("/proc/self/task")), len(os.listdir("/proc/self/fd"))


def launch(ctx, i, rng):
    """Starts op i; returns (work, check) where check() asserts its result."""
    n = 0 if rng.random() < 0.05 else int(math.exp(rng.uniform(0, math.log(MAX_ELEMS))))
    kinds = ["allreduce", "reduce_scatter", "allgather", "broadcast"]
    g = ctx.groups[i % len(ctx.groups)]
    kind = rng.choice(kinds + ["allreduce"])
    if i < len(kinds) * len(ctx.groups):
        # Warm-up: every kind at the largest size on every group grows each scratch buffer once.
        n, kind = MAX_ELEMS, kinds[i // len(ctx.groups)]
    inputs = [data(n, i, r) for r in range(ctx.world)]
    mine = inputs[ctx.rank].clone()
    if kind == "allreduce":
        op = rng.choice([R.SUM, R.AVG, R.MAX, R.MIN])
        stacked = torch.stack(inputs)
        want = {R.SUM: stacked.sum(0), R.AVG: stacked.sum(0) / ctx.world, R.MAX: stacked.amax(0),
                R.MIN: stacked.amin(0)}[op]
        return dist.all_reduce(mine, op=op, group=g, async_op=True), lambda: (mine, want, f"allreduce {op}")
    if kind == "reduce_scatter":
        n -= n % ctx.world
        out = torch.empty(n // ctx.world)
        want = sum(x[:n] for x in inputs).chunk(ctx.world)[ctx.rank]
        return (dist.reduce_scatter_tensor(out, mine[:n].contiguous(), group=g, async_op=True),
                lambda: (out, want, "reduce_scatter"))
    if kind == "allgather":
        out = torch.empty(n * ctx.world)
        return (dist.all_gather_into_tensor(out, mine, group=g, async_op=True),
                lambda: (out, torch.cat(inputs), "allgather"))
    root = i % ctx.world
    return dist.broadcast(mine, root, group=g, async_op=True), lambda: (mine, inputs[root], "broadcast")


@case(min_world=2)
def ten_thousand_mixed_async_collectives(ctx):
    rng = random.Random(1234)  # the same sequence on every rank
    baseline = None
    for start in range(0, TOTAL, BATCH):
        if start == WARMUP:
            baseline = resources()
        pending = [launch(ctx, i, rng) for i in range(start, min(start + BATCH, TOTAL))]
        for work, check in pending:
            work.wait()
            got, want, what = check()
            assert torch.equal(got, want), f"{what}: wrong result, max diff {(got - want).abs().max().item()}"
    rss, threads, fds = resources()
    print(f"load rank {ctx.rank}: RSS {baseline[0] >> 20} -> {rss >> 20} MiB after warm-up, threads {baseline[1]} -> "
          f"{threads}, fds {baseline[2]} -> {fds}", file=sys.stderr)
    assert rss - baseline[0] < 64 << 20, f"resident memory grew by {(rss - baseline[0]) >> 20} MiB after warm-up"
    assert threads <= baseline[1], f"threads grew from {baseline[1]} to {threads}"
    assert fds <= baseline[2], f"file descriptors grew from {baseline[2]} to {fds}"


@pytest.mark.parametrize("engine", ["shm", "ucx"])
def test_ten_thousand_mixed_async_collectives(engine):
    # A fixed mmap threshold: glibc otherwise raises it after large frees and keeps later tensors
    # in its heap, growing the resident size by itself; the test measures cnccl's growth.
    env = {"MALLOC_MMAP_THRESHOLD_": str(1 << 20), **engine_env(engine)}
    check_case(run_job(__name__, 2, timeout=900, env=env), "ten_thousand_mixed_async_collectives", 2, case)

"""Stress under glibc's malloc checking: what a use-after-free or a race on cnccl's threads would
corrupt, this job is built to make visible (docs/design.md, "Threads").

Two ranks, both pinned to one core (so cnccl's threads, gloo's and the caller's interleave at every
switch), run ROUNDS rounds; each round makes a group on every CPU engine (shared memory, UCX, gloo),
runs synchronous and asynchronous collectives on tensors that require grad (contiguous and strided,
SUM and AVG, futures chained with `then`), checks every result exactly and every `grad_fn` unchanged,
and destroys the group, while a Python thread allocates and frees beside them. The ranks run with
glibc's debugging malloc (`libc_malloc_debug.so.0`, `MALLOC_CHECK_=3`: a corrupted heap aborts at
the next call that sees it) and `glibc.malloc.perturb` (freed memory is overwritten, so a read after
free returns garbage that the exact checks catch). A rank that dies leaves its core file in its own
folder (RLIMIT_CORE raised, the working directory set there; the kernel's `core_pattern` decides
whether one is written) and its Python stacks on stderr (faulthandler); the test names both.

Inputs are small integers: every result is exact on the fp16 and bf16 wires.
"""

import glob
import json
import os
import random
import resource
import sys
import threading

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROUNDS = 16
OPS_PER_GROUP = 24
MALLOC_DEBUG = "/lib/x86_64-linux-gnu/libc_malloc_debug.so.0"


def engines():
    """The CPU engines this build has: gloo alone without UCX (no host path)."""
    from harness import CPU_ENGINES, host_path_built

    return CPU_ENGINES if host_path_built() else ["gloo"]


def rank_main(out):
    import datetime
    import faulthandler

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    folder = os.path.join(out, f"rank{rank}")
    os.makedirs(folder, exist_ok=True)
    os.chdir(folder)
    resource.setrlimit(resource.RLIMIT_CORE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    faulthandler.enable()
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})

    import torch
    import torch.distributed as dist

    import cnccl
    from harness import connect_store

    dist.init_process_group("gloo", store=connect_store(), rank=rank, world_size=world)
    stop = threading.Event()

    def allocate():  # the allocator's other customer: reuses every chunk cnccl's threads free
        rng = random.Random(rank)
        kept = []
        while not stop.is_set():
            kept.append(torch.full((rng.randrange(1, 1 << 14),), 3.0))
            kept.append(bytearray(rng.randrange(1, 1 << 12)))
            if len(kept) > 64:
                del kept[:rng.randrange(1, 64)]

    allocator = threading.Thread(target=allocate, daemon=True)
    allocator.start()
    rng = random.Random(7)  # the same sequence of calls on both ranks
    R = dist.ReduceOp
    checked = 0

    def mine(n, r, i):
        return ((torch.arange(n) + 3 * r + i) % 8).float()

    def expected_sum(n, i):
        return sum(mine(n, r, i) for r in range(world))

    for round_ in range(ROUNDS):
        for engine in engines():
            options = dict(cpu_engine="gloo") if engine == "gloo" else dict(
                cpu_engine="ucx", shm="on" if engine == "shm" else "off")
            options["wire_dtype"] = rng.choice(["fp16", "bf16", "none"])
            group = dist.new_group(backend="cnccl", timeout=datetime.timedelta(seconds=60),
                                   pg_options=cnccl.Options(**options))
            pending = []
            for i in range(OPS_PER_GROUP):
                n = rng.choice([1, 33, 4096, 1 << 16])
                kind = rng.choice(["allreduce", "avg", "strided", "reduce_scatter", "allgather", "broadcast"])
                async_op = rng.random() < 0.5
                base = mine(2 * n if kind == "strided" else n * world if kind == "reduce_scatter" else n, rank, i)
                leaf = base.clone().requires_grad_(True)
                t = leaf.clone()
                if kind == "strided":
                    t = t[::2]
                grad_fn = type(t.grad_fn).__name__
                if kind in ("allreduce", "strided"):
                    work = dist.all_reduce(t, group=group, async_op=async_op)
                    want = sum(mine(2 * n, r, i) for r in range(world))[::2] if kind == "strided" else expected_sum(n, i)
                elif kind == "avg":
                    work = dist.all_reduce(t, op=R.AVG, group=group, async_op=async_op)
                    want = expected_sum(n, i) / world
                elif kind == "reduce_scatter":
                    t = torch.empty(n)
                    grad_fn = None
                    work = dist.reduce_scatter_tensor(t, base, group=group, async_op=async_op)
                    want = sum(mine(n * world, r, i) for r in range(world))[rank * n:(rank + 1) * n]
                elif kind == "allgather":
                    gathered = torch.empty(n * world)
                    work = dist.all_gather_into_tensor(gathered, t.detach(), group=group, async_op=async_op)
                    t, grad_fn = gathered, None
                    want = torch.cat([mine(n, r, i) for r in range(world)])
                else:
                    work = dist.broadcast(t, src=i % world, group=group, async_op=async_op)
                    want = mine(n, i % world, i)
                if async_op:
                    chained = work.get_future().then(lambda f: f.value())
                    pending.append((work, chained, t, want, grad_fn, kind))
                else:
                    pending.append((None, None, t, want, grad_fn, kind))
                if len(pending) > 4 or not async_op:
                    for w, c, tensor, expect, before, what in pending:
                        if w is not None:
                            w.wait()
                            c.wait()
                        assert torch.equal(tensor.detach(), expect), (
                            f"round {round_} on {engine}: {what} of {tensor.numel()} differs from the exact result")
                        if before is not None:
                            after = type(tensor.grad_fn).__name__
                            assert after == before, f"round {round_} on {engine}: {what} changed grad_fn {before} -> {after}"
                        checked += 1
                    pending.clear()
            for w, c, tensor, expect, before, what in pending:
                w.wait()
                c.wait()
                assert torch.equal(tensor.detach(), expect), f"round {round_} on {engine}: {what} differs"
                checked += 1
            dist.destroy_process_group(group)
    stop.set()
    allocator.join()
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump({"checked": checked}, f)
    dist.destroy_process_group()


@pytest.mark.skipif(not os.path.exists(MALLOC_DEBUG), reason=f"glibc's debugging malloc ({MALLOC_DEBUG}) is not installed")
def test_collectives_and_groups_under_malloc_checking_on_one_core():
    from harness import launch, scratch_dir, wait_all

    out = scratch_dir("stress-")
    env = {"LD_PRELOAD": MALLOC_DEBUG, "MALLOC_CHECK_": "3", "GLIBC_TUNABLES": "glibc.malloc.perturb=165"}
    store, procs = launch([os.path.abspath(__file__), out], 2, env, out, fresh=True)  # under LD_PRELOAD from the start
    codes = wait_all(procs, 420)
    del store
    cores = sorted(glob.glob(os.path.join(out, "rank*", "core*")))
    with open("/proc/sys/kernel/core_pattern") as f:
        pattern = f.read().strip()
    assert codes == [0, 0], (f"ranks exited with {codes}; core files: {cores or 'none'} "
                             f"(core_pattern {pattern!r}); each rank's Python stacks are on stderr above")
    for rank in range(2):
        with open(os.path.join(out, f"rank{rank}.json")) as f:
            assert json.load(f)["checked"] == ROUNDS * len(engines()) * OPS_PER_GROUP


if __name__ == "__main__":
    sys.path.insert(0, HERE)
    rank_main(sys.argv[1])

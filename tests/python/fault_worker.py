"""One rank of test_faults.py: a stream of one kind of collective during which the victim rank
SIGKILLs itself, either between two collectives ("between") or at a point the test names through
the fault-injection hooks (backend/host/fault_injection.h), while data is in flight ("during").
Survivors record how the failure surfaced, how long after the last success, how long
destroy_process_group() took, and whether a cnccl segment is still mapped in their process.

Inputs differ by rank and element (a chunk written to the wrong place shows) and stay integers
below 2^11, so every wire and sum is exact and each result is compared exactly."""

import datetime
import json
import os
import signal
import sys
import time

import torch
import torch.distributed as dist

import cnccl
from harness import connect_store

N = 1 << 20  # 4 MiB of fp32: several shared-memory chunks, and UCX messages past the rendezvous size


def values(rank, n=N):
    return (torch.arange(n) % 61 + rank).float()


def allreduce(rank, world, pending):
    t, b = values(rank), torch.full((1000,), float(rank + 10))
    want = sum(values(r) for r in range(world))
    pending.append((dist.all_reduce(t, async_op=True), t, values(rank), want))
    pending.append((dist.broadcast(b, 0, async_op=True), b, torch.full((1000,), float(rank + 10)), None))
    return lambda: torch.equal(t, want) and torch.all(b == 10.0)


SMALL = 1 << 16  # 256 KiB of fp32: one shared-memory step
# What the synchronous call that failed left in its tensor (tensor_state), for main() to report.
failed_synchronous_call = {}


def tensor_state(tensor, before, want):
    """What a reduction that failed left in its tensor: as it was, or each element either as it was
    or its result ("partial"), or anything else ("corrupt")."""
    if torch.equal(tensor, before):
        return "unmodified"
    return "partial" if bool(((tensor == before) | (tensor == want)).all()) else "corrupt"


def sync_allreduce(rank, world, pending):
    """Synchronous: it runs on this thread (docs/design.md, "The caller's thread")."""
    t = values(rank, SMALL)
    want = sum(values(r, SMALL) for r in range(world))
    try:
        dist.all_reduce(t)
    except dist.DistBackendError:
        failed_synchronous_call["failed_tensor"] = tensor_state(t, values(rank, SMALL), want)
        raise
    return lambda: torch.equal(t, want)


def all_to_all(rank, world, pending):
    x = values(rank) + 1000 * rank
    out = torch.full_like(x, -1.0)
    pending.append((dist.all_to_all_single(out, x, async_op=True), None, None, None))
    each = N // world
    want = torch.cat([(values(r) + 1000 * r)[rank * each:(rank + 1) * each] for r in range(world)])
    return lambda: torch.equal(out, want)


def gather(rank, world, pending):
    x = values(rank)
    outs = [torch.full_like(x, -1.0) for _ in range(world)] if rank == 0 else None
    pending.append((dist.gather(x, outs, dst=0, async_op=True), None, None, None))
    return lambda: rank != 0 or all(torch.equal(outs[r], values(r)) for r in range(world))


def p2p(rank, world, pending):
    # A ring: every rank sends to the next and receives from the one before.
    x, got = values(rank), torch.full((N,), -1.0)
    ops = [dist.P2POp(dist.isend, x, (rank + 1) % world), dist.P2POp(dist.irecv, got, (rank - 1) % world)]
    for w in dist.batch_isend_irecv(ops):
        pending.append((w, None, None, None))
    return lambda: torch.equal(got, values((rank - 1) % world))


OPS = {"allreduce": allreduce, "sync_allreduce": sync_allreduce, "all_to_all": all_to_all, "gather": gather,
       "p2p": p2p,
       # allreduce in power-of-two frames: pieces through shared memory on one host, an all-to-all
       # over UCX alone.
       "pow2": allreduce}


def segments_mapped():
    with open("/proc/self/maps") as f:
        return [line.strip() for line in f if "memfd:cnccl" in line]


def main():
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    victim, kill_before, timeout, when, op = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), sys.argv[4], \
        sys.argv[5]
    options = cnccl.Options(scaling="pow2", accumulate="fp32", min_bytes=0) if op == "pow2" else None
    dist.init_process_group("cnccl", store=connect_store(), rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=timeout), pg_options=options)
    result = {"rank": rank}
    last_ok = time.monotonic()
    try:
        for i in range(1_000):
            if rank == victim and when == "between" and i == kill_before:
                os.kill(os.getpid(), signal.SIGKILL)
            pending = []
            correct = OPS[op](rank, world, pending)
            for w, tensor, before, want in pending:
                try:
                    w.wait()
                except dist.DistBackendError:
                    if tensor is not None:
                        result["failed_tensor"] = tensor_state(tensor, before, want)
                    raise
            assert correct(), f"{op} {i}: wrong result"
            last_ok = time.monotonic()
        result["error"] = None
    except dist.DistBackendError as e:
        result.update(failed_synchronous_call)
        result["error"] = str(e).split("\nException raised from")[0]
        result["seconds_to_error"] = time.monotonic() - last_ok
    start = time.monotonic()
    dist.destroy_process_group()
    result["destroy_seconds"] = time.monotonic() - start
    result["segments_mapped"] = segments_mapped()
    with open(os.path.join(os.environ["CNCCL_TEST_OUT"], f"rank{rank}.json"), "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()

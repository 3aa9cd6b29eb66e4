"""Ranks that disagree, ranks that never arrive, abort and shutdown (run by test_reliability.py).

Each case makes its own groups: a group that failed is unusable afterwards, by design.
"""

import datetime
import time

import torch
import torch.distributed as dist

import cnccl
from harness import case

R = dist.ReduceOp


class Context:
    def __init__(self, rank, world):
        self.rank, self.world = rank, world
        self.gloo = dist.new_group(backend="gloo")  # keeps ranks in step between cases

    def group(self, timeout=30, **options):
        return dist.new_group(backend="cnccl", timeout=datetime.timedelta(seconds=timeout),
                              pg_options=cnccl.Options(**options))


def expect_failure(fn, *fragments):
    """Runs fn, which must raise DistBackendError mentioning every fragment; returns the message."""
    try:
        fn()
    except dist.DistBackendError as e:
        msg = str(e)
        assert all(f in msg for f in fragments), f"error lacks {fragments}: {msg}"
        return msg
    raise AssertionError(f"no error (expected one mentioning {fragments})")


def disagreement(ctx, mine, odd, both, **options):
    """Rank 1 runs `odd`, the others `mine`; every rank must fail naming both sides, quickly,
    and leave its tensor as it was."""
    g = ctx.group(**options)
    t = torch.arange(1000, dtype=torch.float32)
    kept = t.clone()
    start = time.monotonic()
    fn = odd if ctx.rank == 1 else mine
    msg = expect_failure(lambda: fn(t, g), "ranks disagree", *both)
    assert time.monotonic() - start < 10, "took the timeout path, not the header check"
    assert "were not modified" in msg, msg
    assert torch.equal(t, kept), "a failed collective changed the caller's tensor"
    dist.destroy_process_group(g)


@case(min_world=2)
def disagreeing_element_counts(ctx):
    disagreement(ctx, lambda t, g: dist.all_reduce(t, group=g), lambda t, g: dist.all_reduce(t[:999], group=g),
                 ["allreduce(1000 x Float", "allreduce(999 x Float"])


@case(min_world=2)
def disagreeing_dtypes_of_equal_size(ctx):
    disagreement(ctx, lambda t, g: dist.all_reduce(t, group=g),
                 lambda t, g: dist.all_reduce(t.view(torch.int32), group=g),
                 ["1000 x Float", "1000 x Int"])


@case(min_world=2)
def disagreeing_ops(ctx):
    disagreement(ctx, lambda t, g: dist.all_reduce(t, op=R.SUM, group=g),
                 lambda t, g: dist.all_reduce(t, op=R.MAX, group=g), ["SUM", "MAX"], min_bytes=0)


@case(min_world=2)
def disagreeing_collectives(ctx):
    disagreement(ctx, lambda t, g: dist.all_reduce(t, group=g), lambda t, g: dist.broadcast(t, 0, group=g),
                 ["allreduce(1000 x Float", "broadcast(1000 x Float"])


@case(min_world=2)
def disagreeing_wire_settings(ctx):
    # Same call, but rank 1 was configured for bf16: equal byte counts, different numbers.
    g = ctx.group(wire_dtype="bf16" if ctx.rank == 1 else "fp16", min_bytes=0)
    t = torch.ones(1 << 16)
    expect_failure(lambda: dist.all_reduce(t, group=g), "ranks disagree", "fp16 wire", "bf16 wire")
    dist.destroy_process_group(g)


@case(min_world=2)
def rank_that_never_arrives_times_out_naming_the_collective(ctx):
    g = ctx.group(timeout=2)
    if ctx.rank == 0:
        start = time.monotonic()
        msg = expect_failure(lambda: dist.all_reduce(torch.ones(10), group=g), "allreduce", "seq", "timed out",
                             "group '")
        elapsed = time.monotonic() - start
        assert 1.5 < elapsed < 10, f"failed after {elapsed:.1f}s with a 2s timeout: {msg}"
        # The group stays unusable and says why, without waiting again.
        expect_failure(lambda: dist.all_reduce(torch.ones(10), group=g), "unusable after an earlier failure")
    dist.destroy_process_group(g)


def ends_outstanding_work(ctx, stop, word):
    """Rank 0 issues works its peers never join; stop(group) must end each with an error."""
    g = ctx.group(timeout=60)
    if ctx.rank == 0:
        works = [dist.all_reduce(torch.ones(100), group=g, async_op=True) for _ in range(3)]
        time.sleep(0.2)
        start = time.monotonic()
        stop(g)
        for w in works:
            expect_failure(w.wait, word)
        assert time.monotonic() - start < 5, f"{word} did not end the outstanding works promptly"
    else:
        time.sleep(0.5)


@case(min_world=2)
def abort_ends_outstanding_work(ctx):
    ends_outstanding_work(ctx, lambda g: g.abort(), "abort")


@case(min_world=2)
def shutdown_ends_outstanding_work(ctx):
    ends_outstanding_work(ctx, lambda g: g._get_backend(torch.device("cpu")).shutdown(), "shutdown")


@case
def shutdown_then_use_is_a_clear_error(ctx):
    g = ctx.group()
    dist.all_reduce(torch.ones(4), group=g)
    backend = g._get_backend(torch.device("cpu"))
    backend.shutdown()
    try:
        dist.all_reduce(torch.ones(4), group=g)
    except RuntimeError as e:
        assert "shut down" in str(e), str(e)
    else:
        raise AssertionError("a collective after shutdown() did not fail")

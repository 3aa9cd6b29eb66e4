"""Ranks that disagree, ranks that never arrive, abort and shutdown, on each CPU engine (in the shared
jobs, harness.share).

Each case makes its own groups: a group that failed is unusable afterwards, by design.
"""

import datetime
import re
import threading
import time

import pytest
import torch
import torch.distributed as dist

import cnccl
from harness import CPU_ENGINES, Cases, check_case, gloo_group, share, shared_job

case = Cases()
WORLD_SIZES = [2, 4]
share(__name__, CPU_ENGINES, WORLD_SIZES, timeout=600)

R = dist.ReduceOp


class Context:
    def __init__(self, rank, world):
        self.rank, self.world = rank, world
        self.gloo = gloo_group()

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


# Disagreements are found from the signature headers, at once; the timeout path would take the
# whole group timeout. A window of half the timeout tells the two apart on any loaded machine.
DISAGREEMENT_TIMEOUT = 60


def disagreement(ctx, mine, odd, both, odd_rank=1, **options):
    """Rank `odd_rank` runs `odd`, the others `mine`; every rank must fail naming both sides,
    well before the timeout, and leave its tensor as it was."""
    g = ctx.group(timeout=DISAGREEMENT_TIMEOUT, **options)
    t = torch.arange(1 << 14, dtype=torch.float32)
    kept = t.clone()
    start = time.monotonic()
    fn = odd if ctx.rank == odd_rank else mine
    msg = expect_failure(lambda: fn(t, g))
    elapsed = time.monotonic() - start
    assert torch.equal(t, kept), "a failed collective changed the caller's tensor"
    assert all(f in msg for f in ["ranks disagree", "not modified", *both]), f"error lacks {both}: {msg}"
    assert elapsed < DISAGREEMENT_TIMEOUT / 2, f"took {elapsed:.1f}s: the timeout path, not the header check"
    dist.destroy_process_group(g)


def each_odd_rank(ctx, mine, odd, both, **options):
    """The disagreement with rank 1 as the odd one, then rank 0 (which also leads the ring)."""
    for odd_rank in (1, 0):
        disagreement(ctx, mine, odd, both, odd_rank, **options)


@case(min_world=2)
def disagreeing_element_counts(ctx):
    each_odd_rank(ctx, lambda t, g: dist.all_reduce(t, group=g), lambda t, g: dist.all_reduce(t[:999], group=g),
                  ["allreduce(16384 x Float", "allreduce(999 x Float"])


@case(min_world=2)
def disagreeing_dtypes_of_equal_size(ctx):
    each_odd_rank(ctx, lambda t, g: dist.all_reduce(t, group=g),
                  lambda t, g: dist.all_reduce(t.view(torch.int32), group=g),
                  ["16384 x Float", "16384 x Int"])


@case(min_world=2)
def disagreeing_ops(ctx):
    each_odd_rank(ctx, lambda t, g: dist.all_reduce(t, op=R.SUM, group=g),
                  lambda t, g: dist.all_reduce(t, op=R.MAX, group=g), ["SUM", "MAX"], min_bytes=0)


@case(min_world=2)
def disagreeing_collectives(ctx):
    each_odd_rank(ctx, lambda t, g: dist.all_reduce(t, group=g), lambda t, g: dist.broadcast(t, 0, group=g),
                  ["allreduce(16384 x Float", "broadcast(16384 x Float"])


def reduce_scatter_into(t, g, each):
    out = t[:each].clone()
    dist.reduce_scatter_tensor(out, t[:each * dist.get_world_size(g)].clone(), group=g)
    t[:each] = out


@case(min_world=2)
def disagreeing_reduce_scatter(ctx):
    each_odd_rank(ctx, lambda t, g: reduce_scatter_into(t, g, 1000), lambda t, g: reduce_scatter_into(t, g, 999),
                  ["reduce_scatter_tensor(", "x Float"], min_bytes=0)


def coalesced_allreduce(t, g, second):
    cnccl.backend(g).allreduce_coalesced([t[:8192], t[8192:8192 + second]], dist.AllreduceCoalescedOptions()).wait()


@case(min_world=2)
def disagreeing_coalesced_calls_fail_before_writing_any_tensor(ctx):
    """The first tensors agree, the second ones do not: nothing may be written, the first included."""
    each_odd_rank(ctx, lambda t, g: coalesced_allreduce(t, g, 4000), lambda t, g: coalesced_allreduce(t, g, 3000),
                  ["allreduce_coalesced(2 tensors", "4000 x Float", "3000 x Float"], min_bytes=0)


def coalesced_allreduce_of_twelve(t, g, last):
    parts = [t[i * 1000:(i + 1) * 1000] for i in range(11)] + [t[11_000:11_000 + last]]
    cnccl.backend(g).allreduce_coalesced(parts, dist.AllreduceCoalescedOptions()).wait()


@case(min_world=2)
def disagreeing_past_the_header_fails_before_writing_any_tensor(ctx):
    """Twelve tensors' signatures are longer than a header holds, and only the last tensor differs:
    the part that fits agrees, so the hash of the whole text must tell them apart."""
    each_odd_rank(ctx, lambda t, g: coalesced_allreduce_of_twelve(t, g, 1200),
                  lambda t, g: coalesced_allreduce_of_twelve(t, g, 1100),
                  ["allreduce_coalesced(12 tensors", " ... #"], min_bytes=0)


@case(min_world=2)
def disagreeing_sum_scaling(ctx):
    # Rank 1 scales SUM by 1/world around the cast (CNCCL_SUM_SCALING=world): same bytes, other sums.
    g = ctx.group(sum_scaling="world" if ctx.rank == 1 else "none", min_bytes=0)
    t = torch.ones(1 << 16)
    expect_failure(lambda: dist.all_reduce(t, group=g), "ranks disagree", "sum scaled by the world size")
    assert torch.equal(t, torch.ones(1 << 16))
    dist.destroy_process_group(g)


@case(min_world=2)
def disagreeing_stochastic_rounding_seeds(ctx):
    # Different seeds round the owners' sums differently: ranks would end with different bytes.
    g = ctx.group(accumulate="fp32", rounding="sr", sr_seed=7 if ctx.rank == 1 else 5, min_bytes=0)
    t = torch.ones(1 << 16)
    expect_failure(lambda: dist.all_reduce(t, group=g), "ranks disagree", "seed 5", "seed 7")
    assert torch.equal(t, torch.ones(1 << 16))
    dist.destroy_process_group(g)


@case(min_world=2)
def disagreeing_wire_settings(ctx):
    # Same call, but rank 1 was configured for bf16: equal byte counts, different numbers.
    g = ctx.group(wire_dtype="bf16" if ctx.rank == 1 else "fp16", min_bytes=0)
    t = torch.ones(1 << 16)
    expect_failure(lambda: dist.all_reduce(t, group=g), "ranks disagree", "fp16 wire", "bf16 wire")
    assert torch.equal(t, torch.ones(1 << 16))
    dist.destroy_process_group(g)


@case(min_world=2)
def disagreeing_mx_scale_rules(ctx):
    # Rank 1 scales its MX blocks by FLOOR: the same bytes in number, other blocks.
    g = ctx.group(wire_dtype="mxfp8", accumulate="fp32", mx_scale="floor" if ctx.rank == 1 else "rceil",
                  min_bytes=0)
    t = torch.ones(1 << 16)
    expect_failure(lambda: dist.all_reduce(t, group=g), "ranks disagree", "rceil scales", "floor scales")
    assert torch.equal(t, torch.ones(1 << 16))
    dist.destroy_process_group(g)


@case(min_world=2)
def rank_that_never_arrives_times_out_naming_the_collective(ctx):
    """Rank 0 alone calls the collective: it fails after the group's timeout (not before), naming
    the collective, the group and a peer it waited on, and leaves its tensor as it was."""
    timeout = 3
    # Both groups exist before rank 0 starts waiting: with cpu_engine=gloo, creating a group waits
    # for every rank (up to the group's timeout), as gloo itself does.
    groups = [ctx.group(timeout=timeout) for _ in range(2)]
    if ctx.rank == 0:
        # Both in flight at once (direct and ring algorithms), so the case waits out one timeout.
        calls = []
        for n, g in zip((10, 1 << 20), groups):
            t = torch.full((n,), 5.0)
            calls.append((n, g, t, time.monotonic(), dist.all_reduce(t, group=g, async_op=True)))
        for n, g, t, start, work in calls:
            msg = expect_failure(work.wait, "allreduce", "seq", "timed out", "group '", "[peer rank ", "not modified")
            elapsed = time.monotonic() - start
            peer = int(re.search(r"\[peer rank (\d+)\]", msg).group(1))
            assert 0 < peer < ctx.world, msg
            assert torch.equal(t, torch.full((n,), 5.0)), "a timed-out collective changed the caller's tensor"
            # Not before the timeout; the upper end only says it did not hang (machines here are shared).
            assert timeout <= elapsed + 0.05 and elapsed < 20 * timeout, f"failed after {elapsed:.1f}s: {msg}"
            # The group stays unusable and says why, without waiting again.
            expect_failure(lambda: dist.all_reduce(t, group=g), "unusable after an earlier failure")
    # The others keep their groups until rank 0 is done: a peer that leaves is not one that never arrives.
    dist.barrier(group=ctx.gloo)
    for g in groups:
        dist.destroy_process_group(g)


def ends_outstanding_work(ctx, stop, word):
    """Rank 0 issues works its peers never join (each queued or waiting on peers, whichever the
    executor reached); stop(group) must end every one with an error naming the cause, long before
    the group's timeout, and leave the tensors alone."""
    timeout = 60
    g = ctx.group(timeout=timeout)
    if ctx.rank == 0:
        tensors = [torch.full((100,), 3.0) for _ in range(3)]
        works = [dist.all_reduce(t, group=g, async_op=True) for t in tensors]
        start = time.monotonic()
        stop(g)
        for w in works:
            expect_failure(w.wait, word)
        elapsed = time.monotonic() - start
        assert elapsed < timeout / 2, f"{word} took {elapsed:.1f}s to end the outstanding works"
        assert all(torch.equal(t, torch.full((100,), 3.0)) for t in tensors)


@case(min_world=2)
def abort_ends_outstanding_work(ctx):
    ends_outstanding_work(ctx, lambda g: g.abort(), "abort")


@case(min_world=2)
def shutdown_ends_outstanding_work(ctx):
    ends_outstanding_work(ctx, lambda g: g._get_backend(torch.device("cpu")).shutdown(), "shutdown")


def host_path(g):
    """Whether the group's CPU collectives take cnccl's host path (not gloo under the composed path),
    whose synchronous calls run on the caller's thread (docs/design.md, "The caller's thread")."""
    return cnccl.config(g)["cpu_engine"] == "ucx"


def caller_thread_count(g):
    return cnccl.stats(g)["caller_thread_collectives"]


@case(min_world=2)
def synchronous_calls_run_on_the_callers_thread_in_call_order(ctx):
    """A synchronous call with nothing queued runs on the caller's thread; one issued behind queued
    asynchronous calls runs after them. Rank 0 queues three large allreduces, the others run them one by
    one, then every rank makes a synchronous one: were rank 0's run ahead of its queue, the ranks would
    disagree on the order (an error), or sum the wrong tensors."""
    g = ctx.group(timeout=60)
    here = host_path(g)
    small = torch.full((1000,), float(ctx.rank))
    before = caller_thread_count(g)
    dist.all_reduce(small, group=g)
    assert torch.equal(small, torch.full((1000,), float(sum(range(ctx.world)))))
    assert caller_thread_count(g) - before == (1 if here else 0)

    large = [torch.full((1 << 20,), float(ctx.rank + i)) for i in range(3)]
    if ctx.rank == 0:
        works = [dist.all_reduce(t, group=g, async_op=True) for t in large]
    else:
        works = []
        for t in large:
            dist.all_reduce(t, group=g)
    small = torch.arange(1000, dtype=torch.float32) + ctx.rank
    dist.all_reduce(small, group=g)
    for w in works:
        w.wait()
    for i, t in enumerate(large):
        assert torch.equal(t, torch.full((1 << 20,), float(sum(range(ctx.world)) + ctx.world * i))), i
    assert torch.equal(small, ctx.world * torch.arange(1000, dtype=torch.float32) + sum(range(ctx.world)))
    dist.destroy_process_group(g)


@case(min_world=2)
def a_call_whose_peers_never_come_fails_at_the_timeout_and_abort_ends_it(ctx):
    """A call the caller waits for (an asynchronous one waited at once, then a synchronous one), run on the
    caller's thread, waits for its peers there: bounded by the group's timeout, and ended at once by
    abort() from another thread. The tensors stay as they were."""
    timeout = 3
    groups = [ctx.group(timeout=timeout), ctx.group(timeout=60)]
    if ctx.rank == 0:
        t = torch.full((10,), 5.0)
        start = time.monotonic()
        work = dist.all_reduce(t, group=groups[0], async_op=True)
        expect_failure(work.wait, "allreduce", "timed out", "[peer rank ")
        elapsed = time.monotonic() - start
        assert timeout <= elapsed + 0.05 and elapsed < 20 * timeout, f"failed after {elapsed:.1f}s"
        assert torch.equal(t, torch.full((10,), 5.0))

        aborter = threading.Timer(0.5, groups[1].abort)
        aborter.start()
        start = time.monotonic()
        expect_failure(lambda: dist.all_reduce(t, group=groups[1]), "abort")
        elapsed = time.monotonic() - start
        aborter.join()
        assert elapsed < 30, f"abort() took {elapsed:.1f}s to end a call waiting on the caller's thread"
        assert torch.equal(t, torch.full((10,), 5.0))
    dist.barrier(group=ctx.gloo)
    for g in groups:
        dist.destroy_process_group(g)


@case(min_world=2)
def an_aborted_rank_tells_its_peers_nothing(ctx):
    """abort() stops this rank alone (docs/design.md, "A rank that fails alone"): the call it ends fails
    here, and a peer that comes to that call later waits to its deadline, as NCCL's peers do; it is not
    told "rank 0 failed this collective" through shared memory or a notice."""
    timeout = 3
    g = ctx.group(timeout=timeout)
    # Past one chunk: rank 0 posted its first contribution before it aborted, and a one-shot call needs
    # nothing more of it.
    t = torch.full((1 << 20,), 1.0)
    if ctx.rank == 0:
        work = dist.all_reduce(t, group=g, async_op=True)
        time.sleep(0.3)  # the executor waits on its peers by now
        g.abort()
        expect_failure(work.wait, "abort")
    dist.barrier(group=ctx.gloo)
    if ctx.rank != 0 and host_path(g):
        start = time.monotonic()
        # At 4 ranks a survivor may hear of another's timeout first; none hears of rank 0's abort.
        msg = expect_failure(lambda: dist.all_reduce(t, group=g), "timed out")
        assert "rank 0 failed" not in msg and "abort" not in msg, msg
        assert time.monotonic() - start >= timeout / 2
    dist.barrier(group=ctx.gloo)
    dist.destroy_process_group(g)


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


@pytest.mark.parametrize("engine", CPU_ENGINES)
@pytest.mark.parametrize("world_size", WORLD_SIZES)
@pytest.mark.parametrize("name", case.names())
def test_reliability(name, world_size, engine):
    check_case(shared_job(__name__, world_size, engine), name, world_size, case)

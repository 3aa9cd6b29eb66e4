"""Every other c10d collective on cnccl (allgather, broadcast, reduce, gather, scatter, all_to_all,
point-to-point, coalesced forms, subgroups) and the Work contract and argument errors, against gloo,
world sizes 1 to 4, on each CPU engine (in the shared jobs, harness.share)."""

import datetime
import os
import warnings

import pytest
import torch
import torch.distributed as dist

import cnccl
from collective_oracles import (  # noqa: F401 - Context: the groups this job's cases use (harness.py)
    Context, R, TIMEOUT, assert_on_wire, reference, scaled_sum_bound,
)
from harness import CPU_ENGINES, Cases, check_case, share, shared_job

case = Cases()
WORLD_SIZES = [1, 2, 3, 4]
share(__name__, CPU_ENGINES, WORLD_SIZES)


@case
def allgather_forms(ctx):
    P = ctx.world
    for dtype in [torch.float32, torch.int64, torch.bool, torch.bfloat16]:
        for n in [0, 1, 33_333]:
            x = ctx.ints(n, dtype)
            expected = ctx.all_inputs(x)
            outs = [torch.empty_like(x) for _ in range(P)]
            dist.all_gather(outs, x)
            assert all(torch.equal(a, b) for a, b in zip(outs, expected))
            flat = torch.empty(P * n, dtype=dtype)
            dist.all_gather_into_tensor(flat, x)
            assert torch.equal(flat, torch.cat(expected))


@case
def allgather_coalesced_has_c10d_layout(ctx):
    """outputs[r][i] receives rank r's inputs[i], as gloo lays it out: checked against gloo itself
    (one dtype: gloo flattens the inputs through one promoted dtype and garbles mixed ones), and
    with mixed dtypes against every rank's inputs."""
    same = [ctx.ints(5, torch.float32), ctx.ints(9, torch.float32), ctx.ints(0, torch.float32)]
    mixed = [ctx.ints(5, torch.float32), ctx.ints(9, torch.int32), ctx.ints(0, torch.float64)]
    theirs = [[torch.empty_like(x) for x in same] for _ in range(ctx.world)]
    ctx.gloo._get_backend(torch.device("cpu")).allgather_coalesced(theirs, same).wait()
    for xs, reference_lists in [(same, theirs), (mixed, None)]:
        ours = [[torch.empty_like(x) for x in xs] for _ in range(ctx.world)]
        cnccl.backend().allgather_coalesced(ours, xs).wait()
        for i, x in enumerate(xs):
            gathered = ctx.all_inputs(x)
            for r in range(ctx.world):
                assert torch.equal(ours[r][i], gathered[r]), (r, i, ours[r][i], gathered[r])
                assert reference_lists is None or torch.equal(ours[r][i], reference_lists[r][i]), (r, i)


@case
def coalesced_forms_on_cpu(ctx):
    """allreduce_coalesced, reduce_scatter_tensor_coalesced and allgather_into_tensor_coalesced,
    each with compressed and plain tensors in one call, as DDP and FSDP issue them."""
    P, g = ctx.world, ctx.groups["fp16"]
    # Small integers in the plain parts: any order of adds is exact.
    big = torch.randn(P * (1 << 14), generator=ctx.gen)  # >= 64 KiB at any world size, divisible by it
    small, ints = ctx.ints(10, torch.float32), ctx.ints(P * 7, torch.int64)
    tensors = [big.clone(), small.clone(), ints.clone()]
    before = cnccl.stats(g)["compressed_collectives"]
    cnccl.backend(g).allreduce_coalesced(tensors, dist.AllreduceCoalescedOptions()).wait()
    assert cnccl.stats(g)["compressed_collectives"] - before == 1, "only the 128 KiB fp32 tensor is compressed"
    assert_on_wire(tensors[0], ctx.all_inputs(big), 1.0, "fp16", P, what="allreduce_coalesced[0]")
    for got, x in zip(tensors[1:], (small, ints)):
        assert torch.equal(got, reference(ctx.all_inputs(x), R.SUM).to(x.dtype)), "plain parts are exact"

    ins = [big.clone(), ctx.ints(P * 3, torch.float32)]
    outs = [torch.empty(x.numel() // P) for x in ins]
    with dist._coalescing_manager(group=g, async_ops=True) as cm:
        for o, x in zip(outs, ins):
            dist.reduce_scatter_tensor(o, x, op=R.AVG, group=g)
    cm.wait()
    mine = [x[ctx.rank * (x.numel() // P):(ctx.rank + 1) * (x.numel() // P)] for x in ctx.all_inputs(big)]
    assert_on_wire(outs[0], mine, 1 / P, "fp16", P, what="reduce_scatter_tensor_coalesced[0]")
    mine = [x.chunk(P)[ctx.rank] for x in ctx.all_inputs(ins[1])]
    exact = reference(mine, R.AVG)
    assert ((outs[1].double() - exact).abs() <= scaled_sum_bound(mine, 1 / P)).all(), "uncompressed AVG part"

    ins = [big.clone(), ints.clone()]
    outs = [torch.empty(P * x.numel(), dtype=x.dtype) for x in ins]
    with dist._coalescing_manager(group=g, async_ops=True) as cm:
        for o, x in zip(outs, ins):
            dist.all_gather_into_tensor(o, x, group=g)
    cm.wait()
    for o, x in zip(outs, ins):
        assert torch.equal(o, torch.cat(ctx.all_inputs(x))), "allgather is never lossy"


@case
def premul_sum_with_a_tensor_factor(ctx):
    """PREMUL_SUM's factor given as a one-element tensor scales like the same factor as a float."""
    x = torch.randn(1 << 15, generator=ctx.gen)
    a, b = x.clone(), x.clone()
    dist.all_reduce(a, op=dist._make_nccl_premul_sum(torch.tensor([0.3])), group=ctx.groups["fp16"])
    dist.all_reduce(b, op=dist._make_nccl_premul_sum(0.3), group=ctx.groups["fp16"])
    assert torch.equal(a, b)
    assert_on_wire(a, ctx.all_inputs(x), 0.3, "fp16", ctx.world, what="tensor factor")


@case
def zero_element_tensors_when_everything_compresses(ctx):
    g = ctx.groups["fp16-all"]
    for op in [R.SUM, R.AVG, R.MAX]:
        t = torch.empty(0)
        dist.all_reduce(t, op=op, group=g)
        assert t.numel() == 0
        out = torch.empty(0)
        dist.reduce_scatter_tensor(out, torch.empty(0), op=op, group=g)
        assert out.numel() == 0
    t = torch.ones(1 << 14)
    dist.all_reduce(t, group=g)
    assert torch.equal(t, torch.full_like(t, float(ctx.world))), "the group still works after empty calls"


@case
def compress_fp64_variable(ctx):
    """CNCCL_COMPRESS_FP64=1, read at group creation, compresses fp64 like Options(compress_fp64=True)."""
    os.environ["CNCCL_COMPRESS_FP64"] = "1"
    try:
        g = dist.new_group(backend="cnccl", timeout=TIMEOUT, pg_options=cnccl.Options(min_bytes=0))
    finally:
        del os.environ["CNCCL_COMPRESS_FP64"]
    assert cnccl.config(g)["compress_fp64"] is True
    x = torch.randn(1 << 14, dtype=torch.float64, generator=ctx.gen)
    t = x.clone()
    before = cnccl.stats(g)["compressed_collectives"]
    dist.all_reduce(t, group=g)
    assert cnccl.stats(g)["compressed_collectives"] - before == 1
    assert torch.equal(t, t.half().double()), "fp64 came back off the fp16 grid: it did not travel as fp16"
    dist.destroy_process_group(g)


@case
def group_timeout_wins_over_options_timeout(ctx):
    """As with nccl, the group's timeout (init_process_group/new_group) is the one in force; a
    different Options(timeout=...) is overridden, with a warning saying so. The group's timeout also
    bounds gloo's connection of the ranks (cpu_engine=gloo): a minute, not seconds, on a loaded machine."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        g = dist.new_group(backend="cnccl", timeout=datetime.timedelta(seconds=60),
                           pg_options=cnccl.Options(timeout=datetime.timedelta(seconds=99)))
    assert cnccl.config(g)["timeout"] == datetime.timedelta(seconds=60)
    assert any("timeout" in str(w.message) for w in caught), [str(w.message) for w in caught]
    dist.destroy_process_group(g)


@case
def collectives_record_no_autograd_history(ctx):
    """cnccl's threads write into the caller's tensors while the caller's thread may run autograd on
    them (DDP with create_graph=True registers hooks on its buckets): they must record no autograd
    history of their own, which would race with the caller's (a segfault in _register_hook, seen in
    upstream's test_ddp_create_graph). A write recorded anywhere shows as a new grad_fn. AVG, a
    strided tensor and fp32 accumulation write back through copies: on cpu_engine=gloo those run on
    gloo's thread, where a C++ future's callbacks run with that thread's grad mode on."""
    def fresh(n):
        return torch.ones(n, requires_grad=True).clone()

    def untouched(t, before, what):
        assert type(t.grad_fn).__name__ == before, f"{what}: grad_fn went from {before} to {t.grad_fn}"

    acc32 = dist.new_group(backend="cnccl", timeout=TIMEOUT, pg_options=cnccl.Options(accumulate="fp32", min_bytes=0))
    groups = {"fp16-all": ctx.groups["fp16-all"], "none": ctx.groups["none"], "accumulate=fp32": acc32}
    for n in (4, 1 << 16):
        for name, group in groups.items():
            for op in (R.SUM, R.PRODUCT, R.MAX, R.AVG):
                t = fresh(n)
                dist.all_reduce(t, op=op, group=group)
                untouched(t, "CloneBackward0", f"allreduce {op} of {n} on {name}")
            base = fresh(2 * n)
            strided = base[::2]
            before = type(strided.grad_fn).__name__
            dist.all_reduce(strided, group=group)
            untouched(strided, before, f"allreduce of a strided view of {n} on {name}")
            untouched(base, "CloneBackward0", f"the base of a strided view of {n} on {name}")
        t = fresh(n)
        dist.broadcast(t, 0)
        untouched(t, "CloneBackward0", f"broadcast of {n}")
        outs = [fresh(n) for _ in range(ctx.world)]
        dist.all_gather(outs, torch.ones(n))
        for t in outs:
            untouched(t, "CloneBackward0", f"allgather of {n}")
        for name in ("fp16-all", "accumulate=fp32"):
            out = fresh(n)
            dist.reduce_scatter_tensor(out, torch.ones(n * ctx.world), group=groups[name])
            untouched(out, "CloneBackward0", f"reduce_scatter_tensor of {n} on {name}")
    dist.destroy_process_group(acc32)


@case
def broadcast_reduce_gather_scatter(ctx):
    P = ctx.world
    # gloo gathers and scatters no complex tensors: with cpu_engine=gloo those are gloo's calls.
    dtypes = [torch.float32, torch.int8] + ([torch.complex64] if ctx.engine == "ucx" else [])
    for root in range(P):
        for dtype in dtypes:
            x = ctx.ints(1001, dtype)
            inputs = ctx.all_inputs(x)
            b = x.clone()
            dist.broadcast(b, root)
            assert torch.equal(b, inputs[root])
            r = x.clone()
            dist.reduce(r, root, op=R.SUM)
            if ctx.rank == root:
                assert torch.equal(r, reference(inputs, R.SUM).to(dtype))
            else:
                assert torch.equal(r, x), "reduce must leave non-root tensors alone"
            g = [torch.empty_like(x) for _ in range(P)] if ctx.rank == root else None
            dist.gather(x, g, dst=root)
            if ctx.rank == root:
                assert all(torch.equal(a, b) for a, b in zip(g, inputs))
            s = torch.empty_like(x)
            chunks = [x + i for i in range(P)] if dtype != torch.complex64 else [x * (i + 1) for i in range(P)]
            dist.scatter(s, chunks if ctx.rank == root else None, src=root)
            assert torch.equal(s, ctx.all_inputs(torch.stack(chunks))[root][ctx.rank])
    big = torch.randn(1 << 20, generator=ctx.gen)
    b = big.clone()
    dist.broadcast(b, 0)
    assert torch.equal(b, ctx.all_inputs(big)[0]), "broadcast is never lossy"


@case
def alltoall_forms(ctx):
    P, r = ctx.world, ctx.rank
    x = torch.arange(P * 4, dtype=torch.float32) + 100 * r
    out = torch.empty_like(x)
    dist.all_to_all_single(out, x)
    expected = torch.cat([torch.arange(r * 4, r * 4 + 4, dtype=torch.float32) + 100 * s for s in range(P)])
    assert torch.equal(out, expected)
    # Uneven splits: rank r sends (s + 1) rows of 3 to rank s.
    send = [s + 1 for s in range(P)]
    recv = [r + 1] * P
    rows = torch.full((sum(send), 3), float(r))
    got = torch.empty(sum(recv), 3)
    dist.all_to_all_single(got, rows, output_split_sizes=recv, input_split_sizes=send)
    assert torch.equal(got, torch.cat([torch.full((r + 1, 3), float(s)) for s in range(P)]))
    if ctx.engine == "gloo":
        return  # gloo's all_to_all takes lists of equal sizes only; with cpu_engine=gloo it is gloo's call
    ins = [torch.full((s + 2,), r * 10 + s, dtype=torch.int64) for s in range(P)]
    outs = [torch.empty(r + 2, dtype=torch.int64) for _ in range(P)]
    dist.all_to_all(outs, ins)
    assert all(torch.equal(outs[s], torch.full((r + 2,), s * 10 + r, dtype=torch.int64)) for s in range(P))


@case(min_world=2)
def send_recv_and_any_source(ctx):
    P, r = ctx.world, ctx.rank
    # Everyone posts its receive before its send: must not deadlock.
    right, left = (r + 1) % P, (r - 1) % P
    got = torch.empty(1 << 18)
    rw = dist.irecv(got, left)
    sw = dist.isend(torch.full((1 << 18,), float(r)), right)
    rw.wait()
    sw.wait()
    assert torch.all(got == left)
    if r == 0:
        seen = set()
        for _ in range(P - 1):
            t = torch.empty(3)
            w = dist.irecv(t)
            w.wait()
            src = w._source_rank() if hasattr(w, "_source_rank") else None
            assert src is not None and torch.all(t == src), (src, t)
            seen.add(src)
        assert seen == set(range(1, P))
    else:
        dist.send(torch.full((3,), float(r)), 0)


@case(min_world=2, only=(lambda world, engine: engine != "gloo", "gloo's point-to-point is gloo's own"))
def a_rank_blocked_in_irecv_uses_almost_no_cpu(ctx):
    """Rank 1 waits 2 s in irecv while rank 0 sleeps before its send. cnccl's executor then sleeps in
    the kernel up to 10 ms at a time (docs/design.md, "Peer failure and teardown over UCX"): 200
    wakeups of well under 100 us are < 0.02 s of CPU (measured: 0.005 s); 0.1 s leaves 5x that for a
    loaded machine and the process's other threads. Polling every 50 us took 0.31 s."""
    if ctx.rank > 1:
        return
    import resource
    import time

    if ctx.rank == 0:
        time.sleep(2.0)
        dist.send(torch.ones(4), 1)
        return
    usage = resource.getrusage(resource.RUSAGE_SELF)
    before = usage.ru_utime + usage.ru_stime
    t = torch.empty(4)
    dist.irecv(t, 0).wait()
    usage = resource.getrusage(resource.RUSAGE_SELF)
    cpu = usage.ru_utime + usage.ru_stime - before
    assert torch.all(t == 1)
    assert cpu < 0.1, f"{cpu:.3f} s of CPU while blocked 2 s in irecv"


@case(only=(lambda world, engine: engine == "ucx" and world == 3,
            "UCX tags carry the sequence over UCX alone; one odd ring (3 ranks) covers the wrap"))
def the_tag_sequence_wraps_without_a_mismatch(ctx):
    """UCX tags carry 14 bits of a collective's sequence number (docs/design.md, "Tags"): 2^14 + 300
    small allreduces on one group pass the wrap, in flight 256 at a time, each checked."""
    total, window = (1 << 14) + 300, 256
    for first in range(0, total, window):
        batch = [torch.full((2,), float(ctx.rank + i % 7)) for i in range(first, min(total, first + window))]
        works = [dist.all_reduce(t, async_op=True) for t in batch]
        for w in works:
            w.wait()
        for i, t in zip(range(first, total), batch):
            assert torch.all(t == 3 + 3 * (i % 7)), (i, t)


@case(min_world=2)
def batch_isend_irecv_two_way_exchange(ctx):
    """batch_isend_irecv goes through a coalescing window when the backend supports coalescing (on
    CUDA, one NCCL group); on the CPU paths the window's sends and receives complete in the one work
    it returns. Both neighbours at once, 4 MiB each way: more than any transport buffers."""
    P, r = ctx.world, ctx.rank
    assert dist.group.WORLD._get_backend(torch.device("cpu")).supports_coalescing
    right, left = (r + 1) % P, (r - 1) % P
    n = 1 << 20
    sends = [torch.full((n,), float(r)), torch.full((n,), float(r) + 0.5)]
    got_left, got_right = torch.empty(n), torch.empty(n)
    ops = [dist.P2POp(dist.isend, sends[0], right), dist.P2POp(dist.irecv, got_left, left),
           dist.P2POp(dist.isend, sends[1], left), dist.P2POp(dist.irecv, got_right, right)]
    works = dist.batch_isend_irecv(ops)
    assert len(works) == 1, works
    works[0].wait()
    assert works[0].is_completed()
    assert torch.all(got_left == left), got_left[:4]
    assert torch.all(got_right == right + 0.5), got_right[:4]


@case(min_world=3)
def subgroups(ctx):
    sub = dist.new_group([0, 2], backend="cnccl")
    if ctx.rank in (0, 2):
        t = torch.full((1 << 16,), float(ctx.rank))
        dist.all_reduce(t, group=sub)
        assert torch.all(t == 2.0)
        assert cnccl.stats(sub)["compressed_collectives"] == 1
    dist.barrier()


@case
def many_async_ops_in_flight(ctx):
    works, tensors, refs = [], [], []
    for i in range(64):
        n = [10, 1000, 40_000, 100_000][i % 4]
        x = ctx.ints(n, torch.float32)
        refs.append(reference(ctx.all_inputs(x), R.SUM).float())
        tensors.append(x)
    for x in tensors:
        works.append(dist.all_reduce(x, group=ctx.groups["none"], async_op=True))
    futs = [w.get_future() for w in works]
    for w, f, x, ref in zip(works, futs, tensors, refs):
        w.wait()
        assert f.value()[0] is x or f.value()[0].data_ptr() == x.data_ptr(), "future must hold the caller's tensor"
        assert torch.equal(x, ref)


@case
def zero_element_and_barrier(ctx):
    for op in [R.SUM, R.MAX, R.AVG]:
        t = torch.empty(0)
        dist.all_reduce(t, op=op)
        assert t.numel() == 0
    dist.barrier()
    dist.barrier(group=ctx.groups["bf16"])


@case
def future_and_work_contract(ctx):
    x = torch.randn(1 << 17, generator=ctx.gen)
    w = dist.all_reduce(x, async_op=True)
    fut = w.get_future()
    chained = fut.then(lambda f: f.value()[0] * 2)
    w.wait()
    assert w.is_completed() and w.exception() is None
    assert torch.equal(chained.wait(), x * 2)
    assert fut.value()[0].data_ptr() == x.data_ptr()


@case
def callback_may_run_a_collective_and_wait(ctx):
    """PowerSGD's hook allreduces inside a future callback and waits for it: that must not deadlock."""
    g = ctx.groups["fp16-all"]
    x, y = torch.ones(1 << 16), torch.full((1000,), float(ctx.rank))

    def nested(fut):
        dist.all_reduce(y, group=g, async_op=True).get_future().wait()
        return fut.value()[0] + y[0]

    chained = dist.all_reduce(x, group=g, async_op=True).get_future().then(nested).then(lambda f: f.value() * 2)
    expected = 2 * (ctx.world + sum(range(ctx.world)))
    assert torch.equal(chained.wait(), torch.full_like(x, float(expected)))


@case
def bad_input_raises_clear_errors(ctx):
    def raises(kind, fn, *fragments):
        """fn must raise exactly `kind` (docs/usage.md's promise), naming every fragment."""
        try:
            fn()
        except Exception as e:  # noqa: BLE001 - the type is checked below
            msg = str(e)
            assert type(e) is kind, f"expected {kind.__name__}, got {type(e).__name__}: {msg}"
            assert all(f in msg for f in fragments), f"unclear error: {msg!r} lacks {fragments}"
            return
        raise AssertionError(f"no error for {fragments}")

    raises(ValueError, lambda: dist.all_reduce(torch.ones(4).to_sparse()), "not supported")
    # dist.all_reduce never hands meta tensors to a backend; the backend itself must still refuse them.
    raises(ValueError, lambda: cnccl.backend().allreduce([torch.ones(4, device="meta")]), "meta")
    raises(ValueError, lambda: cnccl.backend().allreduce([torch.ones(4), torch.ones(4)]), "exactly one tensor")
    raises(ValueError, lambda: cnccl.backend().allgather(
        [[torch.empty(4)] * (ctx.world - 1) + [torch.empty(4, device="meta")]], [torch.ones(4)]), "meta")
    raises(TypeError, lambda: dist.all_reduce(torch.ones(4), op=R.BAND), "BAND", "integer")
    # torch refuses MAX on complex before any backend; cnccl's own check is reached directly.
    max_op = dist.AllreduceOptions()
    max_op.reduceOp = R.MAX
    raises(TypeError, lambda: cnccl.backend().allreduce([torch.ones(4, dtype=torch.complex64)], max_op), "complex")
    raises(TypeError, lambda: dist.all_reduce(torch.ones(4, dtype=torch.bool), op=R.AVG), "AVG")
    raises(ValueError, lambda: dist.all_gather([torch.empty(4)] * (ctx.world + 1), torch.ones(4)),
           "expected one per rank")
    raises(ValueError, lambda: dist.all_gather_into_tensor(torch.empty(ctx.world * 4 + 1), torch.ones(4)), "elements")
    raises(ValueError, lambda: dist.reduce_scatter_tensor(torch.empty(3), torch.ones(ctx.world * 4)), "elements")
    bad_root = dist.BroadcastOptions()
    bad_root.rootRank = ctx.world + 3
    raises(ValueError, lambda: cnccl.backend().broadcast([torch.ones(2)], bad_root), "root rank", "outside the group")
    # A PREMUL_SUM factor of more than one element never reaches a backend: torch refuses to make the op.
    raises(RuntimeError, lambda: dist._make_nccl_premul_sum(torch.ones(2)), "tensor_factor.numel() == 1")
    raises(ValueError, lambda: cnccl.Options(wire_dtype="fp8"), "wire_dtype",
           "fp16, bf16, e4m3, e5m2, mxfp8, mxfp8_e5m2, mxfp4, nvfp4, none")
    raises(ValueError, lambda: cnccl.Options(sum_scaling="max"), "sum_scaling", "none, world")
    raises(ValueError, lambda: cnccl.Options(min_bytes=-1), "min_bytes")
    raises(ValueError, lambda: cnccl.Options(cpu_engine="mpi"), "cpu_engine", "ucx, gloo")
    raises(TypeError, lambda: dist.all_reduce(torch.ones(4, dtype=torch.float8_e4m3fn)), "dtype")


@case
def group_timeout_and_seq(ctx):
    pg = cnccl.backend()
    seq = pg._get_sequence_number_for_group()
    dist.all_reduce(torch.ones(1))
    assert pg._get_sequence_number_for_group() == seq + 1
    assert dist.get_backend() == "cnccl"
    assert pg.name() == "cnccl"
    # docs/usage.md says so: torch creates sub-groups afresh and does not eager-connect a backend that
    # cannot split.
    assert not pg.supports_splitting



@pytest.mark.parametrize("engine", CPU_ENGINES)
@pytest.mark.parametrize("world_size", WORLD_SIZES)
@pytest.mark.parametrize("name", case.names())
def test_collective(name, world_size, engine):
    check_case(shared_job(__name__, world_size, engine), name, world_size, case, engine)

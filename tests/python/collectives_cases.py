"""Every c10d collective on cnccl, checked against gloo in the same job.

Oracles: exact results come from gloo (its own collective, or an all_gather of every rank's
input reduced locally in float64/int64). Inputs of uncompressed float cases are small integers,
so any summation order is exact and results must match bit for bit. Compressed results must lie
within the 16-bit rounding bound stated in `wire_bound`.
"""

import datetime

import torch
import torch.distributed as dist

import cnccl
from harness import case

R = dist.ReduceOp
FLOATS = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
INTS = [torch.int32, torch.int64, torch.uint8, torch.int8]
DTYPES = FLOATS + INTS + [torch.bool, torch.complex64]
SIZES = [0, 1, 7, 1000, 70_001]
UNIT = {"fp16": 2.0**-11, "bf16": 2.0**-8}  # unit roundoff of the wire format
TIMEOUT = datetime.timedelta(seconds=120)  # a case failing on some ranks only must not hang the job


class Context:
    def __init__(self, rank, world):
        self.rank, self.world = rank, world
        self.gloo = dist.new_group(backend="gloo")
        self.cnccl = dist.group.WORLD
        # One cnccl group per option set, all ranks in each, created once for the whole job.
        self.groups = {
            "fp16": dist.new_group(backend="cnccl", timeout=TIMEOUT, pg_options=cnccl.Options(wire_dtype="fp16")),
            "bf16": dist.new_group(backend="cnccl", timeout=TIMEOUT, pg_options=cnccl.Options(wire_dtype="bf16")),
            "none": dist.new_group(backend="cnccl", timeout=TIMEOUT, pg_options=cnccl.Options(wire_dtype="none")),
            "fp16-all": dist.new_group(backend="cnccl", timeout=TIMEOUT, pg_options=cnccl.Options(min_bytes=0)),
            "world-sum": dist.new_group(backend="cnccl", timeout=TIMEOUT, pg_options=cnccl.Options(sum_scaling="world", min_bytes=0)),
            "fp64": dist.new_group(backend="cnccl", timeout=TIMEOUT, pg_options=cnccl.Options(compress_fp64=True, min_bytes=0)),
        }
        self.gen = torch.Generator().manual_seed(1000 + rank)

    def ints(self, n, dtype, lo=-20, hi=20):
        if dtype == torch.bool:
            return torch.randint(0, 2, (n,), generator=self.gen).bool()
        if dtype == torch.uint8:
            lo, hi = 0, 4
        if dtype.is_complex:
            return torch.complex(self.ints(n, torch.float32), self.ints(n, torch.float32))
        return torch.randint(lo, hi, (n,), generator=self.gen).to(dtype)

    def all_inputs(self, t):
        """Every rank's copy of `t`, gathered through gloo."""
        out = [torch.empty_like(t) for _ in range(self.world)]
        dist.all_gather(out, t.contiguous(), group=self.gloo)
        return out


def reference(inputs, op, factor=None):
    """The exact reduction of the ranks' inputs (in rank order), in float64/int64/bool."""
    dtype = inputs[0].dtype
    wide = torch.complex128 if dtype.is_complex else torch.float64 if dtype.is_floating_point else torch.int64
    xs = [x.to(wide) for x in inputs] if dtype != torch.bool else inputs
    acc = xs[0].clone()
    for x in xs[1:]:
        if op in (R.SUM, R.AVG, R.PREMUL_SUM):
            acc = acc | x if dtype == torch.bool else acc + x
        elif op == R.PRODUCT:
            acc = acc & x if dtype == torch.bool else acc * x
        elif op == R.MIN:
            acc = torch.minimum(acc, x)
        elif op == R.MAX:
            acc = torch.maximum(acc, x)
        elif op == R.BAND:
            acc = acc & x
        elif op == R.BOR:
            acc = acc | x
        elif op == R.BXOR:
            acc = acc ^ x
    if op == R.PREMUL_SUM:
        acc = acc * factor
    if op == R.AVG:
        acc = acc / len(inputs) if (dtype.is_floating_point or dtype.is_complex) else torch.div(acc, len(inputs), rounding_mode="trunc")
    return acc


def valid(dtype, op):
    if dtype == torch.bool:
        return op not in (R.AVG,)
    if dtype.is_complex:
        return op in (R.SUM, R.AVG, R.PREMUL_SUM)  # torch itself refuses PRODUCT/MIN/MAX on complex
    if dtype.is_floating_point:
        return op not in (R.BAND, R.BOR, R.BXOR)
    return True


def op_of(op, factor):
    return dist._make_nccl_premul_sum(factor) if op == R.PREMUL_SUM else op


def wire_bound(inputs, scale, wire, world, post=1.0):
    """|cnccl - exact| <= (2P+1)·u·Σ|scale·x_i|·post + P·2^-24·post.

    Each input is rounded once to 16 bits (relative u), each of the P-1 partial sums once (at most
    u·Σ|x|), the restore is exact; 2^-24 per rank covers fp16 subnormals (bf16 has none to speak of).
    """
    u = UNIT[wire]
    mag = sum((x.double() * scale).abs() for x in inputs)
    return ((2 * world + 1) * u * mag + world * 2.0**-24) * abs(post)


@case
def allreduce_exact_every_dtype_op_size(ctx):
    """Uncompressed (group 'none') results equal the exact reduction for every dtype and op."""
    for dtype in DTYPES:
        for op in [R.SUM, R.AVG, R.PRODUCT, R.MIN, R.MAX, R.BAND, R.BOR, R.BXOR, R.PREMUL_SUM]:
            if not valid(dtype, op) or (op == R.PREMUL_SUM and not (dtype.is_floating_point or dtype.is_complex)):
                continue
            for n in SIZES:
                x = ctx.ints(n, dtype, -3, 4) if op == R.PRODUCT else ctx.ints(n, dtype)
                factor = 0.5 if op == R.PREMUL_SUM else None
                ref = reference(ctx.all_inputs(x), op, factor)
                t = x.clone()
                dist.all_reduce(t, op=op_of(op, factor), group=ctx.groups["none"])
                expected = ref.to(dtype) if dtype != torch.bool else ref
                if op == R.AVG and dtype in (torch.float16, torch.bfloat16):
                    # AVG pre-divides in the tensor's own 16-bit dtype (as NCCL): the 16-bit bound applies.
                    inputs = ctx.all_inputs(x)
                    wire = "fp16" if dtype == torch.float16 else "bf16"
                    assert ((t.double() - ref).abs() <= wire_bound(inputs, 1 / ctx.world, wire, ctx.world)).all()
                    continue
                if op == R.AVG and (dtype.is_floating_point or dtype.is_complex):
                    torch.testing.assert_close(t, expected, rtol=1e-6, atol=1e-6)
                    continue
                assert torch.equal(t, expected), f"{dtype} {op} n={n}: {t[:5]} != {expected[:5]}"


@case
def allreduce_matches_gloo_own_allreduce(ctx):
    """The same exact inputs through gloo's allreduce and cnccl's uncompressed path agree bitwise."""
    for dtype in [torch.float32, torch.float64, torch.int64, torch.int32]:
        for op in [R.SUM, R.PRODUCT, R.MIN, R.MAX]:
            for n in [0, 5, 100_000]:
                x = ctx.ints(n, dtype, -2, 3)
                a, b = x.clone(), x.clone()
                dist.all_reduce(a, op=op, group=ctx.gloo)
                dist.all_reduce(b, op=op, group=ctx.groups["none"])
                assert torch.equal(a, b), f"{dtype} {op} n={n}"


@case
def allreduce_compressed_within_16bit_bound(ctx):
    """fp32 above the threshold travels in 16 bits; results within the rounding bound, all ranks identical."""
    for name, wire in [("fp16", "fp16"), ("bf16", "bf16"), ("fp16-all", "fp16")]:
        for n in [1, 1000, 16_385, 70_001, 1 << 20, 8 << 20]:  # up to 32 MiB of fp32
            if name != "fp16-all" and n * 4 < 65536:
                continue
            for op, factor in [(R.SUM, None), (R.AVG, None), (R.PREMUL_SUM, 0.3), (R.MIN, None), (R.MAX, None)]:
                if n == 8 << 20 and op != R.SUM:
                    continue
                x = torch.randn(n, generator=ctx.gen) * 100
                inputs = ctx.all_inputs(x)
                ref = reference(inputs, op, factor)
                t = x.clone()
                dist.all_reduce(t, op=op_of(op, factor), group=ctx.groups[name])
                assert t.dtype == torch.float32
                scale = {R.AVG: 1 / ctx.world, R.PREMUL_SUM: factor}.get(op, 1.0)
                if op in (R.MIN, R.MAX):
                    bound = UNIT[wire] * ref.abs() + 2.0**-24
                else:
                    bound = wire_bound(inputs, scale, wire, ctx.world)
                err = (t.double() - ref).abs()
                worst = (err - bound).max().item() if n else 0
                assert worst <= 0, f"{name} {op} n={n}: error exceeds bound by {worst}"
                same = ctx.all_inputs(t)
                assert all(torch.equal(same[0], s) for s in same), f"{name} {op} n={n}: ranks disagree"


@case
def compressed_rounding_is_really_16bit(ctx):
    """A value that fp16 cannot hold comes back rounded: proof the wire really was 16-bit."""
    t = torch.full((1 << 16,), 1.0 + 2.0**-13)
    dist.all_reduce(t, group=ctx.groups["fp16-all"])
    assert torch.all(t == ctx.world), t[:3]
    t = torch.full((1 << 16,), 1.0 + 2.0**-13)
    dist.all_reduce(t, group=ctx.groups["none"])
    assert torch.all(t == ctx.world * (1.0 + 2.0**-13))


@case
def sum_is_not_divided_again(ctx):
    """SUM returns the sum (DDP already divided): 0.25 * ones on every rank sums to world/4."""
    t = torch.full((1 << 15,), 0.25)
    dist.all_reduce(t, group=ctx.groups["fp16-all"])
    assert torch.all(t == 0.25 * ctx.world)


@case
def overflow_safe_sum_scaling(ctx):
    """sum_scaling=world: raw values that overflow fp16 when cast first still sum correctly."""
    t = torch.full((1 << 14,), 60000.0)
    dist.all_reduce(t, group=ctx.groups["world-sum"])
    assert torch.isfinite(t).all()
    torch.testing.assert_close(t, torch.full_like(t, 60000.0 * ctx.world), rtol=2**-10, atol=0)
    if ctx.world > 1:
        u = torch.full((1 << 14,), 60000.0)
        dist.all_reduce(u, group=ctx.groups["fp16-all"])
        assert torch.isinf(u).all(), "without the option, 60000*world overflows fp16"


@case
def fp64_compressed_only_when_asked(ctx):
    x = torch.randn(1 << 15, dtype=torch.float64, generator=ctx.gen)
    inputs = ctx.all_inputs(x)
    a, b = x.clone(), x.clone()
    dist.all_reduce(a, group=ctx.groups["fp16-all"])
    assert torch.equal(a, reference(inputs, R.SUM)) or ctx.world > 1 and torch.allclose(a, reference(inputs, R.SUM), rtol=1e-12, atol=1e-12)
    dist.all_reduce(b, group=ctx.groups["fp64"])
    assert b.dtype == torch.float64
    assert ((b - reference(inputs, R.SUM)).abs() <= wire_bound(inputs, 1.0, "fp16", ctx.world)).all()
    if ctx.world > 1:
        assert not torch.equal(a, b), "fp64 through an fp16 wire must show rounding"


@case
def small_and_integer_tensors_pass_through(ctx):
    """Below the threshold, and for ints/bool/16-bit floats, results are exact."""
    x = ctx.ints(100, torch.float32) + 0.125
    t = x.clone()
    dist.all_reduce(t)  # 400 bytes < 64 KiB default threshold
    assert torch.equal(t, reference(ctx.all_inputs(x), R.SUM).float())
    for dtype in [torch.float16, torch.bfloat16, torch.int64, torch.bool]:
        y = ctx.ints(1 << 16, dtype)
        ref = reference(ctx.all_inputs(y), R.SUM)
        s = y.clone()
        dist.all_reduce(s, group=ctx.groups["fp16-all"])
        assert torch.equal(s, ref.to(dtype)), dtype


@case
def stats_prove_16bit_wire(ctx):
    """An fp32 allreduce above the threshold puts half the bytes on the wire (transport count)."""
    g = ctx.groups["fp16"]
    n = 1 << 20
    before = cnccl.stats(g)
    dist.all_reduce(torch.ones(n), group=g)
    after = cnccl.stats(g)
    assert after["collectives"] == before["collectives"] + 1
    assert after["compressed_collectives"] == before["compressed_collectives"] + 1
    assert after["bytes_uncompressed"] - before["bytes_uncompressed"] == 4 * n
    assert after["bytes_sent"] - before["bytes_sent"] == 2 * n
    sent = after["transport_bytes_sent"] - before["transport_bytes_sent"]
    fp32_ring = 2 * (ctx.world - 1) / ctx.world * 4 * n
    headers = 2 * 256  # the signature headers each collective sends its two ring neighbours
    uneven = 64  # parts differ by an element when the world size does not divide the count
    assert sent <= 0.5 * fp32_ring + headers + uneven, f"sent {sent} bytes, an fp32 ring would send {fp32_ring}"
    none = ctx.groups["none"]
    b = cnccl.stats(none)["transport_bytes_sent"]
    dist.all_reduce(torch.ones(n), group=none)
    assert cnccl.stats(none)["transport_bytes_sent"] - b >= 0.99 * fp32_ring


@case
def noncontiguous_tensors_are_handled(ctx):
    base = torch.randn(512, 256, generator=ctx.gen)
    t = base.t()  # non-contiguous view
    assert not t.is_contiguous()
    inputs = ctx.all_inputs(t.contiguous())
    ref = reference(inputs, R.SUM)
    dist.all_reduce(t, group=ctx.groups["fp16-all"])
    assert ((t.double() - ref).abs() <= wire_bound(inputs, 1.0, "fp16", ctx.world)).all()
    assert torch.equal(base.t(), t), "the result must land in the caller's view"


@case
def reduce_scatter_tensor_and_list(ctx):
    P = ctx.world
    for name, compressed in [("none", False), ("fp16", True), ("bf16", True)]:
        for each in [0, 3, 50_000]:
            for op, factor in [(R.SUM, None), (R.AVG, None), (R.PREMUL_SUM, 0.5), (R.MAX, None)]:
                wire = name if compressed and P * each * 4 >= 65536 else None
                x = (torch.randn(P * each, generator=ctx.gen) * 10) if wire else ctx.ints(P * each, torch.float32)
                inputs = ctx.all_inputs(x)
                ref = reference(inputs, op, factor)[ctx.rank * each:(ctx.rank + 1) * each]
                out = torch.empty(each)
                dist.reduce_scatter_tensor(out, x.clone(), op=op_of(op, factor), group=ctx.groups[name])
                out_list = torch.empty(each)
                dist.reduce_scatter(out_list, list(x.clone().chunk(P)) if each else [torch.empty(0)] * P,
                                    op=op_of(op, factor), group=ctx.groups[name])
                for got in (out, out_list):
                    if wire is None:
                        tol = 1e-6 if op in (R.AVG, R.PREMUL_SUM) else 0
                        torch.testing.assert_close(got.double(), ref, rtol=tol, atol=tol)
                    else:
                        scale = {R.AVG: 1 / P, R.PREMUL_SUM: factor}.get(op, 1.0)
                        mine = [i[ctx.rank * each:(ctx.rank + 1) * each] for i in inputs]
                        bound = UNIT[wire] * ref.abs() + 2**-24 if op == R.MAX else wire_bound(mine, scale, wire, P)
                        assert ((got.double() - ref).abs() <= bound).all(), f"{name} {op} each={each}"


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
    xs = [ctx.ints(5, torch.float32), ctx.ints(9, torch.int32)]
    outs = [[torch.empty_like(x) for _ in range(P)] for x in xs]
    for x, o in zip(xs, outs):
        dist.all_gather(o, x)
    assert torch.equal(torch.cat(outs[1]), torch.cat(ctx.all_inputs(xs[1])))
    ctx_outs = [[torch.empty_like(x) for _ in range(P)] for x in xs]
    work = ctx.cnccl._get_backend(torch.device("cpu")).allgather_coalesced(ctx_outs, xs)
    work.wait()
    for x, o in zip(xs, ctx_outs):
        assert torch.equal(torch.cat(o), torch.cat(ctx.all_inputs(x)))


@case
def broadcast_reduce_gather_scatter(ctx):
    P = ctx.world
    for root in range(P):
        for dtype in [torch.float32, torch.int8, torch.complex64]:
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
    def raises(fn, *fragments):
        try:
            fn()
        except Exception as e:  # noqa: BLE001
            msg = str(e)
            assert all(f in msg for f in fragments), f"unclear error: {msg!r} lacks {fragments}"
            return
        raise AssertionError(f"no error for {fragments}")

    raises(lambda: dist.all_reduce(torch.ones(4).to_sparse()), "not supported")
    # dist.all_reduce never hands meta tensors to a backend; the backend itself must still refuse them.
    raises(lambda: cnccl.backend().allreduce([torch.ones(4, device="meta")]), "meta")
    raises(lambda: cnccl.backend().allreduce([torch.ones(4), torch.ones(4)]), "exactly one tensor")
    raises(lambda: cnccl.backend().allgather([[torch.empty(4)] * (ctx.world - 1) + [torch.empty(4, device="meta")]],
                                             [torch.ones(4)]), "meta")  # one list, two devices
    raises(lambda: dist.all_reduce(torch.ones(4), op=R.BAND), "BAND", "integer")
    raises(lambda: dist.all_reduce(torch.ones(4, dtype=torch.complex64), op=R.MAX), "complex")
    raises(lambda: dist.all_reduce(torch.ones(4, dtype=torch.bool), op=R.AVG), "AVG")
    raises(lambda: dist.all_gather([torch.empty(4)] * (ctx.world + 1), torch.ones(4)), "expected one per rank")
    raises(lambda: dist.all_gather_into_tensor(torch.empty(ctx.world * 4 + 1), torch.ones(4)), "elements")
    raises(lambda: dist.reduce_scatter_tensor(torch.empty(3), torch.ones(ctx.world * 4)), "elements")
    raises(lambda: dist.broadcast(torch.ones(2), ctx.world + 3), "rank")
    raises(lambda: cnccl.Options(wire_dtype="fp8"), "wire_dtype", "fp16, bf16, none")
    raises(lambda: cnccl.Options(sum_scaling="max"), "sum_scaling", "none, world")
    raises(lambda: cnccl.Options(min_bytes=-1), "min_bytes")
    raises(lambda: dist.all_reduce(torch.ones(4, dtype=torch.float8_e4m3fn)), "dtype")


@case
def group_timeout_and_seq(ctx):
    pg = cnccl.backend()
    seq = pg._get_sequence_number_for_group()
    dist.all_reduce(torch.ones(1))
    assert pg._get_sequence_number_for_group() == seq + 1
    assert dist.get_backend() == "cnccl"
    assert pg.name() == "cnccl"

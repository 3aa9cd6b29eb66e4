"""What cnccl compresses and how, on CPU tensors, world sizes 1 to 4, on each CPU engine (in the
shared jobs, harness.share): allreduce and reduce_scatter in every dtype, op and size against gloo; results within the
16-bit bound and, at two ranks, bit-equal to an emulation written here; scales in fp32 before the
cast; what passes through exactly; the stats that prove the wire."""

import pytest
import torch
import torch.distributed as dist

import cnccl
from collective_oracles import (  # noqa: F401 - Context: the groups this job's cases use (harness.py)
    Context, DTYPES, R, SIZES, UNIT_OF, assert_on_wire, op_of, reference, scaled_sum_bound, valid, wire_bound,
)
from harness import CPU_ENGINES, Cases, check_case, share, shared_job

case = Cases()
WORLD_SIZES = [1, 2, 3, 4]
share(__name__, CPU_ENGINES, WORLD_SIZES)


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
                    inputs = ctx.all_inputs(x)
                    real = (lambda v: torch.view_as_real(v)) if dtype.is_complex else (lambda v: v)
                    err = (real(t).double() - real(ref).double()).abs()
                    assert (err <= scaled_sum_bound(inputs, 1 / ctx.world, UNIT_OF[dtype])).all(), f"{dtype} AVG n={n}"
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
    """fp32 above the threshold travels in 16 bits: results identical on all ranks, on the wire's
    grid, within the analytic bound, equal to the emulation at two ranks. Each rank checks the
    bound on its own 1/world of the elements (all hold the same bytes): the oracle's float64 passes
    over every rank's input were most of this case's time, done world times over."""
    P = ctx.world
    for name, wire in [("fp16", "fp16"), ("bf16", "bf16"), ("fp16-all", "fp16")]:
        # Up to 32 MiB of fp32, the chunked all-to-all with many chunks: on one group (the codec is the
        # same at every size, and 4 MiB already takes it on every group).
        for n in [1, 1000, 16_385, 70_001, 1 << 20] + ([8 << 20] if name == "fp16" else []):
            if name != "fp16-all" and n * 4 < 65536:
                continue
            for op, factor in [(R.SUM, None), (R.AVG, None), (R.PREMUL_SUM, 0.3), (R.MIN, None), (R.MAX, None)]:
                if n == 8 << 20 and op != R.SUM:
                    continue
                x = torch.randn(n, generator=ctx.gen) * 100
                inputs = ctx.all_inputs(x)
                t = x.clone()
                dist.all_reduce(t, op=op_of(op, factor), group=ctx.groups[name])
                assert t.dtype == torch.float32
                first = t.clone()
                dist.broadcast(first, 0, group=ctx.gloo)
                assert torch.equal(first, t), f"{name} {op} n={n}: rank {ctx.rank} differs from rank 0"
                mine = slice(ctx.rank * n // P, (ctx.rank + 1) * n // P)
                scale = {R.AVG: 1 / P, R.PREMUL_SUM: factor}.get(op, 1.0)
                assert_on_wire(t[mine], [i[mine] for i in inputs], scale, wire, P, op, f"{name} {op} n={n}")


@case
def scale_is_applied_in_fp32_before_the_cast(ctx):
    """AVG and PREMUL_SUM of values beyond fp16's range (65504) come back finite and right: the
    scale must be applied before the cast, not after it in 16 bits."""
    x = torch.full((1 << 15,), 1.0e5 if ctx.rank == 0 else 1.0)
    inputs = ctx.all_inputs(x)
    for op, factor, scale in [(R.AVG, None, 1 / max(ctx.world, 2)), (R.PREMUL_SUM, 0.5, 0.5)]:
        if op == R.AVG and ctx.world == 1:
            continue  # 1e5 / 1 does not fit in fp16: nothing to show at one rank
        t = x.clone()
        dist.all_reduce(t, op=op_of(op, factor), group=ctx.groups["fp16-all"])
        assert torch.isfinite(t).all(), f"{op}: 1e5 overflowed fp16, so the scale came after the cast"
        assert_on_wire(t, inputs, scale, "fp16", ctx.world, R.SUM, f"{op} of 1e5")


@case
def sum_is_not_divided_again(ctx):
    """SUM returns the sum (DDP already divided): 0.25 * ones on every rank sums to world/4."""
    t = torch.full((1 << 15,), 0.25)
    dist.all_reduce(t, group=ctx.groups["fp16-all"])
    assert torch.all(t == 0.25 * ctx.world)


@case
def overflow_safe_sum_scaling(ctx):
    """sum_scaling=world: raw values that overflow fp16 when summed in it still sum correctly, in
    allreduce and reduce_scatter; without the option the same sums overflow."""
    P = ctx.world
    n = P * (1 << 12)
    for what, run in [("allreduce", lambda t, g: dist.all_reduce(t, group=g) or t),
                      ("reduce_scatter", lambda t, g: reduce_scatter_of(t, g))]:
        x = torch.full((n,), 60000.0)
        t = run(x.clone(), ctx.groups["world-sum"])
        assert torch.isfinite(t).all(), what
        bound = wire_bound([torch.tensor([60000.0])] * P, 1 / P, "fp16", P, post=P)
        excess = ((t.double() - 60000.0 * P).abs() - bound).max().item()
        assert excess <= 0, f"{what}: error exceeds the fp16 bound by {excess}"
        if P > 1:
            u = run(x.clone(), ctx.groups["fp16-all"])
            assert torch.isinf(u).all(), f"{what}: without the option, 60000*world overflows fp16"


def reduce_scatter_of(x, group):
    out = torch.empty(x.numel() // dist.get_world_size(group))
    dist.reduce_scatter_tensor(out, x, group=group)
    return out


@case
def fp64_compressed_only_when_asked(ctx):
    x = torch.randn(1 << 15, dtype=torch.float64, generator=ctx.gen)
    inputs = ctx.all_inputs(x)
    a, b = x.clone(), x.clone()
    dist.all_reduce(a, group=ctx.groups["fp16-all"])
    assert ((a - reference(inputs, R.SUM)).abs() <= scaled_sum_bound(inputs, 1.0, 2.0**-53)).all(), "fp64 must pass through"
    assert not torch.equal(a, a.float().double()), "fp64 travelled through a narrower type"
    dist.all_reduce(b, group=ctx.groups["fp64"])
    assert b.dtype == torch.float64
    assert ((b - reference(inputs, R.SUM)).abs() <= wire_bound(inputs, 1.0, "fp16", ctx.world)).all()
    if ctx.world > 1:
        assert not torch.equal(a, b), "fp64 through an fp16 wire must show rounding"


@case
def small_and_integer_tensors_pass_through(ctx):
    """Below the threshold, and for ints/bool/16-bit floats, results are exact. 1 + 2^-13 is a value
    either 16-bit wire would round to 1: a threshold off by anything shows."""
    x = torch.full((100,), 1.0 + 2.0**-13)  # 400 bytes < the default 64 KiB threshold
    before = cnccl.stats()["compressed_collectives"]
    t = x.clone()
    dist.all_reduce(t)
    assert torch.equal(t, torch.full_like(x, ctx.world * (1.0 + 2.0**-13))), t[:3]
    assert cnccl.stats()["compressed_collectives"] == before, "a 400-byte tensor was compressed"
    g = ctx.groups["fp16"]
    for n, compressed in [(65536 // 4 - 1, False), (65536 // 4, True)]:  # one element either side of 64 KiB
        before = cnccl.stats(g)["compressed_collectives"]
        t = torch.full((n,), 1.0 + 2.0**-13)
        dist.all_reduce(t, group=g)
        expected = ctx.world * (1.0 if compressed else 1.0 + 2.0**-13)
        assert torch.equal(t, torch.full_like(t, expected)), (n, t[:3])
        assert cnccl.stats(g)["compressed_collectives"] - before == int(compressed), n
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
    if ctx.engine == "gloo":
        # gloo does not report its transport's bytes; what cnccl handed it is counted above.
        assert after["transport_bytes_sent"] == before["transport_bytes_sent"] == 0
        return
    sent = after["transport_bytes_sent"] - before["transport_bytes_sent"]
    # What each rank originates, per byte of the tensor: the chunked all-to-all sends 2(n-1)/n, as a
    # ring would; shared memory publishes its contributions to the others' parts and its own part's
    # result, 1 in all.
    per_byte = 1 if cnccl.config(g)["cpu_transport"] == "shm" else 2 * (ctx.world - 1) / ctx.world
    fp32_bytes = per_byte * 4 * n
    headers = 2 * 256  # the signature headers each collective sends its two ring neighbours
    uneven = 64  # parts differ by an element when the world size does not divide the count
    assert sent <= 0.5 * fp32_bytes + headers + uneven, f"sent {sent} bytes, fp32 would take {fp32_bytes}"
    none = ctx.groups["none"]
    b = cnccl.stats(none)["transport_bytes_sent"]
    dist.all_reduce(torch.ones(n), group=none)
    assert cnccl.stats(none)["transport_bytes_sent"] - b >= 0.99 * fp32_bytes


@case
def noncontiguous_tensors_are_handled(ctx):
    """Transposed views, compressed and not, small (direct) and large (chunked): the result lands in
    the caller's memory through the view, and equals what the same contiguous tensor gets."""
    for name in ["fp16-all", "none"]:
        for rows, cols in [(64, 32), (1024, 512)]:  # 8 KiB: direct; 2 MiB: chunked
            base = torch.randn(rows, cols, generator=ctx.gen)
            view = base.t()
            assert not view.is_contiguous()
            dense = view.contiguous()
            dist.all_reduce(dense, group=ctx.groups[name])
            dist.all_reduce(view, group=ctx.groups[name])
            assert torch.equal(base, dense.t()), f"{name} {rows}x{cols}: the caller's memory does not hold the result"
    P, each = ctx.world, 20_000
    for name in ["fp16", "none"]:
        x = torch.randn(P * each, 2, generator=ctx.gen)
        out_base = torch.zeros(each, 2)
        dist.reduce_scatter_tensor(out_base[:, 0], x[:, 0], group=ctx.groups[name])  # strided input and output
        dense = torch.empty(each)
        dist.reduce_scatter_tensor(dense, x[:, 0].contiguous(), group=ctx.groups[name])
        assert torch.equal(out_base[:, 0], dense), f"{name}: strided reduce_scatter_tensor differs"
        assert torch.equal(out_base[:, 1], torch.zeros(each)), f"{name}: wrote beside the strided output"
        dist.reduce_scatter(out_base[:, 1], list(x[:, 1].chunk(P)), group=ctx.groups[name])
        dist.reduce_scatter_tensor(dense, x[:, 1].contiguous(), group=ctx.groups[name])
        assert torch.equal(out_base[:, 1], dense), f"{name}: reduce_scatter of strided inputs differs"


@case
def reduce_scatter_tensor_and_list(ctx):
    P = ctx.world
    for name, compressed in [("none", False), ("fp16", True), ("bf16", True)]:
        for each in [0, 3, 50_000]:
            for op, factor in [(R.SUM, None), (R.AVG, None), (R.PREMUL_SUM, 0.5), (R.MAX, None), (R.MIN, None)]:
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
                    what = f"{name} {op} each={each}"
                    scale = {R.AVG: 1 / P, R.PREMUL_SUM: factor}.get(op, 1.0)
                    mine = [i[ctx.rank * each:(ctx.rank + 1) * each] for i in inputs]
                    if wire is None:
                        # Small integers: SUM, MIN and MAX are exact; AVG and PREMUL_SUM scale in fp32.
                        bound = scaled_sum_bound(mine, scale) if scale != 1.0 else 0
                        assert ((got.double() - ref).abs() <= bound).all(), what
                    else:
                        assert_on_wire(got, mine, scale, wire, P, op, what)



@pytest.mark.parametrize("engine", CPU_ENGINES)
@pytest.mark.parametrize("world_size", WORLD_SIZES)
@pytest.mark.parametrize("name", case.names())
def test_compression(name, world_size, engine):
    check_case(shared_job(__name__, world_size, engine), name, world_size, case)

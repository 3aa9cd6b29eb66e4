"""Every c10d collective on cnccl, checked against gloo in the same job.

Oracles: exact results come from gloo (its own collective, or an all_gather of every rank's
input reduced locally in float64/int64). Inputs of uncompressed float cases are small integers,
so any summation order is exact and results must match bit for bit. Compressed results must lie
within the 16-bit rounding bound stated in `wire_bound`.
"""

import datetime
import os
import warnings

import torch
import torch.distributed as dist

import cnccl
from harness import CASE_TIMEOUT, case, gloo_group
from wire_formats import HALF_SUBNORMAL_STEP, UNIT, WIRE_DTYPE

R = dist.ReduceOp
FLOATS = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
INTS = [torch.int32, torch.int64, torch.uint8, torch.int8]
DTYPES = FLOATS + INTS + [torch.bool, torch.complex64]
SIZES = [0, 1, 7, 1000, 70_001]
TIMEOUT = CASE_TIMEOUT


class Context:
    def __init__(self, rank, world):
        self.rank, self.world = rank, world
        self.gloo = gloo_group()
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
        # CPU tensors run on cnccl's host path (ucx) or on torch's gloo under the composed path.
        self.engine = cnccl.config()["cpu_engine"]

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
    """The analytic bound on |cnccl - exact| for a compressed sum of `world` contributions:

        (P·u·(1+u)^P + 2·2^-24·(1+u)^P)·Σ|scale·x_i|·|post| + P·s·|post|

    Each contribution is scaled in fp32 (relative 2^-24) and rounded once to the wire (u); each of
    the P-1 adds rounds once (u of a partial sum, itself at most (1+u)^P·Σ|scale·x|); the restore
    is exact and its post-scale rounds once in fp32 (2^-24); s, half the wire's subnormal step, is
    the absolute error of a rounding that lands among subnormals.
    """
    u = UNIT[wire]
    growth = (1 + u) ** world
    mag = sum((x.double() * scale).abs() for x in inputs)
    return ((world * u + 2 * 2.0**-24) * growth * mag + world * HALF_SUBNORMAL_STEP[wire]) * abs(post)


UNIT_OF = {torch.float32: 2.0**-24, torch.complex64: 2.0**-24, torch.float64: 2.0**-53, torch.complex128: 2.0**-53}


def scaled_sum_bound(inputs, scale, unit=2.0**-24):
    """|result - exact| for an uncompressed scaled sum in the inputs' own precision (unit roundoff
    `unit`: 2^-24 for fp32): each x·scale rounds once, each of the P-1 adds once (of a partial sum,
    at most (1+unit)^P·Σ|x·scale|). Complex inputs: per real and imaginary part."""
    world = len(inputs)
    parts = [torch.view_as_real(x) if x.is_complex() else x for x in inputs]
    return world * unit * (1 + unit) ** world * sum((x.double() * scale).abs() for x in parts)


def emulate_two_ranks(inputs, scale, wire, op=R.SUM):
    """What two ranks must produce, bit for bit: each input scaled in fp32 and rounded once to the
    wire; one add (or min/max) computed in fp32 and rounded once; widened back to fp32."""
    dt = WIRE_DTYPE[wire]
    a, b = ((x.float() * scale).to(dt).float() for x in inputs)
    combined = {R.MIN: torch.minimum, R.MAX: torch.maximum}.get(op, torch.add)(a, b)
    return combined.to(dt).float()


def assert_on_wire(t, inputs, scale, wire, world, op=R.SUM, what=""):
    """A compressed result with post-scale 1: representable in the wire dtype (it was restored
    from it), within the analytic bound, and at two ranks equal to the emulation."""
    assert torch.equal(t, t.to(WIRE_DTYPE[wire]).float()), f"{what}: result is not representable in {wire}"
    if op in (R.MIN, R.MAX):
        ref = reference(inputs, op)
        bound = UNIT[wire] * ref.abs() + HALF_SUBNORMAL_STEP[wire]  # one rounding of the extreme value
    else:
        bound = wire_bound(inputs, scale, wire, world)
        ref = reference([x.double() * scale for x in inputs], R.SUM)
    excess = ((t.double() - ref).abs() - bound).max().item() if t.numel() else 0
    assert excess <= 0, f"{what}: error exceeds the {wire} bound by {excess}"
    if world == 2:
        exact = emulate_two_ranks(inputs, scale, wire, op)
        assert torch.equal(t, exact), f"{what}: differs from the two-rank emulation by {(t - exact).abs().max()}"


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
    """fp32 above the threshold travels in 16 bits: results on the wire's grid, within the analytic
    bound, equal to the emulation at two ranks, identical on all ranks."""
    for name, wire in [("fp16", "fp16"), ("bf16", "bf16"), ("fp16-all", "fp16")]:
        for n in [1, 1000, 16_385, 70_001, 1 << 20, 8 << 20]:  # up to 32 MiB of fp32: direct and ring
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
                scale = {R.AVG: 1 / ctx.world, R.PREMUL_SUM: factor}.get(op, 1.0)
                assert_on_wire(t, inputs, scale, wire, ctx.world, op, f"{name} {op} n={n}")
                same = ctx.all_inputs(t)
                assert all(torch.equal(same[0], s) for s in same), f"{name} {op} n={n}: ranks disagree"


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
    """Transposed views, compressed and not, small (direct) and large (ring): the result lands in
    the caller's memory through the view, and equals what the same contiguous tensor gets."""
    for name in ["fp16-all", "none"]:
        for rows, cols in [(64, 32), (1024, 512)]:  # 8 KiB: direct; 2 MiB: ring
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
    different Options(timeout=...) is overridden, with a warning saying so."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        g = dist.new_group(backend="cnccl", timeout=datetime.timedelta(seconds=7),
                           pg_options=cnccl.Options(timeout=datetime.timedelta(seconds=99)))
    assert cnccl.config(g)["timeout"] == datetime.timedelta(seconds=7)
    assert any("timeout" in str(w.message) for w in caught), [str(w.message) for w in caught]
    dist.destroy_process_group(g)


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
        """fn must raise exactly `kind` (the README's promise), naming every fragment."""
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
    raises(ValueError, lambda: cnccl.Options(wire_dtype="fp8"), "wire_dtype", "fp16, bf16, none")
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
    # The README says so: torch creates sub-groups afresh and does not eager-connect a backend that
    # cannot split.
    assert not pg.supports_splitting

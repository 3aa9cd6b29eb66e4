"""The composed path over torch's gloo (cpu_engine=gloo), at 2, 3 and 4 ranks:
every compressible op x wire x dtype x sync/async x form, against plain torch arithmetic written here.

The oracle does what the composed path promises and nothing of cnccl's code: each rank's tensor is
scaled in its own dtype by the fp32 factor and cast to the wire dtype; the engine adds the ranks'
16-bit values, rounding each add; the result is widened back. The engine's order of adds is its
own business, so a sum must equal the sum in *one* of the orders an engine can use (every
sequential order, and at 4 ranks every pairwise tree), element by element. MIN and MAX do not
depend on order and must match exactly.
"""

import itertools
import warnings

import pytest
import torch
import torch.distributed as dist

import cnccl
from harness import CASE_TIMEOUT, Cases, check_case, everyones, gloo_group, share, shared_job

case = Cases()
WORLD_SIZES = [2, 3, 4]
# Its groups choose gloo themselves: it runs in the jobs whose default group is on gloo too.
share(__name__, ["gloo"], WORLD_SIZES)

R = dist.ReduceOp
WIRES = {"fp16": torch.float16, "bf16": torch.bfloat16}
DTYPES = [torch.float32, torch.float64]
FACTOR = 0.37
FORMS = ["all_reduce", "all_reduce_coalesced", "reduce_scatter_tensor", "reduce_scatter", "reduce_scatter_coalesced"]


class Context:
    def __init__(self, rank, world):
        self.rank, self.world = rank, world
        self.gloo = gloo_group()
        self.groups = {
            w: dist.new_group(backend="cnccl", timeout=CASE_TIMEOUT, pg_options=cnccl.Options(
                cpu_engine="gloo", wire_dtype=w, min_bytes=0, compress_fp64=True))
            for w in WIRES
        }
        self.gen = torch.Generator().manual_seed(7000 + rank)

    def all_inputs(self, t):
        return everyones(t, self.gloo)


def ops():
    """(name, op as the caller passes it, the fp32 factor applied before the cast)."""
    return [
        ("SUM", R.SUM, 1.0),
        ("AVG", R.AVG, None),  # 1 / world
        ("PREMUL_SUM scalar", dist._make_nccl_premul_sum(FACTOR), FACTOR),
        ("PREMUL_SUM tensor", dist._make_nccl_premul_sum(torch.tensor([FACTOR])), FACTOR),
        ("MIN", R.MIN, 1.0),
        ("MAX", R.MAX, 1.0),
    ]


def fp32(x):
    """x as the fp32 number the cast multiplies by."""
    return torch.tensor(x, dtype=torch.float32).item()


def staged(x, factor, wire):
    """One rank's tensor as it travels: scaled in its own dtype by the fp32 factor, cast once."""
    return (x * fp32(factor)).to(wire)


def add16(a, b):
    """One 16-bit add: exact in fp32, rounded once to the wire dtype."""
    return (a.float() + b.float()).to(a.dtype)


def engine_sums(parts):
    """Every value an engine can produce by adding the ranks' 16-bit parts, one rounding per add."""
    sums = []
    for order in itertools.permutations(range(len(parts))):
        acc = parts[order[0]]
        for i in order[1:]:
            acc = add16(acc, parts[i])
        sums.append(acc)
    if len(parts) == 4:
        for (a, b), (c, d) in [((0, 1), (2, 3)), ((0, 2), (1, 3)), ((0, 3), (1, 2))]:
            sums.append(add16(add16(parts[a], parts[b]), add16(parts[c], parts[d])))
    return torch.stack(sums)


def check(got, inputs, name, factor, wire, what):
    """`got` (this rank's result) against the ranks' `inputs` (the part that lands here)."""
    parts = [staged(x, factor, wire) for x in inputs]
    if name in ("MIN", "MAX"):
        reduce = torch.minimum if name == "MIN" else torch.maximum
        exact = parts[0]
        for p in parts[1:]:
            exact = reduce(exact, p)
        assert torch.equal(got, exact.to(got.dtype)), f"{what}: differs from the exact {name} of the 16-bit values"
        return
    candidates = engine_sums(parts).to(got.dtype)
    matches = (candidates == got).any(dim=0)
    assert matches.all(), (f"{what}: {int((~matches).sum())} of {got.numel()} elements are no order's 16-bit sum, "
                           f"e.g. got {got[~matches][:3].tolist()}, orders give {candidates[:, ~matches][:, 0].tolist()}")


def run(ctx, form, op, x, g, async_op):
    """Runs `form` on copies of x; returns the result tensors (one per x part) for this rank."""
    P = ctx.world
    if form == "all_reduce":
        t = x.clone()
        work = dist.all_reduce(t, op=op, group=g, async_op=async_op)
        results = [t]
    elif form == "all_reduce_coalesced":
        ts = [x.clone(), (x[: x.numel() // 2] * 2).clone()]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # deprecated in torch, still what some callers use
            work = dist.all_reduce_coalesced(ts, op=op, group=g, async_op=async_op)
        results = ts
    elif form == "reduce_scatter_tensor":
        out = torch.empty(x.numel() // P, dtype=x.dtype)
        work = dist.reduce_scatter_tensor(out, x.clone(), op=op, group=g, async_op=async_op)
        results = [out]
    elif form == "reduce_scatter":
        out = torch.empty(x.numel() // P, dtype=x.dtype)
        work = dist.reduce_scatter(out, list(x.clone().chunk(P)), op=op, group=g, async_op=async_op)
        results = [out]
    else:
        ins = [x.clone(), (x * 2).clone()]
        outs = [torch.empty(x.numel() // P, dtype=x.dtype) for _ in ins]
        with dist._coalescing_manager(group=g, async_ops=async_op) as cm:
            for o, i in zip(outs, ins):
                dist.reduce_scatter_tensor(o, i, op=op, group=g)
        work = cm if async_op else None
        results = outs
    if async_op:
        work.wait()
    elif form != "reduce_scatter_coalesced":
        assert work is None, f"{form}: a synchronous call returns no work"
    return results


def expected_inputs(ctx, form, x):
    """Each result's inputs across ranks: the parts of every rank's tensor that land on this rank."""
    P, r = ctx.world, ctx.rank
    xs = ctx.all_inputs(x)
    if form == "all_reduce":
        return [xs]
    if form == "all_reduce_coalesced":
        return [xs, [y[: y.numel() // 2] * 2 for y in xs]]
    if form in ("reduce_scatter_tensor", "reduce_scatter"):
        return [[y.chunk(P)[r] for y in xs]]
    return [[y.chunk(P)[r] for y in xs], [(y * 2).chunk(P)[r] for y in xs]]


def matrix(ctx, op_names):
    P = ctx.world
    for (name, op, factor), (wire_name, wire), dtype, async_op, form in itertools.product(
            [o for o in ops() if o[0] in op_names], WIRES.items(), DTYPES, [False, True], FORMS):
        factor = 1.0 / P if factor is None else factor
        x = (torch.randn(96 * P, generator=ctx.gen, dtype=torch.float64) * 8).to(dtype)
        what = f"{form} {name} {wire_name} {dtype} {'async' if async_op else 'sync'} at {P} ranks"
        results = run(ctx, form, op, x, ctx.groups[wire_name], async_op)
        for got, inputs in zip(results, expected_inputs(ctx, form, x)):
            assert got.dtype == dtype, what
            check(got, inputs, name, factor, wire, what)


@case
def sum_and_avg_match_a_16bit_sum_in_some_engine_order(ctx):
    matrix(ctx, {"SUM", "AVG"})


@case
def premul_sum_scales_by_the_fp32_factor_before_the_cast(ctx):
    matrix(ctx, {"PREMUL_SUM scalar", "PREMUL_SUM tensor"})


@case
def min_and_max_are_exact_on_the_16bit_values(ctx):
    matrix(ctx, {"MIN", "MAX"})


@case
def async_future_holds_the_restored_callers_tensor(ctx):
    g = ctx.groups["fp16"]
    x = torch.randn(1000, generator=ctx.gen)
    t = x.clone()
    work = dist.all_reduce(t, group=g, async_op=True)
    value = work.get_future().wait()
    assert value[0] is t or value[0].data_ptr() == t.data_ptr(), "the future holds the caller's tensor"
    check(t, ctx.all_inputs(x), "SUM", 1.0, torch.float16, "future value")
    assert work.is_completed() and work.is_success()


@case
def an_async_reduce_scatter_tensor_completes(ctx):
    """gloo runs reduce_scatter_tensor as a LambdaWork, with no future and an is_completed() that stays false:
    once cnccl waited for it, its own work reports done."""
    g = ctx.groups["fp16"]
    for x in (torch.randn(1000 * ctx.world, generator=ctx.gen), torch.arange(8 * ctx.world, dtype=torch.int64)):
        out = torch.empty(x.numel() // ctx.world, dtype=x.dtype)
        work = dist.reduce_scatter_tensor(out, x, group=g, async_op=True)
        work.wait()
        assert work.is_completed() and work.is_success(), f"{x.dtype}: not completed after wait()"


@case
def config_and_stats_report_the_gloo_engine(ctx):
    g = ctx.groups["bf16"]
    assert cnccl.config(g)["cpu_engine"] == "gloo"
    before = cnccl.stats(g)
    dist.all_reduce(torch.ones(1000), group=g)
    after = cnccl.stats(g)
    assert after["compressed_collectives"] - before["compressed_collectives"] == 1
    assert after["bytes_sent"] - before["bytes_sent"] == 2000, "the 16-bit bytes handed to gloo"


@pytest.mark.parametrize("world_size", WORLD_SIZES)
@pytest.mark.parametrize("name", case.names())
def test_composed(name, world_size):
    check_case(shared_job(__name__, world_size, "gloo"), name, world_size, case)

"""What the collective tests share: their groups (Context) and their oracles.

Oracles: exact results come from gloo (its own collective, or an all_gather of every rank's
input reduced locally in float64/int64). Inputs of uncompressed float cases are small integers,
so any summation order is exact and results must match bit for bit. Compressed results must lie
within the 16-bit rounding bound stated in `wire_bound`.
"""

import torch
import torch.distributed as dist

import cnccl
from harness import CASE_TIMEOUT, everyones, gloo_group
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
        return everyones(t, self.gloo)


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

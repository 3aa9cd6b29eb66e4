"""The block rotation (rotation=hadamard; docs/design.md, "Block rotation"): each block of 16 values
rotated by H · D / 4 before a compressed sum and back once it is in.

- The collectives, at 2, 3 and 4 ranks on the host path's engines (shared memory, UCX): allreduce (SUM,
  AVG, strided, fp64) and reduce_scatter on nvfp4 and mxfp4 equal an emulation, bit for bit: each rank's
  values rotated (wire_formats.hadamard: torch's adds in the kernels' order), through the wire's
  emulation (its own oracle, torchao), rotated back. A tail of n % 16 values passes unrotated.
- The rotation is orthonormal: rotating and rotating back returns the values within a few roundings, and
  a block's outlier is spread over its 16 elements (what lets a coarse wire keep the rest).
- Settings: refused on gloo's sums, with no compression and per level, by name; the signs follow the seed.
"""

import pytest
import torch
import torch.distributed as dist

import cnccl
from harness import CASE_TIMEOUT, CPU_ENGINES, Cases, check_case, everyones, gloo_group, share, shared_job
from test_mx import first_difference, require_torchao
from wire_formats import framed_allreduce, framed_owner_sum, hadamard, rotation_signs

R = dist.ReduceOp
HOST_PATH = [e for e in CPU_ENGINES if e != "gloo"]


def test_the_signs_follow_the_seed():
    assert rotation_signs(0) != rotation_signs(1)
    assert 0 < rotation_signs(7) < 1 << 16


def test_rotating_back_returns_the_values_and_spreads_an_outlier():
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(16 * 64 + 5, generator=gen)
    for dtype, bound in ((torch.float32, 2.0**-21), (torch.float64, 2.0**-50)):
        v = x.to(dtype)
        back = hadamard(hadamard(v, 0x1234), 0x1234, forward=False)
        # Four adds a butterfly stage each way, each within half an ulp of a value at most 4x the block's
        # largest: well within 2^-21 (fp32) of the block's norm.
        assert ((back - v).abs().max() / v.abs().max()) < bound, dtype
        assert torch.equal(hadamard(v, 0x1234)[-5:], v[-5:])
    spike = torch.zeros(16)
    spike[3] = 1.0
    assert (hadamard(spike, 0).abs() == 0.25).all()


def test_the_settings_are_checked():
    with pytest.raises(ValueError, match=r"rotation='givens' is not valid; allowed: none, hadamard"):
        cnccl.Options(rotation="givens")
    for fields in (dict(wire_dtype="none"), dict(wire_dtype="fp16", cpu_engine="gloo"),
                   dict(wire_dtype="fp16", inter_host_wire="mxfp8", accumulate="fp32")):
        with pytest.raises(ValueError, match=r"rotation=hadamard .* needs a compressed wire_dtype, cpu_engine=ucx"):
            cnccl.Options(rotation="hadamard", **fields)
    assert cnccl.Options(rotation="hadamard", wire_dtype="nvfp4", accumulate="fp32") is not None


# --- The collectives.

case = Cases()
WORLD_SIZES = [2, 3, 4]
share(__name__, HOST_PATH, WORLD_SIZES)
SEED = 21
WIRES = ["nvfp4", "mxfp4"]


class Context:
    def __init__(self, rank, world):
        self.rank, self.world = rank, world
        self.gloo = gloo_group()
        self.groups = {w: dist.new_group(backend="cnccl", timeout=CASE_TIMEOUT, pg_options=cnccl.Options(
            wire_dtype=w, min_bytes=0, accumulate="fp32", rotation="hadamard", sr_seed=SEED)) for w in WIRES}
        self.fp64 = dist.new_group(backend="cnccl", timeout=CASE_TIMEOUT, pg_options=cnccl.Options(
            wire_dtype="nvfp4", min_bytes=0, accumulate="fp32", rotation="hadamard", sr_seed=SEED,
            compress_fp64=True))
        self.signs = rotation_signs(SEED)
        self.gen = torch.Generator().manual_seed(41 + rank)

    def all_inputs(self, t):
        return everyones(t, self.gloo)

    def spread(self, n):
        return torch.randn(n, generator=self.gen) * torch.pow(10.0, torch.empty(n).uniform_(-3, 3, generator=self.gen))


def rotated_allreduce(ctx, inputs, wire, pre):
    rotated = [hadamard(x, ctx.signs) for x in inputs]
    return hadamard(framed_allreduce(rotated, wire, pre), ctx.signs, forward=False)


@case
def allreduce_equals_the_rotated_emulation(ctx):
    assert cnccl.config(ctx.groups["nvfp4"])["rotation"] == "hadamard"
    for wire, g in ctx.groups.items():
        for op in (R.SUM, R.AVG):
            for n in (45, 5_040, 100_003):
                x = ctx.spread(n)
                want = rotated_allreduce(ctx, ctx.all_inputs(x), wire, 1.0 / ctx.world if op == R.AVG else 1.0)
                t = x.clone()
                dist.all_reduce(t, op=op, group=g)
                assert first_difference(t, want) is None, f"{wire} {op} n={n}: {first_difference(t, want)}"


@case
def strided_and_fp64_tensors(ctx):
    x = ctx.spread(2 * 5_040)
    inputs = [v[::2] for v in ctx.all_inputs(x)]
    strided = x.clone()[::2]
    dist.all_reduce(strided, group=ctx.groups["nvfp4"])
    want = rotated_allreduce(ctx, inputs, "nvfp4", 1.0)
    assert first_difference(strided, want) is None, f"strided: {first_difference(strided, want)}"
    wide = x[::2].double()
    dist.all_reduce(wide, group=ctx.fp64)
    # fp64 rotates in fp64, then travels as fp32 through the wire: its own emulation.
    rotated = [hadamard(v.double(), ctx.signs).float() for v in inputs]
    want64 = hadamard(framed_allreduce(rotated, "nvfp4", 1.0).double(), ctx.signs, forward=False)
    assert first_difference(wide, want64) is None, f"fp64: {first_difference(wide, want64)}"


@case
def reduce_scatter_rotates_each_part_alone(ctx):
    for wire, g in ctx.groups.items():
        for n in (45, 4_099):
            x = ctx.spread(n * ctx.world)
            parts = [hadamard(v.chunk(ctx.world)[ctx.rank], ctx.signs) for v in ctx.all_inputs(x)]
            want = hadamard(framed_owner_sum(parts, wire, 1.0), ctx.signs, forward=False)
            out = torch.empty(n)
            dist.reduce_scatter_tensor(out, x, group=g)
            assert first_difference(out, want) is None, f"{wire} n={n}: {first_difference(out, want)}"


@pytest.mark.parametrize("engine", HOST_PATH)
@pytest.mark.parametrize("world_size", WORLD_SIZES)
@pytest.mark.parametrize("name", case.names())
def test_rotation(name, world_size, engine):
    require_torchao()
    check_case(shared_job(__name__, world_size, engine), name, world_size, case)

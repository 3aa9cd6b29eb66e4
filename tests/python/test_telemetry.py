"""What cnccl.stats() tells of the casts (docs/design.md, "Telemetry"), per group, on every CPU engine:

- cast_nonfinite and cast_saturated count, on the rank whose contribution held them, the values that
  were not finite and the finite ones past the wire's largest value (fp16: 65520 and up becomes inf)
  or, in MX blocks, past the element type's largest magnitude (saturated); counted here from the
  inputs and the OCP scale rule, independently of the codec.
- telemetry=error adds quantization_error, the relative L2 error of the last compressed collective's
  own contribution from every 256th value: within 15% of the error over every value, computed here
  (the sample of a 2^20-element contribution is 4096 values, whose estimate varies by about 1%).
- telemetry=off counts nothing; a group's counts are its own.
"""

import pytest
import torch
import torch.distributed as dist

import cnccl
from cnccl import _C
from harness import CASE_TIMEOUT, CPU_ENGINES, Cases, check_case, share, shared_job

case = Cases()
WORLD_SIZES = [2, 3]
share(__name__, CPU_ENGINES, WORLD_SIZES)
MX_LARGEST, MX_EMAX = {"mxfp8": 448.0, "mxfp4": 6.0}, {"mxfp8": 8, "mxfp4": 2}


class Context:
    def __init__(self, rank, world):
        self.rank, self.world = rank, world

        def group(**fields):
            return dist.new_group(backend="cnccl", timeout=CASE_TIMEOUT,
                                  pg_options=cnccl.Options(min_bytes=0, **fields))

        self.fp16 = group(wire_dtype="fp16")
        self.fp16_too = group(wire_dtype="fp16")
        self.off = group(wire_dtype="fp16", telemetry="off")
        self.error = {w: group(wire_dtype=w, telemetry="error", **({} if w in ("fp16", "bf16") else {"accumulate": "fp32"}))
                      for w in ("fp16", "bf16", "mxfp8", "mxfp4", "nvfp4")}
        self.floor = {w: group(wire_dtype=w, accumulate="fp32", mx_scale="floor") for w in ("mxfp8", "mxfp4")}
        self.unused = dist.new_group(backend="cnccl", timeout=CASE_TIMEOUT, pg_options=cnccl.Options(telemetry="error"))
        self.gen = torch.Generator().manual_seed(41 + rank)


def counted(group, fn):
    before = cnccl.stats(group)
    fn()
    after = cnccl.stats(group)
    return after["cast_nonfinite"] - before["cast_nonfinite"], after["cast_saturated"] - before["cast_saturated"]


def with_specials(ctx, n):
    """Gaussians; rank 0 also holds an inf, a NaN and four values past fp16's range."""
    x = torch.randn(n, generator=ctx.gen)
    if ctx.rank == 0:
        x[3], x[9] = float("inf"), float("nan")
        x[100:103] = 1e5
        x[200] = -7e4
    return x


@case
def an_fp16_cast_counts_what_was_not_finite_and_what_overflowed(ctx):
    x = with_specials(ctx, 1 << 16)
    other = cnccl.stats(ctx.fp16_too)
    counts = counted(ctx.fp16, lambda: dist.all_reduce(x.clone(), group=ctx.fp16))
    assert counts == ((2, 4) if ctx.rank == 0 else (0, 0)), counts
    counts = counted(ctx.fp16, lambda: dist.reduce_scatter_tensor(torch.empty(x.numel() // ctx.world),
                                                                  x[:x.numel() // ctx.world * ctx.world],
                                                                  group=ctx.fp16))
    assert counts == ((2, 4) if ctx.rank == 0 else (0, 0)), f"reduce_scatter: {counts}"
    after = cnccl.stats(ctx.fp16_too)
    assert (after["cast_nonfinite"], after["cast_saturated"]) == (other["cast_nonfinite"], other["cast_saturated"]), \
        "another group's casts were counted in this one"


@case
def telemetry_off_counts_nothing(ctx):
    x = with_specials(ctx, 1 << 16)
    assert counted(ctx.off, lambda: dist.all_reduce(x.clone(), group=ctx.off)) == (0, 0)
    assert "quantization_error" not in cnccl.stats(ctx.off) and cnccl.config(ctx.off)["telemetry"] == "off"


def mx_saturated(x, wire):
    """Values of x (whole blocks of 32) whose magnitude times 2^-X passes the element type's largest,
    X = floor(log2(amax)) - emax for each block's amax (the FLOOR rule; RCEIL saturates nothing)."""
    blocks = x.view(-1, 32)
    amax = blocks.abs().amax(1)
    x_exp = torch.floor(torch.log2(amax)) - MX_EMAX[wire]
    return int((blocks.abs() * torch.pow(2.0, -x_exp)[:, None] > MX_LARGEST[wire]).sum())


@case
def an_mx_cast_counts_its_saturated_elements(ctx):
    """A reduce_scatter's casts are this rank's contribution alone: its parts' blocks (each part a
    multiple of 32 elements). With FLOOR scales about one block in five saturates its largest values;
    RCEIL (the default) chooses the scale that saturates none."""
    each = 32 * 64
    x = torch.randn(each * ctx.world, generator=ctx.gen) * torch.pow(
        10.0, torch.empty(each * ctx.world).uniform_(-3, 3, generator=ctx.gen))
    if ctx.rank == 0:
        x[5] = float("inf")
    for wire in ("mxfp8", "mxfp4"):
        # The block with the inf has the NaN scale and no elements to saturate.
        finite = x[32:] if ctx.rank == 0 else x
        nonfinite = 1 if ctx.rank == 0 else 0
        for rule, g, saturated in (("floor", ctx.floor[wire], mx_saturated(finite, wire)),
                                   ("rceil", ctx.error[wire], 0)):
            counts = counted(g, lambda: dist.reduce_scatter_tensor(torch.empty(each), x, group=g))
            assert counts == (nonfinite, saturated), f"{wire} {rule}: {counts} != {(nonfinite, saturated)}"
        assert mx_saturated(finite, wire) > 0, "the data must saturate under FLOOR for the check to mean anything"


def relative_error(got, want):
    return ((got.double() - want.double()).norm() / want.double().norm()).item()


@case
def the_sampled_error_is_the_contributions(ctx):
    """fp16 and bf16: the contribution is x cast to the wire; MX and NVFP4: x through its parts' blocks."""
    n = 1 << 20
    x = torch.randn(n, generator=ctx.gen) * torch.pow(10.0, torch.empty(n).uniform_(-2, 2, generator=ctx.gen))
    for wire, g in ctx.error.items():
        if wire in ("fp16", "bf16"):
            exact = relative_error(x.to(getattr(torch, {"fp16": "float16", "bf16": "bfloat16"}[wire])).float(), x)
        else:
            part = -(-n // ctx.world)
            frames = _C._encode_frames(list(x.split(part)), part, 1.0, wire)
            exact = relative_error(_C._decode_frames(frames, part, wire).reshape(-1)[:n], x)
        dist.all_reduce(x.clone(), group=g)
        sampled = cnccl.stats(g)["quantization_error"]
        assert abs(sampled - exact) <= 0.15 * exact, f"{wire}: sampled {sampled:.4g}, every value {exact:.4g}"


@case
def the_error_is_nan_before_a_compressed_collective(ctx):
    g = ctx.unused
    assert torch.isnan(torch.tensor(cnccl.stats(g)["quantization_error"]))
    dist.all_reduce(torch.ones(4), group=g)  # below min_bytes: not compressed
    assert torch.isnan(torch.tensor(cnccl.stats(g)["quantization_error"]))


def test_the_setting_is_checked():
    with pytest.raises(ValueError, match="telemetry='all' is not valid; allowed: off, counts, error"):
        cnccl.Options(telemetry="all")


@pytest.mark.parametrize("engine", CPU_ENGINES)
@pytest.mark.parametrize("world_size", WORLD_SIZES)
@pytest.mark.parametrize("name", case.names())
def test_telemetry(name, world_size, engine):
    check_case(shared_job(__name__, world_size, engine), name, world_size, case)

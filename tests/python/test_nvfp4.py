"""The NVFP4 wire (docs/design.md, "NVFP4 blocks") against an independent oracle, torchao's
`nvfp4_quantize` with a per-tensor scale (the tensor being a part), bit for bit.

- The encoding, on the CPU kernels: the part scale P in the frame's header equals torchao's
  per_tensor_amax_to_scale, and every scale code and element byte equals nvfp4_quantize's under it, over
  random, outlier-heavy, element-subnormal, all-zero, tie and saturating blocks, short last blocks and odd
  counts. Where torchao has no rule (a part whose P would fall below 2^-120, an all-zero part included,
  where torchao divides by zero; a block that is not finite) the test holds cnccl to its own rule.
- Decoding is fl(e2m1 * fl(P * S)), torchao's dequantize.
- The collectives, at 2, 3 and 4 ranks on every CPU engine: allreduce and reduce_scatter equal an
  emulation built on torchao (wire_formats.framed_*): each part's blocks decoded, summed in fp32 in rank
  order, and (allreduce) encoded again under the sums' own part scale.
- An inf or a NaN on one rank comes back NaN in its block on every rank, the wire carries 1/2 + 1/16
  bytes an element each way, and a frame whose header no cnccl writes is refused naming the rank.
torchao is a test dependency (.ci/setup-deps.sh installs it); without it the cases skip by name.
"""

import pytest
import torch
import torch.distributed as dist

import cnccl
from cnccl import _C
from harness import CASE_TIMEOUT, CPU_ENGINES, Cases, check_case, engine_of, everyones, gloo_group, share, shared_job
from test_mx import first_difference, require_torchao
from wire_formats import (E2M1_VALUES, NV_BLOCK, NV_SMALLEST_PART, allreduce_sr, framed_allreduce, framed_owner_sum,
                          nv_blocks, nv_part_scale, reduce_scatter_sr)

R = dist.ReduceOp
HEADER = 9  # the part scale's 4 bytes, then zeros up to a block's 9


def encode(v, count=None, scale=1.0):
    """cnccl's frame of the values v (one row of `count` elements): (P, scale codes, element bytes, the rest)."""
    count = v.numel() if count is None else count
    frame = _C._encode_frames([v], count, scale, "nvfp4")[0]
    blocks = -(-count // NV_BLOCK)
    elements = -(-count // 2)
    part = frame[:4].view(torch.float32)[0]
    assert not frame[4:HEADER].any(), frame[:HEADER]
    return part, frame[HEADER:HEADER + blocks], frame[HEADER + blocks:HEADER + blocks + elements], \
        frame[HEADER + blocks + elements:]


def parts_of_every_kind():
    """fp32 parts of whole blocks, each kind chosen to reach a branch of the definition."""
    gen = torch.Generator().manual_seed(3)
    kinds = {
        # Blocks 10^-6..10^6 apart: the small ones' scales clamp at e4m3's smallest normal, 2^-6.
        "gaussian": (torch.randn(64, 16, generator=gen) * torch.pow(10.0, torch.empty(64, 1).uniform_(-6, 6, generator=gen))),
        "one scale a part": torch.randn(64, 16, generator=gen) * 1e-30,
        "outlier": torch.randn(64, 16, generator=gen).index_put_(
            (torch.arange(64), torch.randint(0, 16, (64,), generator=gen)),
            torch.randn(64, generator=gen) * torch.pow(10.0, torch.empty(64).uniform_(3, 6, generator=gen))),
        "zero blocks": torch.cat([torch.randn(2, 16, generator=gen), torch.zeros(6, 16), torch.full((2, 16), -0.0)]),
        "fp32 subnormals": (torch.randn(8, 16, generator=gen) * 1e-40).index_fill_(1, torch.tensor([5]), 1e-3),
    }
    # P = 1 (the part's amax is 2688): a block whose amax is 6 has S = 1 and its elements are its values,
    # rounded to nearest even at exact ties; one whose amax is 6.375 has s = 1.0625, a tie that e4m3 rounds
    # down to S = 1, so that 6.375 saturates to 6.
    ties = torch.tensor([6.0, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -0.25, -0.75, -1.25, -1.75, -2.5, -3.5, -5.0, 0.1])
    saturating = torch.tensor([6.375, -6.375, 6.2, 5.9] + [1.0] * 12)
    kinds["ties"] = torch.stack([torch.full((16,), 2688.0), ties, saturating])
    # The reciprocal's order: fl(fl(1 / P) / S) takes 645.0596923828125 past the tie at 1.25 where
    # fl(1 / fl(P * S)) (torchao before 0.17) leaves it below.
    order = torch.zeros(2, 16)
    order[0, 0], order[1, 0], order[1, 1] = 4334.80078125, 3184.710693359375, 645.0596923828125
    kinds["reciprocal order"] = order
    return {k: v.reshape(-1).contiguous() for k, v in kinds.items()}


def test_the_encoding_equals_torchaos_bit_for_bit():
    require_torchao()
    from torchao.prototype.mx_formats.nvfp4_tensor import per_tensor_amax_to_scale

    for kind, v in parts_of_every_kind().items():
        part, scales, elements, padding = encode(v)
        want_part = per_tensor_amax_to_scale(v.abs().max())
        assert want_part >= NV_SMALLEST_PART, kind
        assert part == want_part, f"{kind}: P {part.item()!r} != {want_part.item()!r}"
        want_scales, want_elements = nv_blocks(v, want_part)
        assert torch.equal(scales, want_scales), f"{kind}: scales {scales} != {want_scales}"
        differ = (elements != want_elements).nonzero()
        assert differ.numel() == 0, f"{kind}: {differ.numel()} element bytes differ, first at {differ[0].item()}"
        assert not padding.any(), f"{kind}: padding {padding}"
    _, scales, elements, _ = encode(parts_of_every_kind()["ties"])
    assert scales[1:].tolist() == [0x38, 0x38], scales  # S = 1 for both
    assert elements[8:16].tolist() == [0x07, 0x22, 0x44, 0x66, 0xA8, 0xCA, 0xEC, 0x0E], elements[8:16]
    assert elements[16] == 0x7 | 0xF << 4, elements[16]  # 6.375 and -6.375 saturate


def test_a_short_last_block_and_an_odd_count_are_padded_with_zeros():
    """45 values: two full blocks and one of 13, encoded as torchao encodes the 48 with zeros after them;
    the 23rd element byte's high nibble is the zero that pads the odd count, and the frame pads to 4 bytes."""
    require_torchao()
    v = torch.randn(45, generator=torch.Generator().manual_seed(9))
    padded = torch.cat([v, torch.zeros(3)])
    part, scales, elements, padding = encode(v)
    want_scales, want_elements = nv_blocks(padded, nv_part_scale(padded))
    assert torch.equal(scales, want_scales)
    assert torch.equal(elements, want_elements[:23]) and elements[22] >> 4 == 0, elements[22]
    assert (HEADER + 3 + 23 + padding.numel()) % 4 == 0 and not padding.any()
    # A row shorter than the frame's count: its missing values are +0s.
    short = torch.cat([v[:40], torch.zeros(8)])
    part, scales, elements, _ = encode(v[:40], count=45)
    assert part == nv_part_scale(short)
    want_scales, want_elements = nv_blocks(short, part)
    assert torch.equal(scales, want_scales) and torch.equal(elements, want_elements[:23])


def test_the_part_scale_has_a_floor_and_ignores_values_that_are_not_finite():
    """torchao divides by a zero P for a part of zeros; cnccl's P is at least 2^-120, under which every
    block takes the smallest scale, 2^-6: zeros decode to zero, and 1e-38 (times 2^126: 0.85) to the e2m1
    1 times 2^-126. P is taken over the finite values only, after the pre-scale."""
    for v, decoded in ((torch.zeros(32), 0.0), (torch.full((32,), 1e-38), 2.0**-126)):
        part, scales, elements, _ = encode(v)
        assert part == NV_SMALLEST_PART, part
        assert (scales == 0x08).all(), scales  # 2^-6
        got = _C._decode_frames(_C._encode_frames([v], 32, 1.0, "nvfp4"), 32, "nvfp4")
        assert (got == decoded).all(), got
    v = torch.randn(48, generator=torch.Generator().manual_seed(2))
    finite_part = encode(v)[0]
    v[20] = float("inf")
    assert encode(v)[0] == finite_part
    assert encode(v, scale=0.5)[0] == nv_part_scale(v * 0.5) != finite_part


def test_decoding_is_torchaos_dequantize():
    """fl(e2m1 * fl(P * S)) in fp32, element by element, for every kind of part."""
    require_torchao()
    for kind, v in parts_of_every_kind().items():
        part, scales, elements, _ = encode(v)
        nibbles = torch.stack([elements & 15, elements >> 4], 1).reshape(-1)[:v.numel()]
        block_scale = part * scales.view(torch.float8_e4m3fn).float()
        want = E2M1_VALUES[nibbles.long()] * block_scale.repeat_interleave(NV_BLOCK)[:v.numel()]
        got = _C._decode_frames(_C._encode_frames([v], v.numel(), 1.0, "nvfp4"), v.numel(), "nvfp4")[0]
        assert torch.equal(got, want), kind


def test_a_block_that_is_not_finite_has_the_nan_scale():
    """cnccl's rule, not torchao's: the block's scale is 0x7F and every value of it decodes to NaN; the
    other blocks are encoded as torchao encodes them under P of the finite values."""
    require_torchao()
    v = torch.randn(48, generator=torch.Generator().manual_seed(4))
    v[17], v[40] = float("inf"), float("nan")
    finite = v.clone()
    finite[16:] = 0
    part, scales, elements, _ = encode(v)
    want_scales, want_elements = nv_blocks(finite, part)
    assert scales.tolist()[1:] == [0x7F, 0x7F] and scales[0] == want_scales[0], scales
    assert torch.equal(elements[:8], want_elements[:8]) and not elements[8:].any()
    decoded = _C._decode_frames(_C._encode_frames([v], 48, 1.0, "nvfp4"), 48, "nvfp4")[0]
    assert decoded[16:].isnan().all() and decoded[:16].isfinite().all()


def test_a_frame_no_cnccl_writes_is_refused_naming_the_rank():
    v = torch.randn(32, generator=torch.Generator().manual_seed(5))
    frames = _C._encode_frames([v, v], 32, 1.0, "nvfp4")
    for bad in (0.0, float("nan"), float("inf"), 2.0**-121, -1.0, 1e36):
        corrupt = frames.clone()
        corrupt[1, :4] = torch.tensor([bad]).view(torch.uint8)
        with pytest.raises(dist.DistBackendError, match=r"NVFP4 frame from rank 1 carries the part scale"):
            _C._decode_frames(corrupt, 32, "nvfp4")


def test_nvfp4_needs_fp32_sums():
    with pytest.raises(ValueError, match=r"wire_dtype=nvfp4.*needs accumulate=fp32 and scaling=none.*its own e4m3 "
                                         r"scale under the part's fp32 one; got accumulate=wire"):
        cnccl.Options(wire_dtype="nvfp4")
    with pytest.raises(ValueError, match=r"wire_dtype=nvfp4.*needs accumulate=fp32"):
        cnccl.Options(wire_dtype="nvfp4", rounding="sr")
    with pytest.raises(ValueError, match=r"wire_dtype=nvfp4.*scaling=pow2"):
        cnccl.Options(wire_dtype="nvfp4", accumulate="fp32", scaling="pow2")
    assert cnccl.Options(wire_dtype="nvfp4", accumulate="fp32", rounding="sr") is not None
    # A level of a wire per level (test_levels.py sums it), with what every level needs.
    for inside, across in (("nvfp4", "mxfp8"), ("fp16", "nvfp4")):
        assert cnccl.Options(wire_dtype=inside, inter_host_wire=across, accumulate="fp32") is not None
    assert cnccl.Options(wire_dtype="nvfp4", inter_host_wire="mxfp8", accumulate="fp32", rounding="sr") is not None
    with pytest.raises(ValueError, match=r"inter_host_wire=nvfp4 .* with rounding=sr .* power-of-two frames"):
        cnccl.Options(wire_dtype="fp16", inter_host_wire="nvfp4", accumulate="fp32", rounding="sr")
    with pytest.raises(ValueError, match=r"allowed: fp16, bf16, e4m3, e5m2, mxfp8, mxfp8_e5m2, mxfp4, nvfp4, none"):
        cnccl.Options(wire_dtype="fp4")
    assert cnccl.Options(wire_dtype="nvfp4", accumulate="fp32") is not None


# --- The collectives.

case = Cases()
WORLD_SIZES = [2, 3, 4]
share(__name__, CPU_ENGINES, WORLD_SIZES)
SIZES = [1, 45, 5_040, 100_003]


class Context:
    def __init__(self, rank, world):
        self.rank, self.world = rank, world
        self.engine = engine_of()
        self.gloo = gloo_group()
        options = dict(wire_dtype="nvfp4", min_bytes=0, accumulate="fp32")
        self.group = dist.new_group(backend="cnccl", timeout=CASE_TIMEOUT, pg_options=cnccl.Options(**options))
        self.other_forms = {  # the forms of a tensor each path restores differently
            "untouched_on_failure": dist.new_group(backend="cnccl", timeout=CASE_TIMEOUT, pg_options=cnccl.Options(
                untouched_on_failure=True, **options)),
            "compress_fp64": dist.new_group(backend="cnccl", timeout=CASE_TIMEOUT, pg_options=cnccl.Options(
                compress_fp64=True, **options))}
        self.gen = torch.Generator().manual_seed(31 + rank)

    def all_inputs(self, t):
        return everyones(t, self.gloo)

    def spread(self, n):
        """Gaussians times 10^u, u uniform in [-4, 4] per element and rank."""
        return torch.randn(n, generator=self.gen) * torch.pow(10.0, torch.empty(n).uniform_(-4, 4, generator=self.gen))


@case
def allreduce_equals_the_torchao_emulation(ctx):
    assert cnccl.config(ctx.group)["wire_dtype"] == "nvfp4"
    for op in (R.SUM, R.AVG):
        for n in SIZES:
            x = ctx.spread(n)
            want = framed_allreduce(ctx.all_inputs(x), "nvfp4", 1.0 / ctx.world if op == R.AVG else 1.0)
            t = x.clone()
            dist.all_reduce(t, op=op, group=ctx.group)
            problem = first_difference(t, want)
            assert problem is None, f"{op} n={n}: {problem}"


@case
def strided_fp64_and_untouched_tensors_get_the_same_blocks(ctx):
    n = 100_003
    x = ctx.spread(2 * n)
    want = framed_allreduce([v[::2] for v in ctx.all_inputs(x)], "nvfp4", 1.0)
    strided = x.clone()[::2]
    dist.all_reduce(strided, group=ctx.group)
    assert first_difference(strided, want) is None, f"strided: {first_difference(strided, want)}"
    t = x[::2].clone()
    dist.all_reduce(t, group=ctx.other_forms["untouched_on_failure"])
    assert first_difference(t, want) is None, f"untouched_on_failure: {first_difference(t, want)}"
    wide = x[::2].double()
    dist.all_reduce(wide, group=ctx.other_forms["compress_fp64"])
    assert first_difference(wide, want.double()) is None, f"fp64: {first_difference(wide, want.double())}"


@case
def reduce_scatter_equals_the_torchao_emulation(ctx):
    for n in SIZES[1:]:
        x = ctx.spread(n * ctx.world)
        parts = [v.chunk(ctx.world)[ctx.rank] for v in ctx.all_inputs(x)]
        want = framed_owner_sum(parts, "nvfp4", 1.0)
        out = torch.empty(n)
        dist.reduce_scatter_tensor(out, x, group=ctx.group)
        assert first_difference(out, want) is None, f"n={n}: {first_difference(out, want)}"
        listed = torch.empty(n)
        dist.reduce_scatter(listed, list(x.chunk(ctx.world)), group=ctx.group)
        assert torch.equal(listed, want), f"reduce_scatter list n={n}"


@case
def coalesced_and_empty_tensors(ctx):
    """Empty tensors (a part of no values is a header alone) beside others, coalesced and alone, and an
    empty reduce_scatter."""
    xs = [ctx.spread(n) for n in (0, 7, 40_000)]
    wants = [framed_allreduce(ctx.all_inputs(x), "nvfp4", 1.0) for x in xs]
    ts = [x.clone() for x in xs]
    dist.all_reduce_coalesced(ts, group=ctx.group)
    for i, (t, want) in enumerate(zip(ts, wants)):
        assert torch.equal(t, want), f"tensor {i}: {first_difference(t, want)}"
    empty = torch.empty(0)
    dist.all_reduce(empty, group=ctx.group)
    dist.reduce_scatter_tensor(torch.empty(0), torch.empty(0), group=ctx.group)
    assert empty.numel() == 0


def sr_group(seed):
    return dist.new_group(backend="cnccl", timeout=CASE_TIMEOUT, pg_options=cnccl.Options(
        wire_dtype="nvfp4", min_bytes=0, accumulate="fp32", rounding="sr", sr_seed=seed))


@case
def stochastic_rounding_equals_its_emulation(ctx):
    """rounding=sr: every element of every contribution and of every owner's sums rounded up or down by
    its own random bits (its index in the tensor, the collective's number in the group, the rank or the
    owners' word); allreduce (SUM, AVG), reduce_scatter, an empty allreduce and an allreduce in one group,
    numbered 0, 1, 2, none, 3 as they come."""
    g = sr_group(11)
    seq = 0
    for op, n in ((R.SUM, 100_003), (R.AVG, 5_040)):
        x = ctx.spread(n)
        want = allreduce_sr(ctx.all_inputs(x), "nvfp4", 1.0 / ctx.world if op == R.AVG else 1.0, 11, seq)
        t = x.clone()
        dist.all_reduce(t, op=op, group=g)
        assert first_difference(t, want) is None, f"{op} n={n}: {first_difference(t, want)}"
        seq += 1
    x = ctx.spread(4_099 * ctx.world)
    out = torch.empty(4_099)
    dist.reduce_scatter_tensor(out, x, group=g)
    want = reduce_scatter_sr(ctx.all_inputs(x), ctx.rank, "nvfp4", 1.0, 11, seq)
    assert first_difference(out, want) is None, f"reduce_scatter: {first_difference(out, want)}"
    # An empty tensor takes no number; the next allreduce is number 3.
    dist.all_reduce(torch.empty(0), group=g)
    x = ctx.spread(777)
    t = x.clone()
    dist.all_reduce(t, group=g)
    want = allreduce_sr(ctx.all_inputs(x), "nvfp4", 1.0, 11, seq + 1)
    assert first_difference(t, want) is None, f"after the reduce_scatter: {first_difference(t, want)}"


@case
def stochastic_rounding_repeats_for_a_seed_and_differs_for_another(ctx):
    x = ctx.spread(40_000)
    results = []
    for seed in (5, 5, 6):
        t = x.clone()
        dist.all_reduce(t, group=sr_group(seed))
        results.append(t)
    assert torch.equal(results[0], results[1])
    assert (results[0] != results[2]).float().mean() > 0.1, "another seed moves many elements"
    nearest = x.clone()
    dist.all_reduce(nearest, group=ctx.group)
    assert (results[0] != nearest).float().mean() > 0.1, "stochastic rounding is not rounding to nearest"


@case
def non_finite_inputs_come_back_non_finite(ctx):
    """An inf on rank 0 and a NaN on the last rank: NaN there on every rank, and in the rest of their
    blocks; every other block equals the emulation."""
    n = 5_040
    x = ctx.spread(n)
    if ctx.rank == 0:
        x[3] = float("inf")
    if ctx.rank == ctx.world - 1:
        x[n - 2] = float("nan")
    t = x.clone()
    dist.all_reduce(t, group=ctx.group)
    assert t[[3, n - 2]].isnan().all(), t[[3, n - 2]].tolist()
    want = framed_allreduce(ctx.all_inputs(x), "nvfp4", 1.0)
    assert first_difference(t, want) is None, first_difference(t, want)


@case
def the_wire_carries_half_a_byte_and_a_16th(ctx):
    n = 1 << 20
    per_element = 0.5 + 1 / NV_BLOCK
    before = cnccl.stats(ctx.group)
    dist.all_reduce(torch.ones(n), group=ctx.group)
    after = cnccl.stats(ctx.group)
    assert after["bytes_sent"] - before["bytes_sent"] == n * per_element
    if ctx.engine == "gloo":
        return  # gloo does not report its transport's bytes
    sent = after["transport_bytes_sent"] - before["transport_bytes_sent"]
    if ctx.engine == "shm":
        blocks = n * per_element  # its blocks of the others' parts and its own part's sum
    else:  # the all-to-all and the allgather
        blocks = 2 * (ctx.world - 1) / ctx.world * n * per_element
    assert blocks <= sent <= blocks + 2 * 256 + 64 * ctx.world, f"sent {sent}, expected {blocks:.0f}"


@pytest.mark.parametrize("engine", CPU_ENGINES)
@pytest.mark.parametrize("world_size", WORLD_SIZES)
@pytest.mark.parametrize("name", case.names())
def test_nvfp4(name, world_size, engine):
    require_torchao()
    check_case(shared_job(__name__, world_size, engine), name, world_size, case)

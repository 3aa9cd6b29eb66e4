"""MX wires (mxfp8, mxfp8_e5m2, mxfp4; docs/design.md, "MX blocks") against an independent oracle,
torchao's `to_mx`, bit for bit, under both block scale rules: RCEIL (the default: NVIDIA's hardware rule,
torchao's ScaleCalculationMode.RCEIL) and FLOOR (OCP MX v1.0's rule).

- The encoding, on the CPU kernels (test_cuda.py holds the CUDA kernels to them): every scale code and
  element byte equals torchao's over random, outlier-heavy, element-subnormal, all-zero, tie and
  saturating blocks, short last blocks and odd MXFP4 counts. Where the definitions part (a block that
  is not finite; a block whose scale is the smallest, 2^-127, which torchao's FLOOR divides by 2^-126
  and its RCEIL by 1; RCEIL blocks whose amax / L lies a few ulps above a power of two, where torchao's
  fp32 log2 rounds onto the power) the test holds cnccl to its own rule, computed here exactly.
- The collectives, at 2, 3 and 4 ranks on every CPU engine: allreduce and reduce_scatter equal an
  emulation built on torchao (wire_formats.framed_*): each part's blocks decoded, summed in fp32 in rank
  order, and (allreduce) encoded again. Values spread over eight decades make the fp32 sums depend
  on their order at 3 and 4 ranks.
- An inf or a NaN on one rank comes back non-finite on every rank, and the wire carries 1 + 1/32
  (mxfp8) or 1/2 + 1/32 (mxfp4) bytes an element each way.
torchao is a test dependency (.ci/setup-deps.sh installs it); without it the cases skip by name.
"""

import importlib.util
import os

import pytest
import torch
import torch.distributed as dist

import cnccl
from cnccl import _C
from harness import CASE_TIMEOUT, CPU_ENGINES, Cases, check_case, engine_of, everyones, gloo_group, share, shared_job
from wire_formats import (E2M1_VALUES, MX_BLOCK, MX_ELEMENT, allreduce_sr, framed_allreduce, framed_owner_sum,
                          mx_framed_sr, rceil_codes, reduce_scatter_sr, torchao_mx)

R = dist.ReduceOp
WIRES = list(MX_ELEMENT)
LARGEST = {"mxfp8": 448.0, "mxfp8_e5m2": 57344.0, "mxfp4": 6.0}
EMAX = {"mxfp8": 8, "mxfp8_e5m2": 15, "mxfp4": 2}


def require_torchao():
    if importlib.util.find_spec("torchao") is None:
        if os.environ.get("CNCCL_REQUIRE_FRAMEWORKS") == "1":
            pytest.fail("CNCCL_REQUIRE_FRAMEWORKS=1 but torchao is not installed")
        pytest.skip("torchao is not installed (.ci/setup-deps.sh installs it)")


RULES = ["rceil", "floor"]


def encode(v, wire, count=None, rule="rceil"):
    """cnccl's frame of the values v (one row of `count` elements): (scale codes, element bytes)."""
    count = v.numel() if count is None else count
    frame = _C._encode_frames([v], count, 1.0, wire, rule)[0]
    blocks = -(-count // MX_BLOCK)
    element_bytes = -(-count // 2) if wire == "mxfp4" else count
    return frame[:blocks], frame[blocks:blocks + element_bytes], frame[blocks + element_bytes:]


def blocks_of_every_kind(wire):
    """fp32 blocks of 32, each kind chosen to reach a branch of the definition."""
    gen = torch.Generator().manual_seed(3)
    kinds = {
        "gaussian": torch.randn(64, 32, generator=gen) * torch.pow(10.0, torch.empty(64, 1).uniform_(-20, 20, generator=gen)),
        # One value 1e3-1e6 times the rest: most land among the element type's subnormals or at zero.
        "outlier": torch.randn(64, 32, generator=gen).index_put_(
            (torch.arange(64), torch.randint(0, 32, (64,), generator=gen)),
            torch.randn(64, generator=gen) * torch.pow(10.0, torch.empty(64).uniform_(3, 6, generator=gen))),
        "all zero": torch.zeros(8, 32),
        "negative zero": torch.full((2, 32), -0.0),
        # fp32 subnormals beside a normal value of the same block: they round to zero.
        "fp32 subnormals": (torch.randn(8, 32, generator=gen) * 1e-40).index_fill_(1, torch.tensor([5]), 1e-3),
        # amax with every mantissa from 1.0 to 1.99: 1.75 * 2^emax and above saturate.
        "near the largest": torch.linspace(1.0, 1.999, 32).repeat(16, 1) * 2.0 ** EMAX[wire] * torch.where(
            torch.rand(16, 32, generator=gen) < 0.5, -1.0, 1.0),
    }
    # Exact ties between neighbouring element values, at a block scale of 2^0 (amax in [2^emax, 2^emax+1)).
    e = EMAX[wire]
    ties = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 2.0**-10, 3 * 2.0**-10, 1.0625, 1.1875, 2.0**-17])
    tie_block = torch.zeros(32)
    tie_block[0] = 2.0**e
    tie_block[1:1 + ties.numel()] = ties
    tie_block[16:16 + ties.numel()] = -ties
    kinds["ties"] = tie_block.view(1, 32)
    return kinds


@pytest.mark.parametrize("rule", RULES)
def test_the_encoding_equals_torchaos_bit_for_bit(rule):
    require_torchao()
    for wire in WIRES:
        for kind, blocks in blocks_of_every_kind(wire).items():
            v = blocks.reshape(-1).contiguous()
            want_scales, want_elements = torchao_mx(v, wire, rule)
            scales, elements, padding = encode(v, wire, rule=rule)
            assert torch.equal(scales, want_scales), f"{wire} {kind} ({rule}): scales {scales} != {want_scales}"
            differ = (elements != want_elements).nonzero()
            assert differ.numel() == 0, f"{wire} {kind} ({rule}): {differ.numel()} element bytes differ, " \
                                        f"first at {differ[0].item()}"
            assert not padding.any(), f"{wire} {kind} ({rule}): padding {padding}"


def test_a_short_last_block_and_an_odd_mxfp4_count_are_padded_with_zeros():
    """45 values: a full block and one of 13, encoded as torchao encodes the 64 with zeros after them;
    in MXFP4 the 23rd byte's high nibble is the zero that pads the odd count."""
    require_torchao()
    v = torch.randn(45, generator=torch.Generator().manual_seed(9))
    padded = torch.cat([v, torch.zeros(64 - 45)])
    for wire, rule in ((w, r) for w in WIRES for r in RULES):
        want_scales, want_elements = torchao_mx(padded, wire, rule)
        scales, elements, _ = encode(v, wire, rule=rule)
        assert torch.equal(scales, want_scales), wire
        assert torch.equal(elements, want_elements[:elements.numel()]), wire
        if wire == "mxfp4":
            assert elements.numel() == 23 and elements[22] >> 4 == 0, elements[22]


def test_decoding_is_exact():
    """cnccl's decoding of its own frames equals each element times 2^(code - 127), computed in fp64 (where
    every such product is exact) from the element's value in torch's own dtype (or e2m1's table); blocks
    with the smallest scale, 2^-127, included."""
    require_torchao()
    for wire in WIRES:
        kinds = blocks_of_every_kind(wire)
        kinds["smallest scale"] = torch.randn(4, 32, generator=torch.Generator().manual_seed(8)) * 2.0 ** (EMAX[wire] - 131)
        for kind, blocks in kinds.items():
            v = blocks.reshape(-1).contiguous()
            scales, elements, _ = encode(v, wire)
            if kind == "smallest scale":
                assert (scales == 0).all() and elements.any(), f"{wire}: {scales}"
            if wire == "mxfp4":
                nibbles = torch.stack([elements & 15, elements >> 4], 1).reshape(-1)[:v.numel()]
                values = E2M1_VALUES[nibbles.long()].double()
            else:
                values = elements.view(MX_ELEMENT[wire]).double()
            want = values * torch.pow(2.0, scales.double() - 127).repeat_interleave(MX_BLOCK)[:v.numel()]
            frame = _C._encode_frames([v], v.numel(), 1.0, wire)
            got = _C._decode_frames(frame, v.numel(), wire)[0]
            assert torch.equal(got.double(), want), f"{wire} {kind}"


def test_a_block_that_is_not_finite_has_the_nan_scale():
    """cnccl's rule, not torchao's: the block's scale is 0xFF and every value of it decodes to NaN;
    the other blocks are encoded as torchao encodes them."""
    require_torchao()
    v = torch.randn(96, generator=torch.Generator().manual_seed(4))
    v[33], v[70] = float("inf"), float("nan")
    finite = v.clone()
    finite[32:] = 0
    for wire, rule in ((w, r) for w in WIRES for r in RULES):
        want_scales, want_elements = torchao_mx(finite, wire, rule)
        scales, elements, _ = encode(v, wire, rule=rule)
        assert scales.tolist()[1:] == [255, 255] and scales[0] == want_scales[0], f"{wire}: {scales}"
        first = MX_BLOCK // 2 if wire == "mxfp4" else MX_BLOCK
        assert torch.equal(elements[:first], want_elements[:first]) and not elements[first:].any(), wire
        decoded = _C._decode_frames(_C._encode_frames([v], 96, 1.0, wire, rule), 96, wire)[0]
        assert decoded[32:].isnan().all() and decoded[:32].isfinite().all(), wire


def test_the_smallest_scale_divides_by_two_to_the_minus_127():
    """A block whose amax is below 2^(emax - 126) gets the scale code 0, 2^-127, under both rules, and its
    elements are its values times 2^127 (OCP MX v1.0). torchao's to_mx divides such a block by 2^-126
    instead under FLOOR (its comment: "it would be more correct to set the minimum to 2**-127") and by 1
    under RCEIL, so this case is held to the rule computed with torch's own conversion."""
    require_torchao()
    gen = torch.Generator().manual_seed(6)
    for wire, rule in ((w, r) for w in WIRES for r in RULES):
        v = torch.randn(64, generator=gen) * 2.0 ** (EMAX[wire] - 130)
        v[:32] *= 1e-3
        scales, elements, _ = encode(v, wire, rule=rule)
        assert scales.tolist() == [0, 0], f"{wire} {rule}: {scales}"
        q = (v.double() * 2.0**127).float().clamp(-LARGEST[wire], LARGEST[wire])
        if wire == "mxfp4":
            from torchao.prototype.mx_formats.kernels import f32_to_f4_unpacked, pack_uint4

            want = pack_uint4(f32_to_f4_unpacked(q))  # torchao's e2m1 conversion alone
        else:
            want = q.to(MX_ELEMENT[wire]).view(torch.uint8)
        assert torch.equal(elements, want), f"{wire}"


def test_rceil_takes_the_smallest_scale_that_saturates_nothing():
    """RCEIL's X is the smallest with amax <= L * 2^X: blocks whose amax is L * 2^k exactly (X = k), one
    ulp below (k) and one or a few ulps above (k + 1), for k from the bottom of the range to the top, on
    the kernels; each element is then v * 2^-X rounded by torch's own conversion,
    which never passes L. torchao's RCEIL takes k for the few-ulps-above blocks (its fp32 log2 of the
    quotient rounds onto k) and saturates their largest value: cnccl follows the exact rule, as NVIDIA's
    cvt.rp.satfinite.ue8m0x2 does. The codes are computed here independently (wire_formats.rceil_codes)."""
    require_torchao()
    from torchao.prototype.mx_formats.kernels import f32_to_f4_unpacked, pack_uint4

    gen = torch.Generator().manual_seed(14)
    for wire in WIRES:
        largest = LARGEST[wire]
        tops = []
        for k in (-126, -120, -9, -4, 0, 3, 4, 17, 100, 119 - EMAX[wire]):
            edge = largest * 2.0**k
            tops += [edge, edge * (1 - 2.0**-24), edge * (1 + 2.0**-23), edge * (1 + 2.0**-20)]
        blocks = torch.rand(len(tops), 32, generator=gen) * 2 - 1
        blocks[:, 0] = torch.tensor(tops)  # the amax, at 0; the rest below it
        blocks[:, 1:] *= blocks[:, :1]
        v = blocks.reshape(-1).contiguous()
        want_codes = rceil_codes(blocks.abs().amax(1), wire)
        assert (want_codes.view(-1, 4)[:, 2] == want_codes.view(-1, 4)[:, 0] + 1).all(), want_codes
        q = (blocks.double() * torch.pow(2.0, 127 - want_codes.double())[:, None]).float().reshape(-1)
        assert q.abs().max() <= largest
        if wire == "mxfp4":
            want_elements = pack_uint4(f32_to_f4_unpacked(q))
        else:
            want_elements = q.to(MX_ELEMENT[wire]).view(torch.uint8)
        scales, elements, _ = encode(v, wire, rule="rceil")
        assert torch.equal(scales, want_codes), f"{wire}: {scales} != {want_codes}"
        assert torch.equal(elements, want_elements), f"{wire}"
        floor_scales, _, _ = encode(v, wire, rule="floor")
        assert (floor_scales <= scales).all() and (floor_scales < scales).any(), wire


def test_a_stochastic_encoding_equals_its_emulation():
    """The frames hook's stochastic encoding (rank 0's contribution to a group's first stochastic sum) on
    each wire and rule, a short last block included, decodes to mx_framed_sr's values bit for bit."""
    require_torchao()
    gen = torch.Generator().manual_seed(8)
    n = 32 * 40 + 7
    v = torch.randn(n, generator=gen) * torch.pow(10.0, torch.empty(n).uniform_(-3, 3, generator=gen))
    v[:8] = torch.tensor([0.0, -0.0, 1e-30, -1e-30, 0.0, -0.0, 0.0, -0.0])  # zeros keep their sign
    for wire in WIRES:
        for rule in RULES:
            frames = _C._encode_frames([v], n, 1.0, wire, rule, sr_seed=21)
            got = _C._decode_frames(frames, n, wire)[0]
            want = mx_framed_sr(v, wire, 1.0, 21, 0, 0, 0, 0, rule)
            assert torch.equal(got.view(torch.int32), want.view(torch.int32)), \
                f"{wire} {rule}: {first_difference(got, want)} (or a zero's sign)"
            assert got[1].item() == 0 and str(got[1].item()) == "-0.0", f"{wire} {rule}: -0 lost its sign"
            nearest = _C._decode_frames(_C._encode_frames([v], n, 1.0, wire, rule), n, wire)[0]
            assert (got != nearest).any(), f"{wire} {rule}: rounded to nearest"


def test_mx_wires_need_fp32_sums_and_say_so():
    for wire in WIRES:
        with pytest.raises(ValueError, match=rf"wire_dtype={wire}.*needs accumulate=fp32 and scaling=none.*"
                                             r"got accumulate=wire, scaling=none"):
            cnccl.Options(wire_dtype=wire)
        with pytest.raises(ValueError, match=rf"wire_dtype={wire}.*got accumulate=wire"):
            cnccl.Options(wire_dtype=wire, rounding="sr")
        with pytest.raises(ValueError, match=rf"wire_dtype={wire}.*scaling=pow2"):
            cnccl.Options(wire_dtype=wire, accumulate="fp32", scaling="pow2")
        assert cnccl.Options(wire_dtype=wire, accumulate="fp32") is not None
        assert cnccl.Options(wire_dtype=wire, accumulate="fp32", rounding="sr") is not None


def test_a_bad_mx_scale_names_the_setting_and_the_rules(monkeypatch):
    with pytest.raises(ValueError, match=r"Options.mx_scale='ceil' is not valid; allowed: rceil, floor"):
        cnccl.Options(wire_dtype="mxfp8", accumulate="fp32", mx_scale="ceil")
    monkeypatch.setenv("CNCCL_MX_SCALE", "round")
    with pytest.raises(ValueError, match=r"CNCCL_MX_SCALE='round' is not valid; allowed: rceil, floor"):
        cnccl.Options(wire_dtype="mxfp8", accumulate="fp32")
    monkeypatch.setenv("CNCCL_MX_SCALE", "FLOOR")
    assert cnccl.Options(wire_dtype="mxfp8", accumulate="fp32", mx_scale="rceil") is not None


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
        # Every wire with the default rule, RCEIL, and MXFP8 with FLOOR too.
        self.groups = {(w, rule): dist.new_group(backend="cnccl", timeout=CASE_TIMEOUT, pg_options=cnccl.Options(
            wire_dtype=w, min_bytes=0, accumulate="fp32", **({"mx_scale": rule} if rule == "floor" else {})))
            for w, rule in [(w, "rceil") for w in WIRES] + [("mxfp8", "floor")]}
        self.other_forms = {  # the forms of a tensor each path restores differently
            "untouched_on_failure": dist.new_group(backend="cnccl", timeout=CASE_TIMEOUT, pg_options=cnccl.Options(
                wire_dtype="mxfp8", min_bytes=0, accumulate="fp32", untouched_on_failure=True)),
            "compress_fp64": dist.new_group(backend="cnccl", timeout=CASE_TIMEOUT, pg_options=cnccl.Options(
                wire_dtype="mxfp8", min_bytes=0, accumulate="fp32", compress_fp64=True))}
        self.gen = torch.Generator().manual_seed(29 + rank)

    def all_inputs(self, t):
        return everyones(t, self.gloo)

    def spread(self, n):
        """Gaussians times 10^u, u uniform in [-4, 4] per element and rank."""
        return torch.randn(n, generator=self.gen) * torch.pow(10.0, torch.empty(n).uniform_(-4, 4, generator=self.gen))


def first_difference(got, want):
    bad = (got != want) & ~(got.isnan() & want.isnan())
    where = bad.nonzero()
    return None if where.numel() == 0 else f"{where.numel()} elements differ, first at {where[0].item()}: " \
                                           f"{got[where[0]].item()!r} != {want[where[0]].item()!r}"


@case
def allreduce_equals_the_torchao_emulation(ctx):
    for (wire, rule), g in ctx.groups.items():
        assert cnccl.config(g)["wire_dtype"] == wire and cnccl.config(g)["mx_scale"] == rule
        for op in (R.SUM, R.AVG):
            for n in SIZES:
                x = ctx.spread(n)
                want = framed_allreduce(ctx.all_inputs(x), wire, 1.0 / ctx.world if op == R.AVG else 1.0, rule)
                t = x.clone()
                dist.all_reduce(t, op=op, group=g)
                problem = first_difference(t, want)
                assert problem is None, f"{wire} {rule} {op} n={n}: {problem}"


@case
def strided_fp64_and_untouched_tensors_get_the_same_blocks(ctx):
    """A strided view, a tensor restored only once every chunk is in (untouched_on_failure), and fp64
    values (their SUM: fp64 through fp32 is exact at the scale 1) give the emulation's bits too."""
    n = 100_003
    x = ctx.spread(2 * n)
    want = framed_allreduce([v[::2] for v in ctx.all_inputs(x)], "mxfp8", 1.0)
    strided = x.clone()[::2]
    dist.all_reduce(strided, group=ctx.groups[("mxfp8", "rceil")])
    assert first_difference(strided, want) is None, f"strided: {first_difference(strided, want)}"
    t = x[::2].clone()
    dist.all_reduce(t, group=ctx.other_forms["untouched_on_failure"])
    assert first_difference(t, want) is None, f"untouched_on_failure: {first_difference(t, want)}"
    wide = x[::2].double()
    dist.all_reduce(wide, group=ctx.other_forms["compress_fp64"])
    assert first_difference(wide, want.double()) is None, f"fp64: {first_difference(wide, want.double())}"


@case
def reduce_scatter_equals_the_torchao_emulation(ctx):
    for (wire, rule), g in ctx.groups.items():
        for n in SIZES[1:]:
            x = ctx.spread(n * ctx.world)
            parts = [v.chunk(ctx.world)[ctx.rank] for v in ctx.all_inputs(x)]
            want = framed_owner_sum(parts, wire, 1.0, rule)
            out = torch.empty(n)
            dist.reduce_scatter_tensor(out, x, group=g)
            assert first_difference(out, want) is None, f"{wire} n={n}: {first_difference(out, want)}"
            listed = torch.empty(n)
            dist.reduce_scatter(listed, list(x.chunk(ctx.world)), group=g)
            assert torch.equal(listed, want), f"reduce_scatter list {wire} n={n}"


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
    inputs = ctx.all_inputs(x)
    for (wire, rule), g in ctx.groups.items():
        t = x.clone()
        dist.all_reduce(t, group=g)
        assert not t[[3, n - 2]].isfinite().any(), f"{wire}: {t[[3, n - 2]].tolist()}"
        want = framed_allreduce(inputs, wire, 1.0, rule)
        assert first_difference(t, want) is None, f"{wire}: {first_difference(t, want)}"


@case
def the_wire_carries_a_byte_and_a_32nd_or_half_that(ctx):
    n = 1 << 20
    for (wire, _), g in ctx.groups.items():
        per_element = (0.5 if wire == "mxfp4" else 1.0) + 1 / MX_BLOCK
        before = cnccl.stats(g)
        dist.all_reduce(torch.ones(n), group=g)
        after = cnccl.stats(g)
        assert after["bytes_sent"] - before["bytes_sent"] == n * per_element, wire
        if ctx.engine == "gloo":
            continue  # gloo does not report its transport's bytes
        sent = after["transport_bytes_sent"] - before["transport_bytes_sent"]
        if ctx.engine == "shm":
            # Through shared memory a rank publishes its blocks of the others' parts and its own part's
            # sum, each part's last block counted whole.
            blocks = n * per_element
        else:  # the all-to-all and the allgather
            blocks = 2 * (ctx.world - 1) / ctx.world * n * per_element
        assert blocks <= sent <= blocks + 2 * 256 + 64 * ctx.world, f"{wire}: sent {sent}, expected {blocks:.0f}"


def sr_group(wire, seed, rule="rceil"):
    return dist.new_group(backend="cnccl", timeout=CASE_TIMEOUT, pg_options=cnccl.Options(
        wire_dtype=wire, min_bytes=0, accumulate="fp32", rounding="sr", sr_seed=seed, mx_scale=rule))


@case
def stochastic_rounding_equals_its_emulation(ctx):
    """rounding=sr: every element of every contribution and of every owner's sums rounded up or down by
    its own random bits (its index in the tensor, the collective's number in the group, the rank or the
    owners' word), on each wire and MXFP8 under FLOOR too; allreduce (SUM, AVG) numbered 0 and 1,
    reduce_scatter 2."""
    for wire, rule in [(w, "rceil") for w in WIRES] + [("mxfp8", "floor")]:
        g = sr_group(wire, 11, rule)
        assert cnccl.config(g)["rounding"] == "sr"
        for seq, (op, n) in enumerate(((R.SUM, 100_003), (R.AVG, 5_040))):
            x = ctx.spread(n)
            want = allreduce_sr(ctx.all_inputs(x), wire, 1.0 / ctx.world if op == R.AVG else 1.0, 11, seq, rule)
            t = x.clone()
            dist.all_reduce(t, op=op, group=g)
            assert first_difference(t, want) is None, f"{wire} {rule} {op} n={n}: {first_difference(t, want)}"
        x = ctx.spread(4_099 * ctx.world)
        out = torch.empty(4_099)
        dist.reduce_scatter_tensor(out, x, group=g)
        want = reduce_scatter_sr(ctx.all_inputs(x), ctx.rank, wire, 1.0, 11, 2, rule)
        assert first_difference(out, want) is None, f"{wire} {rule} reduce_scatter: {first_difference(out, want)}"


@case(only=(lambda world, engine: world == 2 and engine != "gloo",
             "parts of many chunks (gloo sends a part whole); one world size is enough for the offsets"))
def stochastic_rounding_across_chunks_equals_its_emulation(ctx):
    """Parts of 1.2M values (over UCX more than one 256 KiB chunk of mxfp8; through shared memory several
    pieces): each chunk's elements take the bits of their own index in the tensor, a contribution's and an
    owner's sums' alike, and reduce_scatter's."""
    g = sr_group("mxfp8", 13)
    n = 2_400_003
    x = ctx.spread(n)
    want = allreduce_sr(ctx.all_inputs(x), "mxfp8", 1.0, 13, 0)
    t = x.clone()
    dist.all_reduce(t, group=g)
    assert first_difference(t, want) is None, f"allreduce: {first_difference(t, want)}"
    x = ctx.spread(1_200_001 * ctx.world)
    out = torch.empty(1_200_001)
    dist.reduce_scatter_tensor(out, x, group=g)
    want = reduce_scatter_sr(ctx.all_inputs(x), ctx.rank, "mxfp8", 1.0, 13, 1)
    assert first_difference(out, want) is None, f"reduce_scatter: {first_difference(out, want)}"


@case
def stochastic_rounding_repeats_for_a_seed_and_differs_for_another(ctx):
    x = ctx.spread(40_000)
    for wire in WIRES:
        results = []
        for seed in (5, 5, 6):
            t = x.clone()
            dist.all_reduce(t, group=sr_group(wire, seed))
            results.append(t)
        assert torch.equal(results[0], results[1]), wire
        assert (results[0] != results[2]).float().mean() > 0.1, f"{wire}: another seed moves many elements"
        nearest = x.clone()
        dist.all_reduce(nearest, group=ctx.groups[(wire, "rceil")])
        assert (results[0] != nearest).float().mean() > 0.1, f"{wire}: stochastic rounding is not to nearest"


@pytest.mark.parametrize("engine", CPU_ENGINES)
@pytest.mark.parametrize("world_size", WORLD_SIZES)
@pytest.mark.parametrize("name", case.names())
def test_mx(name, world_size, engine):
    require_torchao()
    check_case(shared_job(__name__, world_size, engine), name, world_size, case, engine)

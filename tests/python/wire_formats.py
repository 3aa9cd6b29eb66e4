"""Facts about the wire formats that the tests' rounding bounds are built from, and emulations of what
cnccl computes with them (fp32 sums, stochastic rounding, power-of-two frames)."""

import math

import numpy as np
import torch

WIRE_DTYPE = {"fp16": torch.float16, "bf16": torch.bfloat16}
UNIT = {"fp16": 2.0**-11, "bf16": 2.0**-8}  # unit roundoff of the wire format
# The absolute error of a rounding that lands among the wire's subnormals.
HALF_SUBNORMAL_STEP = {"fp16": 2.0**-25, "bf16": 2.0**-134}

# Power-of-two frames (docs/design.md, "Numerics"), which also carry the 8-bit formats.
FRAME_DTYPE = {**WIRE_DTYPE, "e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}
FRAME_UNIT = {**UNIT, "e4m3": 2.0**-4, "e5m2": 2.0**-3}
FRAME_HALF_SUBNORMAL_STEP = {**HALF_SUBNORMAL_STEP, "e4m3": 2.0**-10, "e5m2": 2.0**-17}
EMAX = {"fp16": 15, "bf16": 127, "e4m3": 8, "e5m2": 15}  # the exponent of the format's largest binade


def frame_exponent(y, wire):
    """A frame's exponent k: amax * 2^k lands in the wire's second-largest binade (Python's frexp)."""
    amax = y.abs().max().item() if y.numel() else 0.0
    if amax == 0 or not math.isfinite(amax):
        return 0
    return max(-126, min(126, EMAX[wire] - math.frexp(amax)[1]))


def to_frame_wire(v, wire):
    """fp32 values rounded to a frame's wire as cnccl rounds them: torch's conversion, except that e4m3
    gives NaN past its largest value (|v| > 464 rounds past 448) where torch saturates at 448."""
    if wire == "e4m3":
        v = v.masked_fill(v.abs() > 464, float("nan"))
    return v.to(FRAME_DTYPE[wire])


def framed(x, wire, pre=1.0, mx_scale="rceil"):
    """x (fp32) times `pre` through a frame: the values the receiver decodes. The sender's scale is
    fp32(pre) * 2^k, exact, applied in one fp32 multiplication; decoding multiplies by 2^-k. MX wires
    take their blocks instead (mx_framed, scaled by the rule `mx_scale`)."""
    if wire in MX_ELEMENT:
        return mx_framed(x, wire, pre, mx_scale)
    if wire == "nvfp4":
        return nv_framed(x, pre)
    pre32 = torch.tensor(pre, dtype=torch.float32).item()
    k = frame_exponent(x * pre32, wire)
    return to_frame_wire(x * (pre32 * 2.0**k), wire).float() * 2.0**-k


def framed_owner_sum(parts, wire, pre, mx_scale="rceil"):
    """Every rank's part (rank order) framed (or through MX blocks) and decoded, added in fp32 in rank
    order."""
    acc = None
    for x in parts:
        decoded = framed(x.float(), wire, pre, mx_scale)
        acc = decoded if acc is None else acc + decoded
    return acc


def framed_allreduce(inputs, wire, pre, mx_scale="rceil"):
    """Parts of ceil(n / ranks) elements (the last short or empty), each owner's sum framed again."""
    n, world = inputs[0].numel(), len(inputs)
    c = -(-n // world)
    return torch.cat([framed(framed_owner_sum([x[p * c:(p + 1) * c] for x in inputs], wire, pre, mx_scale), wire,
                             mx_scale=mx_scale)
                      for p in range(world)])


def rank_order_sum(inputs, wire, pre=1.0):
    """Each rank's value times `pre`, cast to the wire, the casts added in fp32 in rank order and not
    rounded: what the owner of a part computes with fp32 sums (docs/design.md, "Numerics")."""
    w = WIRE_DTYPE[wire]
    acc = (inputs[0] * pre).to(w).float()
    for x in inputs[1:]:
        acc = acc + (x * pre).to(w).float()
    return acc


def mixed_magnitudes(gen, n, decades):
    """n Gaussian values times 10^u, u uniform in [-decades, decades] and drawn anew on each rank: at
    one index the ranks' values differ by orders of magnitude, so their fp32 sum depends on the order
    of its adds (and 16-bit adds round)."""
    magnitude = torch.pow(10.0, torch.empty(n).uniform_(-decades, decades, generator=gen))
    return torch.randn(n, generator=gen) * magnitude


# Stochastic rounding (compress/stochastic.h), emulated with numpy: Philox4x32-10 and the rule.
_MASK = 0xFFFFFFFF
ANY_OWNER = 0xFFFFFFFF  # the rank word of a sum's rounding
CONTRIBUTION, RESULT = 0, 1


def philox4x32_10(c0, c1, c2, c3, k0, k1):
    """Philox4x32-10 on numpy uint64 arrays that hold 32-bit words."""
    c = [np.asarray(x, dtype=np.uint64) for x in (c0, c1, c2, c3)]
    k0, k1 = np.uint64(k0), np.uint64(k1)
    for _ in range(10):
        p0, p1 = np.uint64(0xD2511F53) * c[0], np.uint64(0xCD9E8D57) * c[2]
        c = [(p1 >> np.uint64(32)) ^ c[1] ^ k0, p1 & np.uint64(_MASK), (p0 >> np.uint64(32)) ^ c[3] ^ k1,
             p0 & np.uint64(_MASK)]
        k0, k1 = (k0 + np.uint64(0x9E3779B9)) & np.uint64(_MASK), (k1 + np.uint64(0xBB67AE85)) & np.uint64(_MASK)
    return c


def random_bits(first, n, seed, seq, rank, phase):
    """The random word of a 16-bit wire's elements first..first+n-1: word i % 4 of Philox at
    (i // 4 mod 2^32, seq, rank, phase + 2 * (i // 2^34))."""
    index = np.arange(first, first + n, dtype=np.uint64)
    words = philox4x32_10((index >> np.uint64(2)) & np.uint64(_MASK), seq, rank,
                          np.uint64(phase) + np.uint64(2) * (index >> np.uint64(34)), seed & _MASK, seed >> 32)
    return np.choose((index & np.uint64(3)).astype(np.int64), words)


def block_random_bits(first, n, seed, seq, rank, phase):
    """The random bits of a block wire's elements first..first+n-1 (compress/stochastic.h,
    block_random_bits): byte i % 16 of Philox at (i // 16 mod 2^32, seq, rank, phase + 2 * (i // 2^36)),
    its words' bytes in little-endian order, as (byte << 24) | 2^23: u = (byte + 1/2) * 2^-8."""
    index = np.arange(first, first + n, dtype=np.uint64)
    words = philox4x32_10((index >> np.uint64(4)) & np.uint64(_MASK), seq, rank,
                          np.uint64(phase) + np.uint64(2) * (index >> np.uint64(36)), seed & _MASK, seed >> 32)
    word = np.choose(((index >> np.uint64(2)) & np.uint64(3)).astype(np.int64), words)
    byte = (word >> (np.uint64(8) * (index & np.uint64(3)))) & np.uint64(0xFF)
    return (byte << np.uint64(24)) | np.uint64(0x800000)


def on_grid_sr(t, bits, min_exponent, mantissa_bits):
    """Non-negative finite float32 magnitudes t moved onto the grid of a format with `mantissa_bits` bits
    past the leading one and `min_exponent` its smallest normal exponent (stochastic_on_grid): up from
    the grid value below with probability (t - below) / spacing, against u = (bits >> 8) * 2^-24."""
    _, e = np.frexp(t)
    spacing = np.maximum(e - 1, min_exponent) - mantissa_bits
    q = np.ldexp(t, -spacing).astype(np.float32)
    m = np.floor(q)
    u = (bits >> np.uint64(8)).astype(np.float32) * np.float32(2.0**-24)
    return np.where(t == 0, t, np.ldexp(m + (u < q - m).astype(np.float32), spacing)).astype(np.float32)


def stochastic_round(v, bits, wire):
    """fp32 tensor v rounded to the wire stochastically with the random words `bits`."""
    x = v.numpy().astype(np.float32)
    t = np.abs(x)
    finite = np.isfinite(t)
    magnitude = on_grid_sr(np.where(finite, t, 0).astype(np.float32), bits,
                           *((-14, 10) if wire == "fp16" else (-126, 7)))
    out = np.where(~finite, x, np.copysign(magnitude, x)).astype(np.float32)
    return torch.from_numpy(out).to(WIRE_DTYPE[wire])


# MX blocks (docs/design.md, "MX blocks"), emulated with torchao's encoding as the oracle.
MX_ELEMENT = {"mxfp8": torch.float8_e4m3fn, "mxfp8_e5m2": torch.float8_e5m2, "mxfp4": torch.float4_e2m1fn_x2}
MX_BLOCK = 32
E2M1_VALUES = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0])


def torchao_mx(v, wire, mx_scale="rceil"):
    """torchao's MX encoding (to_mx with RCEIL or FLOOR scaling) of fp32 values v, a multiple of 32 of
    them: the blocks' E8M0 scale codes and the element bytes (MXFP4: two a byte, the first in the low
    nibble). torchao computes RCEIL's exponent as ceil(log2(amax / L)) with an fp32 log2, which can round
    a quotient a few ulps above a power of two down onto it (cnccl's exact rule then takes one more);
    where that happens this raises instead of returning codes the test would take as the oracle's."""
    from torchao.prototype.mx_formats.mx_tensor import ScaleCalculationMode, to_mx

    mode = {"rceil": ScaleCalculationMode.RCEIL, "floor": ScaleCalculationMode.FLOOR}[mx_scale]
    scale, data = to_mx(v.reshape(1, -1).contiguous(), MX_ELEMENT[wire], MX_BLOCK, mode)
    codes = scale.view(torch.uint8).reshape(-1)
    if mx_scale == "rceil":
        amax = v.reshape(-1, MX_BLOCK).abs().amax(1)
        finite = amax.isfinite() & (codes > 0)
        exact = rceil_codes(amax, wire)
        assert torch.equal(codes[finite], exact[finite]), \
            f"torchao's RCEIL departs from the exact rule at blocks {(codes != exact).nonzero().reshape(-1).tolist()}"
        # A block with the smallest scale, 2^-127: torchao's RCEIL multiplies its values by 1, not 2^127.
        assert not ((codes == 0) & (amax > 0)).any(), "a block with the smallest scale: torchao is no oracle there"
    return codes, data.view(torch.uint8).reshape(-1)


MX_LARGEST = {"mxfp8": 448.0, "mxfp8_e5m2": 57344.0, "mxfp4": 6.0}


def mx_blocks(v, wire, mx_scale="rceil"):
    """The MX encoding of fp32 values v (a multiple of 32) for the collectives' emulation: torchao's own
    for FLOOR. For RCEIL, the exact exponent X (rceil_codes) and each element v * 2^-X (exact in fp64)
    rounded by torch's own fp8 conversion or torchao's e2m1 one. torchao's RCEIL is no oracle for sums:
    an owner's fp32 sum of few-bit values often lands a few ulps above L * 2^k, where torchao's fp32
    log2 takes k (test_mx.py compares its RCEIL directly on other data)."""
    if mx_scale == "floor":
        return torchao_mx(v, wire, "floor")
    blocks = v.reshape(-1, MX_BLOCK)
    amax = blocks.abs().amax(1)
    finite = amax.isfinite()
    codes = torch.full(amax.shape, 255, dtype=torch.uint8)
    codes[finite] = rceil_codes(amax[finite], wire)
    q = (blocks.double() * torch.pow(2.0, 127 - codes.double())[:, None]).float()
    q = q.masked_fill(~finite[:, None], 0).reshape(-1)
    if wire == "mxfp4":
        from torchao.prototype.mx_formats.kernels import f32_to_f4_unpacked, pack_uint4

        return codes, pack_uint4(f32_to_f4_unpacked(q))
    return codes, q.to(MX_ELEMENT[wire]).view(torch.uint8)


def rceil_codes(amax, wire):
    """RCEIL's scale codes of blocks with these finite amaxes, exactly: X + 127 for the smallest X in
    [-127, 127] with amax <= L * 2^X (every product in fp64 is exact)."""
    largest, out = MX_LARGEST[wire], []
    for a in amax.double().tolist():
        x = max(-127, math.frexp(a / largest)[1] - 1) if a > 0 else -127
        while a > largest * 2.0**x:
            x += 1
        while x > -127 and a <= largest * 2.0 ** (x - 1):
            x -= 1
        out.append(min(x, 127) + 127)
    return torch.tensor(out, dtype=torch.uint8)


def mx_decode(codes, elements, wire, n):
    """The first n values of blocks given as scale codes and element bytes: each element times
    2^(code - 127), exactly (the code 0xFF is NaN)."""
    if wire == "mxfp4":
        nibbles = torch.stack([elements & 15, elements >> 4], 1).reshape(-1)
        values = E2M1_VALUES[nibbles.long()]
    else:
        values = elements.view(MX_ELEMENT[wire]).float()
    scales = torch.pow(2.0, codes.double() - 127).float().masked_fill(codes == 255, float("nan"))
    padded = torch.zeros(codes.numel() * MX_BLOCK)
    padded[:values.numel()] = values[:padded.numel()]
    return (padded.view(-1, MX_BLOCK) * scales[:, None]).reshape(-1)[:n]


def mx_framed(x, wire, pre=1.0, mx_scale="rceil"):
    """x (fp32) times fp32(pre) through MX blocks, as the owner decodes them: blocks of 32 (the last one
    padded with zeros) encoded by torchao, except that a block holding a value that is not finite is
    NaN (cnccl's rule; torchao keeps such a block's finite values as zeros and its inf as inf)."""
    pre32 = torch.tensor(pre, dtype=torch.float32).item()
    v = x.float() * pre32
    n = v.numel()
    padded = torch.zeros(-(-n // MX_BLOCK) * MX_BLOCK)
    padded[:n] = v
    if not n:
        return v
    codes, elements = mx_blocks(padded, wire, mx_scale)
    decoded = mx_decode(codes, elements, wire, padded.numel()).view(-1, MX_BLOCK)
    nonfinite = ~padded.view(-1, MX_BLOCK).isfinite().all(1)
    return decoded.masked_fill(nonfinite[:, None], float("nan")).reshape(-1)[:n]



# The element grids of MX wires for stochastic rounding: (smallest normal exponent, mantissa bits).
# e2m1's grid (0.5 apart below 2, then 1, then 2) is that of one mantissa bit with exponents from 0.
MX_GRID = {"mxfp8": (-6, 3), "mxfp8_e5m2": (-14, 2), "mxfp4": (0, 1)}


def mx_framed_sr(x, wire, pre, seed, seq, rank, phase, first, mx_scale="rceil"):
    """mx_framed with stochastically rounded elements (compress/stochastic.h, stochastic_fp8_value and
    stochastic_e2m1_value): each block's exponent X as mx_blocks chooses it, each element's magnitude
    |v * 2^-X| saturated to L and moved onto its element type's grid (MX_GRID, on_grid_sr) by element
    first + i's random bits (block_random_bits), decoded as element * 2^X."""
    pre32 = torch.tensor(pre, dtype=torch.float32).item()
    v = x.float() * pre32
    n = v.numel()
    if not n:
        return v
    padded = torch.zeros(-(-n // MX_BLOCK) * MX_BLOCK)
    padded[:n] = v
    blocks = padded.view(-1, MX_BLOCK)
    finite = blocks.isfinite().all(1)
    codes, _ = mx_blocks(padded.masked_fill(~finite.repeat_interleave(MX_BLOCK), 0), wire, mx_scale)
    x_exp = codes.double() - 127
    q = (blocks.masked_fill(~finite[:, None], 0).double() * torch.pow(2.0, -x_exp)[:, None]).float().numpy()
    a = np.minimum(np.abs(q), np.float32(MX_LARGEST[wire])).reshape(-1)
    magnitude = on_grid_sr(a, block_random_bits(first, padded.numel(), seed, seq, rank, phase), *MX_GRID[wire])
    elements = torch.from_numpy(np.copysign(magnitude.reshape(q.shape), q))
    decoded = elements * torch.pow(2.0, x_exp).float()[:, None]
    return decoded.masked_fill(~finite[:, None], float("nan")).reshape(-1)[:n]

# NVFP4 (docs/design.md, "NVFP4 blocks"): torchao's nvfp4_quantize with a per-tensor scale, the tensor
# being a part, and cnccl's rules where torchao has none (the part scale's floor, blocks that are not finite).
NV_BLOCK = 16
NV_SMALLEST_PART = 2.0**-120


def nv_part_scale(v):
    """P = max(fl(a / 2688), 2^-120) of fp32 values v, a their largest finite |value| (0 for none):
    torchao's per_tensor_amax_to_scale above the floor."""
    finite = v[v.isfinite()]
    a = finite.abs().max() if finite.numel() else torch.tensor(0.0)
    return torch.clamp(a.float() / 2688.0, min=NV_SMALLEST_PART)


def nv_blocks(v, part):
    """The NVFP4 encoding of fp32 values v (a multiple of 16) under the part scale `part` (a 0-dim fp32
    tensor): (scale codes, element bytes, two a byte, the first in the low nibble). torchao's
    nvfp4_quantize for the blocks whose values are all finite (on CPU tensors: on CUDA torch divides by
    a Python float as a multiplication by its reciprocal); a block that is not finite gets the scale code
    0x7F (e4m3's NaN) and zero elements."""
    from torchao.prototype.mx_formats.nvfp4_tensor import nvfp4_quantize

    blocks = v.float().reshape(-1, NV_BLOCK)
    finite = blocks.isfinite().all(1)
    scales, data = nvfp4_quantize(blocks.masked_fill(~finite[:, None], 0).reshape(1, -1).contiguous(), NV_BLOCK, part)
    codes = scales.view(torch.uint8).reshape(-1).clone()
    codes[~finite] = 0x7F
    elements = data.view(torch.uint8).reshape(-1, NV_BLOCK // 2).clone()
    elements[~finite] = 0
    return codes, elements.reshape(-1)


def nv_decode(codes, elements, part, n):
    """The first n values of blocks given as scale codes and element bytes: each element times
    fl(P * S), in fp32 (torchao's dequantize), NaN for the scale code 0x7F."""
    nibbles = torch.stack([elements & 15, elements >> 4], 1).reshape(-1)
    values = torch.zeros(codes.numel() * NV_BLOCK)
    values[:nibbles.numel()] = E2M1_VALUES[nibbles.long()][:values.numel()]
    scales = part * codes.view(torch.float8_e4m3fn).float()
    return (values.view(-1, NV_BLOCK) * scales[:, None]).reshape(-1)[:n]


def _nv_part(x, pre):
    """x (fp32) times fp32(pre), padded with zeros to whole blocks of 16; None for no values."""
    pre32 = torch.tensor(pre, dtype=torch.float32).item()
    v = x.float() * pre32
    if not v.numel():
        return None
    padded = torch.zeros(-(-v.numel() // NV_BLOCK) * NV_BLOCK)
    padded[:v.numel()] = v
    return padded


def nv_framed(x, pre=1.0):
    """x (fp32) times fp32(pre) through an NVFP4 frame of its own, as the owner decodes it: the part
    scale from these values, blocks of 16 (the last padded with zeros)."""
    padded = _nv_part(x, pre)
    if padded is None:
        return x.float()
    part = nv_part_scale(padded)
    codes, elements = nv_blocks(padded, part)
    return nv_decode(codes, elements, part, x.numel())


def nv_framed_sr(x, pre, seed, seq, rank, phase, first):
    """nv_framed with stochastically rounded elements (compress/stochastic.h, stochastic_e2m1_value): the
    block scales as torchao computes them (these are its operations, in its order), each element's
    magnitude min(|q|, 6) moved to the e2m1 value above with probability its distance from the one below
    over the step between them, by element first + i's random bits (block_random_bits)."""
    padded = _nv_part(x, pre)
    if padded is None:
        return x.float()
    part = nv_part_scale(padded)
    blocks = padded.view(-1, NV_BLOCK)
    finite = blocks.isfinite().all(1)
    clean = blocks.masked_fill(~finite[:, None], 0)
    s = torch.clamp((clean.abs().amax(1) / 6.0) / part, min=2.0**-6, max=448.0)
    scale = s.to(torch.float8_e4m3fn).float()
    q = clean * ((1.0 / part) / scale)[:, None]
    a = torch.clamp(q.abs(), max=6.0)
    spacing = torch.where(a < 2, 0.5, torch.where(a < 4, 1.0, 2.0))
    steps = a * (1.0 / spacing)
    whole = torch.floor(steps)
    bits = block_random_bits(first, padded.numel(), seed, seq, rank, phase)
    u = torch.from_numpy((bits >> np.uint64(8)).astype(np.float32) * np.float32(2.0**-24)).view(-1, NV_BLOCK)
    magnitude = (whole + (u < steps - whole).float()) * spacing
    decoded = torch.copysign(magnitude, q) * (part * scale)[:, None]
    return decoded.masked_fill(~finite[:, None], float("nan")).reshape(-1)[:x.numel()]


def framed_sr(x, wire, pre, seed, seq, rank, phase, first, mx_scale="rceil"):
    """x through a block wire's frame with stochastically rounded elements: nv_framed_sr or mx_framed_sr."""
    if wire == "nvfp4":
        return nv_framed_sr(x, pre, seed, seq, rank, phase, first)
    return mx_framed_sr(x, wire, pre, seed, seq, rank, phase, first, mx_scale)


def allreduce_sr(inputs, wire, pre, seed, seq, mx_scale="rceil"):
    """An allreduce on a block wire with rounding=sr, number `seq` of its group's stochastic collectives:
    parts of ceil(n / ranks), each rank's part p rounded with its own bits from index p x part on, the
    owner's sums with the sums' (ANY_OWNER, RESULT)."""
    n, world = inputs[0].numel(), len(inputs)
    c = -(-n // world)
    out = []
    for p in range(world):
        acc = None
        for r, x in enumerate(inputs):
            d = framed_sr(x[p * c:(p + 1) * c], wire, pre, seed, seq, r, CONTRIBUTION, p * c, mx_scale)
            acc = d if acc is None else acc + d
        out.append(framed_sr(acc, wire, 1.0, seed, seq, ANY_OWNER, RESULT, p * c, mx_scale))
    return torch.cat(out)


def reduce_scatter_sr(inputs, rank, wire, pre, seed, seq, mx_scale="rceil"):
    """This rank's output of a reduce_scatter_tensor on a block wire with rounding=sr: every rank's chunk
    `rank` rounded with its own bits from index rank x each on, summed in fp32 in rank order, not rounded."""
    each = inputs[0].numel() // len(inputs)
    acc = None
    for r, x in enumerate(inputs):
        d = framed_sr(x[rank * each:(rank + 1) * each], wire, pre, seed, seq, r, CONTRIBUTION, rank * each, mx_scale)
        acc = d if acc is None else acc + d
    return acc


# The block rotation (docs/design.md, "Block rotation"), emulated with torch's own adds in the same order.
ROTATION_BLOCK = 16


def rotation_signs(seed):
    """D's signs for a seed: the low 16 bits of Philox4x32-10's first word at counter (2^32 - 1, ...)."""
    words = philox4x32_10(_MASK, _MASK, _MASK, _MASK, seed & _MASK, seed >> 32)
    return int(words[0]) & 0xFFFF


def hadamard(x, signs, forward=True):
    """Each whole block of 16 of flat x (fp32 or fp64) as H · D · x / 4 (forward) or D · H · x / 4: the
    butterflies at strides 1, 2, 4, 8, each pair (a, b) becoming (a + b, a - b); the rest as it is."""
    v = x.reshape(-1).clone()
    whole = v.numel() // ROTATION_BLOCK * ROTATION_BLOCK
    d = torch.tensor([-1.0 if signs >> j & 1 else 1.0 for j in range(ROTATION_BLOCK)], dtype=v.dtype)
    b = v[:whole].view(-1, ROTATION_BLOCK)
    if forward:
        b = b * d
    for h in (1, 2, 4, 8):
        pairs = b.reshape(-1, ROTATION_BLOCK // (2 * h), 2, h)
        b = torch.stack([pairs[:, :, 0] + pairs[:, :, 1], pairs[:, :, 0] - pairs[:, :, 1]], 2)
    b = b.reshape(-1, ROTATION_BLOCK) * 0.25
    if not forward:
        b = b * d
    v[:whole] = b.reshape(-1)
    return v


# A wire per level (docs/numerics.md, "A wire per level"): the host path's sums across hosts that share
# memory inside each, emulated from every rank's input (rank h * per_host + l: host h, local rank l).
SECOND_LEVEL = 0x80000000  # the rank word's bit of a second-level contribution (compress/stochastic.h)


def through_level(v, wire, pre=1.0, mx_scale="rceil", sr=None):
    """v (fp32) times fp32(pre) as a level's owner decodes it: fp32 as it is ("none"), else framed; with
    sr = (seed, seq, rank word, phase, first), a block wire's elements rounded stochastically."""
    if wire == "none":
        return v.float() * torch.tensor(pre, dtype=torch.float32).item()
    if sr is not None:
        return framed_sr(v.float(), wire, pre, *sr, mx_scale)
    return framed(v.float(), wire, pre, mx_scale)


def _padded(v, n):
    out = torch.zeros(n, dtype=v.dtype)
    out[:v.numel()] = v
    return out


def _level_sums(rows_by_host, count, hosts, inside, across, pre, mx_scale, local, sr):
    """Level 1 per host: each row (one a local rank, `count` elements) through `inside`, added in local
    rank order. Level 2: each host's sums cut into `hosts` sub-parts, through `across`, added in host order.
    With sr = (seed, seq), local part `local`'s value v takes index local x count + v's bits: rank r's at
    level 1, rank SECOND_LEVEL | r's at level 2 (r: the host's local rank `local`)."""
    per_host = len(rows_by_host[0])
    first = local * count
    sums = []
    for h, rows in enumerate(rows_by_host):
        acc = None
        for q, row in enumerate(rows):
            bits = None if sr is None else (*sr, h * per_host + q, CONTRIBUTION, first)
            d = through_level(_padded(row, count), inside, pre, mx_scale, bits)
            acc = d if acc is None else acc + d
        sums.append(acc)
    sub = count // hosts
    totals = []
    for j in range(hosts):
        acc = None
        for h, s in enumerate(sums):
            bits = None if sr is None else (*sr, SECOND_LEVEL | (h * per_host + local), CONTRIBUTION, first + j * sub)
            d = through_level(s[j * sub:(j + 1) * sub], across, mx_scale=mx_scale, sr=bits)
            acc = d if acc is None else acc + d
        totals.append(acc)
    return totals


def level_allreduce(inputs, hosts, per_host, inside, across, pre=1.0, post=1.0, mx_scale="rceil", sr=None):
    """An allreduce's result with a wire per level: local parts of ceil(n / per_host) rounded up to a
    multiple of 32 x hosts, each host's sub-part sum through `across` once more, times fp32(post). MX
    blocks at either level take their scales by `mx_scale`. sr = (seed, seq): rounding=sr, the sums'
    rounding with (ANY_OWNER, RESULT) bits of the same indices as the contributions'."""
    n = inputs[0].numel()
    align = 32 * hosts
    count = -(-(-(-n // per_host)) // align) * align
    out = torch.empty(n)
    for l in range(per_host):
        lo, hi = min(n, l * count), min(n, (l + 1) * count)
        rows_by_host = [[inputs[h * per_host + q][lo:hi] for q in range(per_host)] for h in range(hosts)]
        totals = _level_sums(rows_by_host, count, hosts, inside, across, pre, mx_scale, l, sr)
        sub = count // hosts
        out[lo:hi] = torch.cat([through_level(t, across, mx_scale=mx_scale, sr=None if sr is None else
                                              (*sr, ANY_OWNER, RESULT, l * count + j * sub))
                                for j, t in enumerate(totals)])[:hi - lo] * _fp32(post)
    return out


def _fp32(v):
    return torch.tensor(v, dtype=torch.float32).item()


def level_reduce_scatter(inputs, hosts, per_host, inside, across, pre=1.0, post=1.0, mx_scale="rceil", sr=None):
    """Each rank's output of a reduce_scatter_tensor with a wire per level (inputs: world x each elements):
    local part l is the chunks of ranks h * per_host + l in host order; the sub-part sums are not rounded."""
    world = hosts * per_host
    each = inputs[0].numel() // world
    chunk = lambda x, r: x[r * each:(r + 1) * each]  # noqa: E731
    outputs = [None] * world
    for l in range(per_host):
        ranks = [h * per_host + l for h in range(hosts)]
        rows_by_host = [[torch.cat([chunk(inputs[h * per_host + q], r) for r in ranks]) for q in range(per_host)]
                        for h in range(hosts)]
        for r, t in zip(ranks, _level_sums(rows_by_host, each * hosts, hosts, inside, across, pre, mx_scale, l, sr)):
            outputs[r] = t * _fp32(post)
    return outputs

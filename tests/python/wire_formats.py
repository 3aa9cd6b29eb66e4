"""Facts about the 16-bit wire formats that the tests' rounding bounds are built from."""

import torch

WIRE_DTYPE = {"fp16": torch.float16, "bf16": torch.bfloat16}
UNIT = {"fp16": 2.0**-11, "bf16": 2.0**-8}  # unit roundoff of the wire format
# The absolute error of a rounding that lands among the wire's subnormals.
HALF_SUBNORMAL_STEP = {"fp16": 2.0**-25, "bf16": 2.0**-134}


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

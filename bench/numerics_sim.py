"""Simulated error of a compressed allreduce against fp64, for world sizes this machine cannot run
(issue #16's extrapolation to 64 ranks): a ring of 16-bit adds (NCCL's kernels, gloo, the seed hooks
and cnccl's accumulate=wire round the running sum to the wire type at every hop) against cnccl's
accumulate=fp32 (each contribution cast once, the casts added in fp32 in rank order, the sum rounded
once). Gaussian gradients, a fresh draw per rank; prints the relative L2 error of each and their ratio.

Usage: python3 bench/numerics_sim.py [--ranks 2,4,8,16,32,64] [--numel 262144]
"""

import argparse

import torch

WIRES = {"fp16": torch.float16, "bf16": torch.bfloat16}


def errors(world, numel, wire, gen):
    w = WIRES[wire]
    xs = [torch.randn(numel, generator=gen) for _ in range(world)]
    exact = sum(x.double() for x in xs)
    casts = [x.to(w) for x in xs]
    ring = casts[0]
    for c in casts[1:]:
        ring = (ring.float() + c.float()).to(w)
    fp32 = sum(c.float() for c in casts).to(w)

    def rel(v):
        return ((v.double() - exact).norm() / exact.norm()).item()

    return rel(ring), rel(fp32)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", default="2,4,8,16,32,64")
    ap.add_argument("--numel", type=int, default=1 << 18)
    args = ap.parse_args()
    gen = torch.Generator().manual_seed(0)
    print(f"relative L2 error vs fp64, Gaussian gradients, {args.numel} elements")
    print(f"{'ranks':>5} " + " ".join(f"{w + ' ring':>12} {w + ' fp32':>12} {'ratio':>7}" for w in WIRES))
    for world in (int(r) for r in args.ranks.split(",")):
        cells = []
        for wire in WIRES:
            ring, fp32 = errors(world, args.numel, wire, gen)
            cells.append(f"{ring:12.3e} {fp32:12.3e} {fp32 / ring:6.2f}x")
        print(f"{world:>5} " + " ".join(cells))


if __name__ == "__main__":
    main()

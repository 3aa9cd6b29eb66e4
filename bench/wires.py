"""Every compressed wire's allreduce on one host beside cnccl's fp16 wire: what a user pays for the
numerics of power-of-two frames, fp8 and MX on CPU ranks (the wire's speed = fp16's time over the
wire's), with each wire's phases from `cnccl.stats()` and the transport it took. Interleaved trials,
medians, with the min and the spread over trials; the goals are printed met or not met. Each rank is pinned to a core of its own.

Usage: python3 bench/wires.py [--ranks 2] [--sizes 1M,16M,64M] [--trials 7] [--json FILE]
"""

import argparse
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from allreduce import PHASES, RESULTS, label, parse_size, pin_to_own_core, save_json, spawn  # noqa: E402

REFERENCE = "fp16"
WIRES = {
    "fp16": dict(wire_dtype="fp16"),
    "fp16-pow2": dict(wire_dtype="fp16", accumulate="fp32", scaling="pow2"),
    "e4m3": dict(wire_dtype="e4m3", accumulate="fp32", scaling="pow2"),
    "mxfp8": dict(wire_dtype="mxfp8", accumulate="fp32"),
    "mxfp4": dict(wire_dtype="mxfp4", accumulate="fp32"),
}
# Each wire's speed against fp16's at these sizes, 2 ranks on one host.
GOAL_SPEED, GOAL_SIZES, GOAL_RANKS = 0.8, (16 << 20, 64 << 20), 2


def worker(rank, world, port, sizes, trials, out):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")
    pin_to_own_core(rank, world)
    import cnccl

    dist.init_process_group("gloo", rank=rank, world_size=world)
    groups = {w: dist.new_group(backend="cnccl", pg_options=cnccl.Options(**o)) for w, o in WIRES.items()}
    rows = []
    for nbytes in sizes:
        src = torch.randn(nbytes // 4)
        x = src.clone()
        times = {w: [] for w in groups}
        phases = {w: dict.fromkeys(PHASES, 0.0) for w in groups}
        reps = max(1, min(50, (64 << 20) // nbytes))
        for trial in range(trials + 1):  # the first round warms every wire up
            for w, g in groups.items():
                dist.barrier(group=g)
                before = cnccl.stats(g)
                elapsed = 0.0
                for _ in range(reps):
                    # Each call sums the same input (summed in place, fp16 overflows a few calls on),
                    # restored outside the time.
                    x.copy_(src)
                    t0 = time.perf_counter()
                    dist.all_reduce(x, group=g)
                    elapsed += time.perf_counter() - t0
                if trial > 0:
                    times[w].append(elapsed / reps)
                    after = cnccl.stats(g)
                    for p in PHASES:
                        phases[w][p] += (after[p + "_ns"] - before[p + "_ns"]) / (reps * trials)
                src.normal_()
        rows.append({"bytes": nbytes, "seconds": {w: statistics.median(t) for w, t in times.items()},
                     "seconds_min": {w: min(t) for w, t in times.items()},
                     "spread": {w: (max(t) - min(t)) / statistics.median(t) for w, t in times.items()},
                     "phases_ns": phases, "transport": {w: cnccl.config(g)["cpu_transport"] for w, g in groups.items()}})
    if rank == 0:
        out.put(rows)
    dist.destroy_process_group()


def speeds(row):
    return {w: row["seconds"][REFERENCE] / t for w, t in row["seconds"].items()}


def report(world, rows, trials):
    lines = [f"allreduce on one host, {world} ranks, fp32 SUM, median of {trials} trials: ms per call "
             f"(speed = {REFERENCE}'s time / the wire's)"]
    lines.append(f"{'size':>6} " + " ".join(f"{w:>18}" for w in WIRES))
    for row in rows:
        s = speeds(row)
        lines.append(f"{label(row['bytes']):>6} " +
                     " ".join(f"{row['seconds'][w] * 1e3:8.2f} ({s[w]:4.2f}x)" for w in WIRES))
    lines.append("min over trials, ms, and the spread (max - min) / median")
    for row in rows:
        lines.append(f"{label(row['bytes']):>6} " +
                     " ".join(f"{row['seconds_min'][w] * 1e3:9.2f} {row['spread'][w]:7.1%}" for w in WIRES))
    lines.append(f"\ntransport: " + ", ".join(f"{w} {t}" for w, t in rows[-1]["transport"].items()))
    lines.append("\nrank 0's phases per call, ms (cnccl.stats)")
    lines.append(f"{'size':>6} {'wire':>10} " + " ".join(f"{p:>9}" for p in PHASES) + f" {'wall':>9}")
    for row in rows:
        for w in WIRES:
            ph = row["phases_ns"][w]
            lines.append(f"{label(row['bytes']):>6} {w:>10} " + " ".join(f"{ph[p] / 1e6:9.2f}" for p in PHASES) +
                         f" {row['seconds'][w] * 1e3:9.2f}")
    return "\n".join(lines)


def goals(results):
    lines = [f"\nGOALS (one host, {GOAL_RANKS} ranks: every wire at least {GOAL_SPEED}x {REFERENCE}'s speed)"]
    rows = {row["bytes"]: row for row in results.get(str(GOAL_RANKS), [])}
    for size in GOAL_SIZES:
        if size not in rows:
            lines.append(f"  {label(size)}: not measured")
            continue
        for w, s in speeds(rows[size]).items():
            if w != REFERENCE:
                lines.append(f"  {label(size)} {w:>10}: {s:.2f}x  {'met' if s >= GOAL_SPEED else 'NOT MET'}")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--ranks", default="2")
    parser.add_argument("--sizes", default="1M,16M,64M")
    parser.add_argument("--trials", type=int, default=7)
    parser.add_argument("--json", default=os.path.join(RESULTS, "wires.json"), help="results file ('' for none)")
    args = parser.parse_args()
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    results = {}
    for world in (int(w) for w in args.ranks.split(",")):
        results[str(world)] = spawn(worker, world, sizes, args.trials)
        print(report(world, results[str(world)], args.trials) + "\n", flush=True)
    print(goals(results), flush=True)
    save_json({"trials": args.trials, "results": results}, args.json)


if __name__ == "__main__":
    main()

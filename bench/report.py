"""Regenerates docs/benchmarks.md's one-host results: runs bench/allreduce.py (2 and 4 ranks) and
bench/ddp_step.py, writes bench/results/{allreduce.json, allreduce.png, ddp_step.json} and rewrites the
section between its `results` markers. `--from-results` rewrites it from those JSON files, running nothing.

Usage: python3 bench/report.py [--trials 7] [--from-results]
"""

import argparse
import json
import os

import allreduce
import ddp_step
import sections

RESULTS = allreduce.RESULTS


def goals(ar, ddp):
    """The performance goals: (what, measured ratio, target ratio, whether higher is better)."""
    rows = {row["bytes"]: row for row in ar["2"]}
    out = []
    for size in (16 << 20, 64 << 20):
        r = rows[size]["ratios"]
        name = "2 ranks, " + allreduce.label(size)
        out.append((f"{name} cnccl-fp16 vs gloo fp32", r["fp16/gloo"], 3.0, True))
        out.append((f"{name} cnccl-fp16 vs gloo running the hook's math", r["fp16/hook"], 2.0, True))
        out.append((f"{name} cnccl-fp16 vs cnccl-none", r["fp16/none"], 1.7, True))
    four = {row["bytes"]: row for row in ar["4"]}
    out.append(("4 ranks, 16M cnccl-fp16 vs gloo fp32", four[16 << 20]["ratios"]["fp16/gloo"], 3.0, True))
    small = rows[min(rows)]["seconds"]
    out.append((f"2 ranks, {allreduce.label(min(rows))} latency, gloo / cnccl", small["gloo-fp32"] /
                small["cnccl-fp16"], 1.0, True))
    # Against DeepSpeed's shared-memory allreduce, where the run had it (bench/deepspeed_shm.py).
    for size, target in ((256 << 10, 1.0), (4 << 20, 1.5), (16 << 20, 1.8), (64 << 20, 2.0)):
        if size in rows and "fp16/ds" in rows[size]["ratios"]:
            out.append((f"2 ranks, {allreduce.label(size)} cnccl-fp16 vs DeepSpeed shm (fp32)",
                        rows[size]["ratios"]["fp16/ds"], target, True))
    for size in (16 << 20, 64 << 20):
        if size in rows and "none/ds" in rows[size]["ratios"]:
            out.append((f"2 ranks, {allreduce.label(size)} cnccl-none vs DeepSpeed shm (fp32)",
                        rows[size]["ratios"]["none/ds"], 1.0, True))
    gap = rows[min(rows)].get("gap_seconds")
    if gap:
        out.append((f"2 ranks, {allreduce.label(min(rows))} after 2 ms of compute, cnccl-fp16 us per call",
                    gap["cnccl-fp16"] * 1e6, 25, False))
    runs = ddp["runs"]
    out.append(("DDP step, cnccl-fp16 / (gloo + fp16 hook)", runs["cnccl-fp16"]["step_s"] /
                runs["gloo+fp16_hook"]["step_s"], 0.8, False))
    return out


def section(ar, ddp, trials):
    lines = ["Regenerate with `python3 bench/report.py` (about 3 minutes; numbers are from one run on a "
             f"{ar['machine']['cores']}-core machine, {ar['machine']['date']}, torch {ar['machine']['torch']}; "
             f"medians of {trials} interleaved trials).", "",
             "![allreduce bandwidth](../bench/results/allreduce.png)", ""]
    lines += ["| goal | measured | target | |", "|---|---|---|---|"]
    for name, value, target, higher in goals(ar["results"], ddp):
        met = value >= target if higher else value <= target
        sign = ">=" if higher else "<="
        unit = " us" if "us per call" in name else "x"
        lines.append(f"| {name} | {value:.2f}{unit} | {sign} {target:g}{unit} | {'met' if met else 'not met'} |")
    two = ar["results"]["2"]
    transport = two[0]["cnccl_transport"]
    dram, passes = allreduce.DRAM_BYTES["shm" if transport == "shm" else "ucx"]
    small = two[0]
    latency = f"2 ranks, {allreduce.label(small['bytes'])}: cnccl-fp16 {small['seconds']['cnccl-fp16'] * 1e6:.0f} us per " \
              "allreduce back to back"
    if allreduce.DEEPSPEED in small["seconds"]:
        latency += f" (DeepSpeed shm {small['seconds'][allreduce.DEEPSPEED] * 1e6:.0f} us)"
    if "gap_seconds" in small:
        gap = small["gap_seconds"]
        latency += f", {gap['cnccl-fp16'] * 1e6:.0f} us after {small['gap_s'] * 1e3:g} ms of compute" + (
            f" (DeepSpeed shm {gap[allreduce.DEEPSPEED] * 1e6:.0f} us)" if allreduce.DEEPSPEED in gap else "")
        if allreduce.C10D_FLOOR in gap:
            latency += (f"; c10d's own path for such a call, through torch's do-nothing `fake` backend, took "
                        f"{gap[allreduce.C10D_FLOOR] * 1e6:.0f} us")
    lines += ["", latency + f". cnccl's CPU transport: {transport}; DRAM traffic per fp32 element per rank, estimated "
              f"from its passes: {dram} bytes ({passes})."]
    for world, rows in ar["results"].items():
        variants = allreduce.variants_of(rows)
        ratios = [r for r in ("fp16/none", "fp16/gloo", "fp16/hook", "fp16/ds", "none/ds") if r in rows[0]["ratios"]]
        lines += ["", f"allreduce, {world} ranks: algbw GB/s (busbw = algbw x {2 * (int(world) - 1)}/{world})", "",
                  "| size | " + " | ".join(variants + ratios) + " |", "|---" * (len(variants) + len(ratios) + 1) + "|"]
        for row in rows:
            lines.append(f"| {allreduce.label(row['bytes'])} | " +
                         " | ".join(f"{row['algbw_gbs'][n]:.2f}" for n in variants) + " | " +
                         " | ".join(f"{row['ratios'][r]:.2f}x" for r in ratios) + " |")
    lines += ["", "```", ddp_step.table(ddp), "```"]
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--trials", type=int, default=7)
    parser.add_argument("--from-results", action="store_true",
                        help="rewrite the section from bench/results/allreduce.json and ddp_step.json, running nothing")
    args = parser.parse_args()
    if args.from_results:
        with open(os.path.join(RESULTS, "allreduce.json")) as f:
            ar = json.load(f)
        with open(os.path.join(RESULTS, "ddp_step.json")) as f:
            ddp = json.load(f)
        sections.rewrite(sections.BENCHMARKS, "results", section(ar, ddp, ar["trials"]))
        return
    sizes = [allreduce.parse_size(s) for s in allreduce.DEFAULT_SIZES.split(",")]
    results = {}
    for world in (2, 4):
        results[str(world)] = allreduce.run(world, sizes, args.trials, 2e-3)
        print(allreduce.table(world, results[str(world)], args.trials) + "\n", flush=True)
    allreduce.save(results, args.trials, os.path.join(RESULTS, "allreduce.json"),
                   os.path.join(RESULTS, "allreduce.png"))
    ar = {"machine": allreduce.machine(), "trials": args.trials, "results": results}
    ddp = ddp_step.run()
    print(ddp_step.table(ddp), flush=True)
    ddp_step.check(ddp)
    allreduce.save_json(ddp, os.path.join(RESULTS, "ddp_step.json"))
    sections.rewrite(sections.BENCHMARKS, "results", section(ar, ddp, args.trials))


if __name__ == "__main__":
    main()

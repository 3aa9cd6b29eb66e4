"""Allreduce bandwidth of cnccl (fp16, bf16, none) beside gloo fp32, measured in one job.

Usage: python3 bench/allreduce.py [--ranks 2] [--sizes 64K,256K,1M,4M,16M,64M] [--trials 7]

Each size runs every variant in turn, trial after trial (interleaved, so machine noise hits all
alike), and reports the median time as algorithm bandwidth (fp32 bytes / time) and ratios.
"""

import argparse
import os
import socket
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def parse_size(s):
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(float(s[:-1]) * units[s[-1].upper()]) if s[-1].upper() in units else int(s)


PHASES = ("cast", "reduce", "transfer", "restore")


def worker(rank, world, port, sizes, trials, out):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")
    torch.set_num_threads(1)
    if world <= os.cpu_count():
        # One core per rank, as a launcher's CPU binding would: no rank's threads migrate onto the
        # other's core, which otherwise makes the variants' times swing run to run.
        os.sched_setaffinity(0, {rank})
    import cnccl

    dist.init_process_group("gloo", rank=rank, world_size=world)
    groups = {
        "gloo-fp32": dist.group.WORLD,
        "cnccl-fp16": dist.new_group(backend="cnccl", pg_options=cnccl.Options(wire_dtype="fp16")),
        "cnccl-bf16": dist.new_group(backend="cnccl", pg_options=cnccl.Options(wire_dtype="bf16")),
        "cnccl-none": dist.new_group(backend="cnccl", pg_options=cnccl.Options(wire_dtype="none")),
    }
    rows = []
    for nbytes in sizes:
        x = torch.randn(nbytes // 4)
        times = {name: [] for name in groups}
        phases = {name: dict.fromkeys(PHASES, 0) for name in groups if name.startswith("cnccl")}
        reps = max(1, min(50, (64 << 20) // nbytes))
        for trial in range(trials + 1):  # the first round warms up every variant
            for name, g in groups.items():
                dist.barrier(group=g)
                before = cnccl.stats(g) if name in phases else None
                t0 = time.perf_counter()
                for _ in range(reps):
                    dist.all_reduce(x, group=g)
                times[name].append((time.perf_counter() - t0) / reps)
                if before is not None and trial > 0:
                    after = cnccl.stats(g)
                    for p in PHASES:
                        phases[name][p] += (after[p + "_ns"] - before[p + "_ns"]) / (reps * trials)
                x.normal_()
        rows.append((nbytes, {name: statistics.median(t[1:]) for name, t in times.items()}, phases))
    if rank == 0:
        out.put(rows)
    dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--sizes", default="64K,256K,1M,4M,16M,64M")
    parser.add_argument("--trials", type=int, default=7)
    args = parser.parse_args()
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=worker, args=(r, args.ranks, port, sizes, args.trials, out)) for r in range(args.ranks)]
    for p in procs:
        p.start()
    rows = out.get()
    for p in procs:
        p.join()

    names = ["cnccl-fp16", "cnccl-bf16", "cnccl-none", "gloo-fp32"]
    print(f"allreduce, {args.ranks} ranks, fp32 SUM, median of {args.trials} trials; algbw in GB/s (fp32 bytes / time)")
    print(f"{'size':>8} " + " ".join(f"{n:>11}" for n in names) + f" {'fp16/none':>10} {'fp16/gloo':>10} {'bf16/gloo':>10}")
    for nbytes, t, _ in rows:
        bw = {n: nbytes / t[n] / 1e9 for n in names}
        print(f"{label(nbytes):>8} " + " ".join(f"{bw[n]:11.2f}" for n in names) +
              f" {t['cnccl-none'] / t['cnccl-fp16']:9.2f}x {t['gloo-fp32'] / t['cnccl-fp16']:9.2f}x"
              f" {t['gloo-fp32'] / t['cnccl-bf16']:9.2f}x")
    print("\nrank 0's time per allreduce by phase, microseconds (cnccl.stats: cast = scale-and-cast or packing copy,"
          " transfer = moving bytes and waiting on the peer, restore = restore or unpacking copy)")
    print(f"{'size':>8} {'variant':>11} " + " ".join(f"{p:>9}" for p in PHASES) + f" {'wall':>9}")
    for nbytes, t, phases in rows:
        for name in ("cnccl-fp16", "cnccl-none"):
            print(f"{label(nbytes):>8} {name:>11} " + " ".join(f"{phases[name][p] / 1e3:9.0f}" for p in PHASES) +
                  f" {t[name] * 1e6:9.0f}")
    sys.stdout.flush()


def label(nbytes):
    return f"{nbytes >> 20}M" if nbytes >= 1 << 20 else f"{nbytes >> 10}K"


if __name__ == "__main__":
    main()

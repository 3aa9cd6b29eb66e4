"""What telemetry costs a compressed allreduce (docs/design.md, "Telemetry"), measured side by side.

Usage: python3 bench/telemetry.py [--ranks 2] [--size 16M] [--trials 15] [--json FILE]

One run, `--ranks` ranks on this host, two groups for each telemetry setting (off, counts, error) and
wire (fp16 through shared memory, the default path; fp16 over UCX; mxfp8 blocks), all timing the
same allreduce in interleaved trials: a trial times each group's `--iters` allreduces back to back,
starting at another group each trial. A group's speed depends on where it was created (its buffers'
addresses: the first group of a wire ran 10-20% slower than the last, whatever its setting), so each
setting has one group created early and one late (off, counts, error, error, counts, off), and its
time is the median over both groups' trials.
Reported: each setting's median time and its ratio to telemetry=off on the same wire.
"""

import argparse
import os
import statistics
import time

import torch
import torch.distributed as dist

from allreduce import RESULTS, label, parse_size, pin_to_own_core, save_json, spawn

SETTINGS = ("off", "counts", "error")
WIRES = {"fp16, shared memory": ({"wire_dtype": "fp16"}, "on"), "fp16, UCX": ({"wire_dtype": "fp16"}, "off"),
         "mxfp8, UCX": ({"wire_dtype": "mxfp8", "accumulate": "fp32"}, "off")}


def worker(rank, world, port, nbytes, trials, iters, out):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")
    pin_to_own_core(rank, world)
    import cnccl

    dist.init_process_group("gloo", rank=rank, world_size=world)
    groups = {}
    for wire, (fields, shm) in WIRES.items():
        for copy, setting in enumerate(SETTINGS + SETTINGS[::-1]):
            groups[wire, setting, copy // len(SETTINGS)] = dist.new_group(backend="cnccl", pg_options=cnccl.Options(
                min_bytes=0, shm=shm, telemetry=setting, **fields))
    x = torch.randn(nbytes // 4)
    times = {key: [] for key in groups}
    keys = list(groups)
    for trial in range(trials + 1):  # the first is warm-up
        # Each trial starts at another group: none always runs first, or after the same one.
        for key in keys[trial % len(keys):] + keys[:trial % len(keys)]:
            g = groups[key]
            dist.barrier()
            start = time.perf_counter()
            for _ in range(iters):
                dist.all_reduce(x, group=g)
            times[key].append((time.perf_counter() - start) / iters)
    if rank == 0:
        pooled = {}
        for (wire, setting, _), t in times.items():
            pooled.setdefault(f"{wire}|{setting}", []).extend(t[1:])
        out.put({key: statistics.median(t) for key, t in pooled.items()})
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--size", type=parse_size, default=16 << 20)
    ap.add_argument("--trials", type=int, default=15)
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--json", default=os.path.join(RESULTS, "telemetry.json"))
    args = ap.parse_args()
    medians = spawn(worker, args.ranks, args.size, args.trials, args.iters)
    print(f"allreduce of {label(args.size)} fp32, {args.ranks} ranks, median of {args.trials} trials")
    print(f"{'wire':22}{'telemetry':>10}{'ms':>10}{'vs off':>10}")
    for wire in WIRES:
        off = medians[f"{wire}|off"]
        for setting in SETTINGS:
            t = medians[f"{wire}|{setting}"]
            print(f"{wire:22}{setting:>10}{t * 1e3:10.3f}{t / off:9.3f}x")
    save_json({"ranks": args.ranks, "bytes": args.size, "trials": args.trials, "median_s": medians}, args.json)


if __name__ == "__main__":
    main()

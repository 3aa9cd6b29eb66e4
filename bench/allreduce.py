"""Allreduce bandwidth of cnccl (fp16, fp16 with fp32 sums, the same in pow2 frames, fp8 e4m3 frames, bf16,
none) beside gloo fp32, gloo running the fp16 hook's math, and DeepSpeed's shared-memory allreduce (fp32)
where deepspeed is installed and every rank has a core of its own (its waits spin; bench/deepspeed_shm.py).

Usage: python3 bench/allreduce.py [--ranks 2,4] [--sizes 4K,...,128M] [--trials 7] [--busy N] [--gap-ms 2]
                                  [--json FILE] [--plot FILE]
(JSON and plot go to bench/results/ unless told otherwise; bench/report.py also puts them in docs/benchmarks.md.)

Each size runs every variant in turn, trial after trial (interleaved, so machine noise hits all
alike), and reports the median time as algorithm bandwidth (fp32 bytes / time), bus bandwidth
(algbw x 2(n-1)/n, the bytes each rank's link carries in a ring) and ratios. "gloo-hook" is what
`fp16_compress_hook` does around the allreduce: cast to fp16 and divide, allreduce the fp16 copy
on gloo, copy back into the fp32 tensor. The smallest size is also timed call by call with `--gap-ms`
of compute on the caller's thread before each call, as a training step issues small allreduces: the
time of the call alone, median over every call. `--busy N` runs N busy-loop processes beside the ranks, as
a training job's compute threads or another job would, to show how each backend copes with sharing
its cores, and how much of their throughput the ranks leave them (beside the ranks against alone).
"""

import argparse
import concurrent.futures
import contextlib
import json
import os
import platform
import queue
import socket
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import deepspeed_shm

DEEPSPEED = "deepspeed-shm"
# In the latency case after compute only: c10d's own path for a call, through torch's "fake" backend,
# which does nothing (torch.testing._internal.distributed.fake_pg): the floor of any c10d backend.
C10D_FLOOR = "c10d-floor"
SHARED_CORES = "CNCCL_BENCH_BUSY"  # set for the ranks (and inherited by them) when --busy runs loops beside them
PHASES = ("cast", "reduce", "transfer", "restore")
DEFAULT_SIZES = "4K,16K,64K,256K,1M,4M,16M,64M,128M"
# Bytes of DRAM traffic per fp32 element on each rank of a compressed (16-bit) allreduce, from the
# passes each of cnccl's host transports makes over memory that does not stay in cache.
DRAM_BYTES = {
    "shm": (8, "the cast reads 4; the restore writes 4 straight from the owners' results into lines the cast "
               "brought into cache; the 16-bit slots stay in cache"),
    "ucx": (17, "2 ranks: the cast of the part sent first 3, a receive copy 2, cast-and-add 4, a second receive "
                "copy 2, the restore 6"),
}
RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


def parse_size(s):
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(float(s[:-1]) * units[s[-1].upper()]) if s[-1].upper() in units else int(s)


def label(nbytes):
    return f"{nbytes >> 20}M" if nbytes >= 1 << 20 else f"{nbytes >> 10}K"


def pin_to_own_core(rank, world):
    torch.set_num_threads(1)
    if world <= os.cpu_count():
        # One core per rank, as a launcher's CPU binding would: no rank's threads migrate onto the
        # other's core, which otherwise makes the variants' times swing run to run.
        os.sched_setaffinity(0, {rank})


def hook_allreduce(x, group, world):
    wire = x.to(torch.float16).div_(world)
    dist.all_reduce(wire, group=group)
    x.copy_(wire)


def with_deepspeed(world):
    """Whether a job of `world` ranks runs DeepSpeed's allreduce too: installed, and a core per rank
    (not with --busy, whose loops would then share the cores its spinning waits hold)."""
    return deepspeed_shm.available() and world <= os.cpu_count() and not os.environ.get(SHARED_CORES)


def variants_of(rows):
    return list(rows[0]["seconds"])


def compute(seconds):
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def c10d_floor_group():
    """A group of torch's "fake" backend, or None where this torch has none."""
    try:
        import torch.testing._internal.distributed.fake_pg  # noqa: F401 (registers "fake")
        return dist.new_group(backend="fake")
    except Exception:  # a torch without it, or one that changed it: the floor is left out
        return None


def gap_latency(groups, x, trials, gap_s, deepspeed):
    """Median seconds of one allreduce of `x` issued after `gap_s` of compute, per variant."""
    calls = 20
    groups = dict(groups)
    floor = c10d_floor_group()
    if floor is not None:
        groups[C10D_FLOOR] = floor
    times = {name: [] for name in groups if name != "gloo-hook"}
    for trial in range(trials + 1):
        for name in times:
            dist.barrier(group=groups["gloo-fp32"])
            for _ in range(calls):
                compute(gap_s)
                t0 = time.perf_counter()
                if name == DEEPSPEED:
                    deepspeed_shm.allreduce(x)
                else:
                    dist.all_reduce(x, group=groups[name])
                if trial > 0:
                    times[name].append(time.perf_counter() - t0)
    return {name: statistics.median(t) for name, t in times.items()}


def worker(rank, world, port, sizes, trials, gap_s, out):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")
    pin_to_own_core(rank, world)
    import cnccl

    dist.init_process_group("gloo", rank=rank, world_size=world)
    deepspeed = None
    if with_deepspeed(world):
        deepspeed = deepspeed_shm.load()
        deepspeed_shm.initialize(deepspeed, rank, world)
    groups = {
        "cnccl-fp16": dist.new_group(backend="cnccl", pg_options=cnccl.Options(wire_dtype="fp16")),
        "cnccl-fp16-acc32": dist.new_group(backend="cnccl",
                                           pg_options=cnccl.Options(wire_dtype="fp16", accumulate="fp32")),
        "cnccl-fp16-pow2": dist.new_group(backend="cnccl", pg_options=cnccl.Options(
            wire_dtype="fp16", accumulate="fp32", scaling="pow2")),
        "cnccl-e4m3": dist.new_group(backend="cnccl", pg_options=cnccl.Options(
            wire_dtype="e4m3", accumulate="fp32", scaling="pow2")),
        "cnccl-bf16": dist.new_group(backend="cnccl", pg_options=cnccl.Options(wire_dtype="bf16")),
        "cnccl-none": dist.new_group(backend="cnccl", pg_options=cnccl.Options(wire_dtype="none")),
        "gloo-fp32": dist.group.WORLD,
        "gloo-hook": dist.group.WORLD,
    }
    if deepspeed is not None:
        groups[DEEPSPEED] = dist.group.WORLD
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
                    if name == "gloo-hook":
                        hook_allreduce(x, g, world)
                    elif name == DEEPSPEED:
                        deepspeed_shm.allreduce(x)
                    else:
                        dist.all_reduce(x, group=g)
                times[name].append((time.perf_counter() - t0) / reps)
                if before is not None and trial > 0:
                    after = cnccl.stats(g)
                    for p in PHASES:
                        phases[name][p] += (after[p + "_ns"] - before[p + "_ns"]) / (reps * trials)
                x.normal_()
        rows.append({"bytes": nbytes, "seconds": {n: statistics.median(t[1:]) for n, t in times.items()},
                     "phases_ns": phases, "cnccl_transport": cnccl.config(groups["cnccl-fp16"])["cpu_transport"]})
    if gap_s > 0:
        rows[0]["gap_seconds"] = gap_latency(groups, torch.randn(sizes[0] // 4), trials, gap_s, deepspeed)
        rows[0]["gap_s"] = gap_s
    if rank == 0:
        out.put(rows)
    dist.destroy_process_group()


def spawn(target, world, *args):
    """Runs target(rank, world, port, *args, queue) on `world` ranks; returns what rank 0 puts on the queue."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=target, args=(r, world, port, *args, out)) for r in range(world)]
    for p in procs:
        p.start()
    while True:
        try:
            result = out.get(timeout=1)
            break
        except queue.Empty:
            # A rank that died (at import, or of an error) leaves the others waiting on it forever.
            dead = [(r, p.exitcode) for r, p in enumerate(procs) if p.exitcode not in (None, 0)]
            if dead:
                for p in procs:
                    p.kill()
                raise SystemExit(f"rank(s) exited before a result: {dead} (rank, exit code)")
    for p in procs:
        p.join()
    return result


def run(world, sizes, trials, gap_s, busy_rate=None):
    """Runs one job of `world` ranks; returns a row per size (median seconds per variant, phases).
    `busy_rate`: the busy loops' throughput meter (busy_loops), read over the job's whole run."""
    if with_deepspeed(world):
        deepspeed_shm.load()  # built once here, not by every rank at once
    if busy_rate is None:
        rows = spawn(worker, world, sizes, trials, gap_s)
    else:
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            job = pool.submit(spawn, worker, world, sizes, trials, gap_s)
            samples = []
            while not job.done():
                samples.append(busy_rate(0.5))
            rows = job.result()
        rows[0]["busy_rate"] = statistics.median(samples)
    for row in rows:
        t = row["seconds"]
        row["algbw_gbs"] = {n: row["bytes"] / t[n] / 1e9 for n in t}
        row["busbw_gbs"] = {n: bw * 2 * (world - 1) / world for n, bw in row["algbw_gbs"].items()}
        row["ratios"] = {
            "fp16/none": t["cnccl-none"] / t["cnccl-fp16"],
            "fp16/gloo": t["gloo-fp32"] / t["cnccl-fp16"],
            "fp16/hook": t["gloo-hook"] / t["cnccl-fp16"],
            "bf16/gloo": t["gloo-fp32"] / t["cnccl-bf16"],
            "acc32/fp16": t["cnccl-fp16-acc32"] / t["cnccl-fp16"],
            "pow2/acc32": t["cnccl-fp16-pow2"] / t["cnccl-fp16-acc32"],
            # Speed-ups (time of the fp16 wire over the e4m3 wire's).
            "fp16/e4m3": t["cnccl-fp16"] / t["cnccl-e4m3"],
            "acc32/e4m3": t["cnccl-fp16-acc32"] / t["cnccl-e4m3"],
        }
        if DEEPSPEED in t:
            row["ratios"].update({"fp16/ds": t[DEEPSPEED] / t["cnccl-fp16"], "none/ds": t[DEEPSPEED] / t["cnccl-none"]})
    return rows


def table(world, rows, trials):
    """The printed report of one job: bandwidths, ratios, small-message latency, phase breakdown."""
    lines = [f"allreduce, {world} ranks, fp32 SUM, median of {trials} trials; algbw / busbw in GB/s "
             "(algbw = fp32 bytes / time, busbw = algbw x 2(n-1)/n)"]
    variants = variants_of(rows)
    ratios = list(rows[0]["ratios"])
    lines.append(f"{'size':>6} " + " ".join(f"{n:>15}" for n in variants) + "  " +
                 " ".join(f"{r:>10}" for r in ratios))
    for row in rows:
        cells = " ".join(f"{row['algbw_gbs'][n]:7.2f}/{row['busbw_gbs'][n]:<7.2f}" for n in variants)
        lines.append(f"{label(row['bytes']):>6} {cells}  " + " ".join(f"{row['ratios'][r]:9.2f}x" for r in ratios))
    small = rows[0]
    lines.append(f"\nlatency at {label(small['bytes'])}, microseconds: " +
                 ", ".join(f"{n} {small['seconds'][n] * 1e6:.1f}" for n in variants))
    if "gap_seconds" in small:
        lines.append(f"latency at {label(small['bytes'])} after {small['gap_s'] * 1e3:g} ms of compute, microseconds: " +
                     ", ".join(f"{n} {t * 1e6:.1f}" for n, t in small["gap_seconds"].items()))
    transport = small["cnccl_transport"]
    dram, passes = DRAM_BYTES["shm" if transport == "shm" else "ucx"]
    lines.append(f"\ncnccl's CPU transport: {transport}; DRAM traffic per fp32 element per rank, fp16 wire, estimated "
                 f"from its passes: {dram} bytes ({passes})")
    lines.append("\nrank 0's time per allreduce by phase, microseconds (cnccl.stats: cast = scale-and-cast or "
                 "packing copy, transfer = moving bytes and waiting on peers, restore = restore or unpacking copy)")
    lines.append(f"{'size':>6} {'variant':>11} " + " ".join(f"{p:>9}" for p in PHASES) + f" {'wall':>9}")
    for row in rows:
        if row["bytes"] < 1 << 20:
            continue
        for name in ("cnccl-fp16", "cnccl-none"):
            ph = row["phases_ns"][name]
            lines.append(f"{label(row['bytes']):>6} {name:>11} " + " ".join(f"{ph[p] / 1e3:9.0f}" for p in PHASES) +
                         f" {row['seconds'][name] * 1e6:9.0f}")
    return "\n".join(lines)


def plot(results, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    worlds = sorted(results, key=int)
    fig, axes = plt.subplots(1, len(worlds), figsize=(6 * len(worlds), 4.5), squeeze=False)
    for ax, world in zip(axes[0], worlds):
        rows = results[world]
        sizes = [row["bytes"] for row in rows]
        for name in variants_of(rows):
            ax.plot(sizes, [row["algbw_gbs"][name] for row in rows], marker="o", label=name)
        ax.set_xscale("log", base=2)
        ax.set_xticks(sizes, [label(s) for s in sizes], rotation=45)
        ax.set_xlabel("fp32 tensor size")
        ax.set_ylabel("algbw, GB/s (fp32 bytes / time)")
        ax.set_title(f"allreduce, {world} ranks ({os.cpu_count()} cores)")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def machine():
    return {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(), "torch": torch.__version__,
            "date": time.strftime("%Y-%m-%d")}


def save_json(data, path):
    """Writes `data` with the machine's description to `path` ('' or None: nowhere)."""
    if not path:
        return
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump({"machine": machine(), **data}, f, indent=1)


def save(results, trials, json_path, plot_path):
    save_json({"trials": trials, "results": results}, json_path)
    if plot_path:
        os.makedirs(os.path.dirname(os.path.abspath(plot_path)), exist_ok=True)
        plot(results, plot_path)


def spin(count):
    while True:
        with count.get_lock():
            count.value += 1


def spin_rate(loops, seconds):
    """Loop iterations per second of the busy-loop processes together, over `seconds`."""
    start = sum(c.value for _, c in loops)
    time.sleep(seconds)
    return (sum(c.value for _, c in loops) - start) / seconds


@contextlib.contextmanager
def busy_loops(count):
    """Runs `count` processes that only burn CPU for the duration of the block, as a job's compute
    threads would; yields a function that reports their throughput (loop iterations per second) now."""
    ctx = mp.get_context("spawn")
    loops = []
    for _ in range(count):
        counter = ctx.Value("q", 0)
        loops.append((ctx.Process(target=spin, args=(counter,), daemon=True), counter))
    for p, _ in loops:
        p.start()
    try:
        yield lambda seconds: spin_rate(loops, seconds)
    finally:
        for p, _ in loops:
            p.kill()
            p.join()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--ranks", default="2,4")
    parser.add_argument("--sizes", default=DEFAULT_SIZES)
    parser.add_argument("--trials", type=int, default=7)
    parser.add_argument("--busy", type=int, default=0, help="busy-loop processes to run beside the ranks")
    parser.add_argument("--gap-ms", type=float, default=2.0,
                        help="compute before each call of the smallest size's latency case (0: no such case)")
    parser.add_argument("--json", default=os.path.join(RESULTS, "allreduce.json"), help="results file ('' for none)")
    parser.add_argument("--plot", default=os.path.join(RESULTS, "allreduce.png"), help="PNG of algbw ('' for none)")
    args = parser.parse_args()
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    results = {}
    if args.busy:
        os.environ[SHARED_CORES] = "1"
    with busy_loops(args.busy) as rate:
        if args.busy:
            time.sleep(3.0)  # the loops' interpreters start up
        alone = rate(2.0) if args.busy else 0
        for world in (int(w) for w in args.ranks.split(",")):
            results[str(world)] = run(world, sizes, args.trials, args.gap_ms / 1e3, rate if args.busy else None)
            print(table(world, results[str(world)], args.trials) + "\n", flush=True)
            if args.busy:
                beside = results[str(world)][0]["busy_rate"]
                print(f"busy loops' throughput beside the {world} ranks: {beside / alone:.0%} of theirs with the ranks "
                      f"idle ({beside:.3g} vs {alone:.3g} iterations/s)\n", flush=True)
    save(results, args.trials, args.json, args.plot)


if __name__ == "__main__":
    main()

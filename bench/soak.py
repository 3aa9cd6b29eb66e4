"""A training job's collective mix, run fast for a long time on one CPU engine, to show that nothing a
group holds grows with the number of collectives: each rank's RSS, open descriptors, threads and mapped
shared-memory segments (memfd "cnccl") are sampled at intervals; at the end the counts must
equal those at the end of the warm-up (RSS within 32 MiB), both taken after an idle pause. The mix, on small tensors: allreduce on three wires (fp16, bf16,
mxfp8), a coalesced allreduce of three tensors, reduce_scatter, allgather, broadcast, an async allreduce
with wait(), and every 200 rounds a group created, used and destroyed.

Usage: python3 bench/soak.py [--engine shm|ucx|gloo] [--collectives 1000000] [--ranks 2] [--json FILE]
Prints the samples and the verdict; exits 1 when something grew. tests/python/test_soak.py runs it over
20,000 collectives on each engine.
"""

import argparse
import datetime
import json
import multiprocessing as mp
import os
import queue
import socket
import sys
import time

ENGINES = {"shm": {"CNCCL_CPU_ENGINE": "ucx", "CNCCL_SHM": "on"},
           "ucx": {"CNCCL_CPU_ENGINE": "ucx", "CNCCL_SHM": "off"},
           "gloo": {"CNCCL_CPU_ENGINE": "gloo"}}
COLLECTIVES_PER_ROUND = 10  # the mix below
GROUP_EVERY = 200  # rounds between a group made and destroyed
RSS_SLACK = 32 << 20
WARM_UP = 0.1  # of the run: caches and allocator pools fill
SAMPLES = 20
# The gloo engine's issuer starts completion threads on demand and ends one that idled 10 s
# (backend/composed/issuer.cpp, kIdle): the samples compared are taken after an idle pause longer than
# that, at the end of the warm-up and of the run.
SETTLE_S = {"gloo": 11.0}


def resources():
    """This process's RSS (bytes), open descriptors, threads and mapped cnccl segments."""
    with open("/proc/self/status") as f:
        rss = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))
    with open("/proc/self/maps") as f:
        segments = sum(1 for line in f if "memfd:cnccl" in line)
    return {"rss": rss, "fds": len(os.listdir("/proc/self/fd")), "threads": len(os.listdir("/proc/self/task")),
            "segments": segments}


def worker(rank, world, port, engine, rounds, out):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1", **ENGINES[engine])
    import torch
    import torch.distributed as dist

    import cnccl

    torch.set_num_threads(1)
    timeout = datetime.timedelta(seconds=120)
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timeout)
    wires = ({"wire_dtype": "fp16"}, {"wire_dtype": "bf16"}, {"wire_dtype": "mxfp8", "accumulate": "fp32"})
    groups = [dist.new_group(backend="cnccl", pg_options=cnccl.Options(min_bytes=0, **w), timeout=timeout)
              for w in wires]
    g = groups[0]
    x = torch.randn(4096)
    parts = [torch.randn(1024) for _ in range(3)]
    rs_in, rs_out = torch.randn(1024 * world), torch.empty(1024)
    ag_out = torch.empty(1024 * world)
    samples, every = [], max(1, rounds // SAMPLES)
    warm_round = int(WARM_UP * rounds)

    def settled_sample(i):
        dist.barrier()
        time.sleep(SETTLE_S.get(engine, 0.0))
        return {"collectives": (i + 1) * COLLECTIVES_PER_ROUND, "seconds": time.perf_counter() - start,
                "settled": True, **resources()}

    start = time.perf_counter()
    for i in range(rounds):
        for group in groups:
            dist.all_reduce(x, group=group)
        with dist._coalescing_manager(group=g):
            for p in parts:
                dist.all_reduce(p, group=g)
        dist.reduce_scatter_tensor(rs_out, rs_in, group=g)
        dist.all_gather_into_tensor(ag_out, rs_out, group=g)
        dist.broadcast(x, src=0, group=g)
        dist.all_reduce(x, group=g, async_op=True).wait()
        x.clamp_(-4, 4)  # sums of sums grow; keep them finite
        if i % GROUP_EVERY == GROUP_EVERY - 1:
            extra = dist.new_group(backend="cnccl", timeout=timeout)
            dist.all_reduce(x, group=extra)
            dist.destroy_process_group(extra)
        if i % every == 0 or i == rounds - 1:
            samples.append({"collectives": (i + 1) * COLLECTIVES_PER_ROUND, "seconds": time.perf_counter() - start,
                            **resources()})
        if i == warm_round or i == rounds - 1:
            samples.append(settled_sample(i))
    dist.barrier()
    out.put((rank, samples))
    dist.destroy_process_group()


def verdict(samples_by_rank):
    """What grew after the warm-up, per rank (empty: nothing)."""
    grew = []
    for rank, samples in sorted(samples_by_rank.items()):
        settled = [s for s in samples if s.get("settled")]
        warm, last = settled[0], settled[-1]
        if last["rss"] - warm["rss"] > RSS_SLACK:
            grew.append(f"rank {rank}: RSS {warm['rss'] >> 20} -> {last['rss'] >> 20} MiB")
        for what in ("fds", "threads", "segments"):
            if last[what] != warm[what]:
                grew.append(f"rank {rank}: {what} {warm[what]} -> {last[what]}")
    return grew


def run(engine, collectives, world, timeout_s):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    rounds = max(1, collectives // COLLECTIVES_PER_ROUND)
    procs = [ctx.Process(target=worker, args=(r, world, port, engine, rounds, out)) for r in range(world)]
    for p in procs:
        p.start()
    results = {}
    deadline = time.time() + timeout_s
    try:
        while len(results) < world:
            left = deadline - time.time()
            if left <= 0 or any(p.exitcode not in (None, 0) for p in procs):
                codes = [p.exitcode for p in procs]
                raise RuntimeError(f"soak on {engine}: ranks ended or ran past {timeout_s} s (exit codes {codes})")
            try:
                rank, samples = out.get(timeout=min(left, 1.0))
                results[rank] = samples
            except queue.Empty:  # look at the ranks again
                continue
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    return results


def report(engine, results):
    lines = [f"soak on {engine}: per sample, rank 0: collectives, seconds, RSS MiB, descriptors, threads, segments"]
    for s in results[0]:
        lines.append(f"  {s['collectives']:>9} {s['seconds']:8.1f} {s['rss'] / 2**20:8.1f} {s['fds']:5d} "
                     f"{s['threads']:4d} {s['segments']:4d}")
    for rank, samples in sorted(results.items()):
        first, last = samples[0], samples[-1]
        lines.append(f"rank {rank}: {last['collectives']} collectives in {last['seconds']:.1f} s "
                     f"({last['collectives'] / last['seconds']:.0f}/s); RSS {first['rss'] / 2**20:.1f} -> "
                     f"{last['rss'] / 2**20:.1f} MiB, descriptors {first['fds']} -> {last['fds']}, threads "
                     f"{first['threads']} -> {last['threads']}, segments {first['segments']} -> {last['segments']}")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--engine", default="shm", choices=list(ENGINES))
    ap.add_argument("--collectives", type=int, default=1_000_000)
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=7200, help="seconds for the whole run")
    ap.add_argument("--json", default="", help="write the samples here")
    args = ap.parse_args()
    results = run(args.engine, args.collectives, args.ranks, args.timeout)
    print(report(args.engine, results))
    grew = verdict(results)
    print(f"GOAL (after the first {WARM_UP:.0%}: RSS within {RSS_SLACK >> 20} MiB, descriptors, threads and segments "
          f"equal): {'met' if not grew else 'NOT MET: ' + '; '.join(grew)}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"engine": args.engine, "ranks": args.ranks, "samples": results, "grew": grew}, f, indent=1)
    sys.exit(1 if grew else 0)


if __name__ == "__main__":
    main()

"""Allreduce across a link: two hosts (or three, at a bridge) simulated on this machine (network namespaces
joined by a veth pair, each host in an IPC namespace of its own, tests/python/hosts.py), the link shaped with
`tc ... tbf rate R`, 1 and 2 ranks a host. Every wire of cnccl beside gloo fp32 and gloo running
`fp16_compress_hook`'s math (cast to fp16 and divide, allreduce on gloo, copy back), interleaved
trial after trial, medians (the min and the spread over trials beside them). Ratios are gloo fp32's time
over each variant's.

The link's bound for a variant is the bytes it put through the link (rank 0's host's veth counters,
the larger direction, headers included) over the rate; `fill` is that bound over the variant's time
(1.0: the link never idled). The bound of a wire of b bytes an element is about b/4 of fp32's.

Needs root, `ip` and `tc` (iproute2); prints why and exits 0 elsewhere. UCX runs over TCP only
(namespaces do not isolate UCX's shared-memory transports), as tests/python/test_multinode.py does.

Usage: python3 bench/link.py [--rates 1,2.5,10] [--ranks-per-host 1,2] [--hosts 2,3] [--sizes 1M,4M,16M,64M]
                             [--trials 5] [--wires W,...] [--json FILE] [--docs] [--docs-from JSON]
(--docs rewrites docs/benchmarks.md's link section between its markers.) --wires may also name the 4-bit
matrix's variants (MATRIX: -sr stochastic rounding, -had the block rotation), which the default leaves out.
The full run (every default) saves its results to bench/results/link.json, which --docs-from reads; a
narrower run saves only to a --json it is given, so it never writes over the full run's.
"""

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from typing import NamedTuple

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tests", "python"))

import scale_model  # noqa: E402  (bench/, beside this file)
import sections  # noqa: E402
from hosts import Nodes, unavailable  # noqa: E402

RESULTS = os.path.join(HERE, "results")
GLOO, HOOK = "gloo-fp32", "gloo-hook"
# cnccl's variants: every wire, each with the options it needs (README, options table).
WIRES = {
    "none": dict(wire_dtype="none"),
    "fp16": dict(wire_dtype="fp16"),
    "bf16": dict(wire_dtype="bf16"),
    "fp16-acc32": dict(wire_dtype="fp16", accumulate="fp32"),
    "fp16-pow2": dict(wire_dtype="fp16", accumulate="fp32", scaling="pow2"),
    "e4m3": dict(wire_dtype="e4m3", accumulate="fp32", scaling="pow2"),
    "e5m2": dict(wire_dtype="e5m2", accumulate="fp32", scaling="pow2"),
    "mxfp8": dict(wire_dtype="mxfp8", accumulate="fp32"),
    "mxfp8_e5m2": dict(wire_dtype="mxfp8_e5m2", accumulate="fp32"),
    "mxfp4": dict(wire_dtype="mxfp4", accumulate="fp32"),
    "nvfp4": dict(wire_dtype="nvfp4", accumulate="fp32"),
    # A wire per level (inside a host | across hosts): at one rank a host there is no level inside, and the
    # group refuses, so these run at 2 ranks a host only.
    "fp16|mxfp8": dict(wire_dtype="fp16", inter_host_wire="mxfp8", accumulate="fp32"),
    "none|mxfp8": dict(wire_dtype="none", inter_host_wire="mxfp8", accumulate="fp32"),
    "fp16|mxfp4": dict(wire_dtype="fp16", inter_host_wire="mxfp4", accumulate="fp32"),
    "fp16|nvfp4": dict(wire_dtype="fp16", inter_host_wire="nvfp4", accumulate="fp32"),
    "none|nvfp4-sr": dict(wire_dtype="none", inter_host_wire="nvfp4", accumulate="fp32", rounding="sr"),
}
# The 4-bit matrix (bench/accuracy.py --seeds): stochastic rounding (-sr) and the block rotation (-had) on
# the 4-bit wires, and the rotation on mxfp8. Run when --wires names them.
MATRIX = {f"{wire}{'-sr' if sr else ''}{'-had' if rotated else ''}": dict(
    WIRES[wire], **({"rounding": "sr"} if sr else {}), **({"rotation": "hadamard"} if rotated else {}))
    for wire in ("mxfp8", "mxfp4", "nvfp4") for sr in (False, True) for rotated in (False, True)
    if (sr or rotated) and not (wire == "mxfp8" and sr)}
DEFAULT_WIRES = list(WIRES)
WIRES.update(MATRIX)
PER_LEVEL = [w for w in WIRES if "|" in w]
# (hosts, ranks a host, Gbit/s, size, wire, goal): the goal is a ratio to gloo fp32 at least, or the name of
# the variant it must be at least as fast as (a wire per level against the flat wire with its wire across),
# or (name, fraction): at least that fraction of the variant's speed (nvfp4 against mxfp4).
M64 = 64 << 20
GOALS = [(2, 1, 2.5, M64, "none", 0.95), (2, 1, 2.5, M64, "fp16", 1.9), (2, 1, 2.5, M64, "e4m3", 3.5),
         (2, 1, 2.5, M64, "mxfp8", 3.5), (2, 1, 2.5, M64, "mxfp4", 6.0),
         (2, 1, 10, M64, "none", 0.95), (2, 1, 10, M64, "fp16", 1.8), (2, 1, 10, M64, "mxfp8", 2.5),
         (2, 1, 10, M64, "mxfp4", 3.0),
         (2, 2, 1, M64, "fp16|mxfp8", 5.0), (2, 2, 1, M64, "fp16|mxfp4", 9.5),
         (2, 2, 2.5, M64, "fp16|mxfp8", "mxfp8"), (2, 2, 2.5, M64, "fp16|mxfp4", "mxfp4"),
         (3, 2, 1, M64, "fp16|mxfp8", 4.0),
         (2, 1, 1, M64, "nvfp4", ("mxfp4", 0.9)), (2, 1, 2.5, M64, "nvfp4", ("mxfp4", 0.9)),
         # The most accurate 4-bit combination (docs/numerics.md, "NVFP4 blocks"), against mxfp4.
         (2, 1, 1, M64, "nvfp4-sr", ("mxfp4", 0.9)), (2, 1, 2.5, M64, "nvfp4-sr", ("mxfp4", 0.9))]
JOB_TIMEOUT = 900


def parse_size(s):
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(float(s[:-1]) * units[s[-1].upper()]) if s[-1].upper() in units else int(s)


def label(nbytes):
    return f"{nbytes >> 20}M" if nbytes >= 1 << 20 else f"{nbytes >> 10}K"


# A TCP/IPv4 frame's headers as the veth counts them: Ethernet 14, IP 20, TCP 20 and Linux's timestamp
# option 12. A segmentation-offload packet carries them once, however many segments it becomes.
FRAME_HEADER_BYTES = 66


def link_bytes(dev):
    """Bytes sent and received by the veth end, and what they carried: the bytes less each packet's headers."""
    stats = f"/sys/class/net/{dev}/statistics/"
    read = {name: int(open(stats + name).read()) for name in ("tx_bytes", "rx_bytes", "tx_packets", "rx_packets")}
    return [read["tx_bytes"], read["rx_bytes"], read["tx_bytes"] - FRAME_HEADER_BYTES * read["tx_packets"],
            read["rx_bytes"] - FRAME_HEADER_BYTES * read["rx_packets"]]


PHASES = ("cast", "reduce", "transfer", "restore")


def rank_groups(wires):
    """This rank of a job on the simulated hosts: one thread pinned to a core, the gloo world (gloo fp32 and the
    hook run on it) and a cnccl group for each of `wires`. Returns the rank, the world size and the groups."""
    import torch
    import torch.distributed as dist

    import cnccl

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.set_num_threads(1)
    os.sched_setaffinity(0, {rank % os.cpu_count()})
    dist.init_process_group("gloo")
    groups = {GLOO: dist.group.WORLD, HOOK: dist.group.WORLD}
    for wire in wires:
        if wire not in groups:
            groups[wire] = dist.new_group(backend="cnccl", pg_options=cnccl.Options(**WIRES[wire]))
    return rank, world, groups


def worker(sizes, trials, wires, out):
    """One rank, inside its host's namespaces; rank 0 writes the rows to `out`."""
    import torch
    import torch.distributed as dist

    import cnccl

    if int(os.environ["LOCAL_WORLD_SIZE"]) == 1:
        wires = [w for w in wires if w not in PER_LEVEL]
    rank, world, groups = rank_groups(wires)
    dev = os.environ["CNCCL_BENCH_LINK_DEV"]
    rows = []
    for nbytes in sizes:
        src = torch.randn(nbytes // 4)
        x = src.clone()
        reps = max(1, (8 << 20) // nbytes)
        times = {name: [] for name in groups}
        crossed = {name: [0, 0] for name in groups}
        carried = {name: [0, 0] for name in groups}
        phases = {name: dict.fromkeys(PHASES, 0.0) for name in wires}
        cpu = dict.fromkeys(groups, 0.0)  # this process's CPU seconds a call, every thread's
        for trial in range(trials + 1):  # the first round warms every variant up
            for name, group in groups.items():
                # The counters are read before the barrier and after another: a peer starts sending as
                # soon as it leaves the first barrier, and may still be sending when this rank returns.
                before = link_bytes(dev)
                dist.barrier(group=dist.group.WORLD)
                stats = cnccl.stats(group) if name in phases else None
                elapsed = used = 0.0
                for _ in range(reps):
                    # Each call sums the same input (summed in place, fp16 would overflow a few calls on),
                    # restored outside the time.
                    x.copy_(src)
                    t0, c0 = time.perf_counter(), time.process_time()
                    if name == HOOK:
                        wire = x.to(torch.float16).div_(world)
                        dist.all_reduce(wire)
                        x.copy_(wire)
                    else:
                        dist.all_reduce(x, group=group)
                    elapsed, used = elapsed + time.perf_counter() - t0, used + time.process_time() - c0
                dist.barrier(group=dist.group.WORLD)
                after = link_bytes(dev)
                if trial > 0:
                    times[name].append(elapsed / reps)
                    cpu[name] += used / (reps * trials)
                    for i in range(2):
                        crossed[name][i] += (after[i] - before[i]) / (reps * trials)
                        carried[name][i] += (after[2 + i] - before[2 + i]) / (reps * trials)
                    if stats is not None:
                        now = cnccl.stats(group)
                        for p in PHASES:
                            phases[name][p] += (now[p + "_ns"] - stats[p + "_ns"]) / 1e9 / (reps * trials)
                src.normal_()
        rows.append({"bytes": nbytes, "seconds": {n: statistics.median(t) for n, t in times.items()},
                     "seconds_min": {n: min(t) for n, t in times.items()},
                     "spread": {n: (max(t) - min(t)) / statistics.median(t) for n, t in times.items()},
                     "link_bytes": crossed, "link_payload": carried, "phases_s": phases,
                     "cpu_s": cpu, "ranks": world, "cores": os.cpu_count()})
    if rank == 0:
        transport = cnccl.config(groups[wires[0]])["cpu_transport"]
        with open(out, "w") as f:
            json.dump({"rows": rows, "cpu_transport": transport}, f)
    dist.destroy_process_group()


def job(nodes, per_host, sizes, trials, wires, logdir):
    """Runs one job of hosts x per_host ranks on the nodes as they are shaped now; returns rank 0's rows. Each
    host's ranks are one torchrun's, in one IPC namespace: they share memory, as ranks of a machine do."""
    out = os.path.join(logdir, f"rows-{per_host}.json")
    if os.path.exists(out):
        os.remove(out)
    args = [os.path.abspath(__file__), "--worker", "--sizes", ",".join(str(s) for s in sizes), "--trials", str(trials),
            "--wires", ",".join(wires), "--out", out]
    codes, logs = nodes.torchrun(per_host, args, logdir, JOB_TIMEOUT,
                                 node_env=lambda node: {"CNCCL_BENCH_LINK_DEV": nodes.dev[node]})
    if codes != [0] * len(logs):
        tails = "\n".join(f"--- {path}\n" + open(path).read()[-3000:] for path in logs)
        raise SystemExit(f"link job failed (exit codes {codes}):\n{tails}")
    nodes.procs.clear()
    with open(out) as f:
        return json.load(f)


def schedule_of(name, hosts, per_host, nbytes):
    """The schedule bench/scale_model.py models for a variant, and its wire's bytes an element across hosts.
    gloo's allreduce is a ring (gloo/allreduce.cc), on fp32 or, for the hook, on fp16."""
    if name in (GLOO, HOOK):
        return "ring", 4.0 if name == GLOO else 2.0
    options = WIRES[name]
    across = options.get("inter_host_wire", options["wire_dtype"])
    schedule = scale_model.cnccl_schedule(options["wire_dtype"], options.get("accumulate", "wire"),
                                          options.get("scaling", "none"), hosts * per_host, per_host, nbytes,
                                          inter_host_wire=across)
    return schedule, scale_model.WIRE_BYTES[across]


def derive(rows, gbit, hosts, per_host):
    """Adds ratios to gloo fp32, each variant's link bound and fill, the cores' bound, and the scale model's
    time: its schedule's bytes at the rate and the cores' bound, overlapped as the schedule pipelines."""
    for row in rows:
        t = row["seconds"]
        row["ratio"] = {n: t[GLOO] / t[n] for n in t}
        row["bound_s"] = {n: max(b) * 8 / (gbit * 1e9) for n, b in row["link_bytes"].items()}
        row["fill"] = {n: row["bound_s"][n] / t[n] for n in t}
        row["cores_s"] = {n: row["cpu_s"][n] * row["ranks"] / row["cores"] for n in t}
        row["model_s"] = {}
        for n in t:
            schedule, b = schedule_of(n, hosts, per_host, row["bytes"])
            row["model_s"][n] = scale_model.predict(schedule, hosts * per_host, per_host, row["bytes"] // 4, b, gbit,
                                                    row["cores_s"][n], burst_bytes=Nodes.burst_bytes(gbit))
    return rows


def model_misses(results, within=0.2):
    """The cells whose measured time the scale model misses by more than `within`, and how many cells."""
    misses, cells = [], 0
    for key, rows in results.items():
        for row in rows:
            for n, t in row["seconds"].items():
                cells += 1
                if abs(row["model_s"][n] / t - 1) > within:
                    misses.append((key, label(row["bytes"]), n, t, row["model_s"][n]))
    return misses, cells


def table(hosts, per_host, gbit, rows, trials, transport):
    variants = list(rows[0]["seconds"])
    lines = [f"{hosts} hosts x {per_host} rank{'s' if per_host > 1 else ''}, {gbit:g} Gbit/s, fp32 SUM allreduce, "
             f"median "
             f"of {trials}; cnccl's transport: {transport}. Each cell: ms, ratio to gloo fp32, fill of the link "
             "(its bound, bytes through the link / rate, over the time)"]
    lines.append(f"{'size':>5} " + " ".join(f"{n:>20}" for n in variants))
    for row in rows:
        cells = " ".join(f"{row['seconds'][n] * 1e3:7.1f} {row['ratio'][n]:5.2f}x {row['fill'][n]:4.2f}"
                         for n in variants)
        lines.append(f"{label(row['bytes']):>5} {cells}")
    lines.append("min over trials, ms, and the spread (max - min) / median")
    for row in rows:
        lines.append(f"{label(row['bytes']):>5} " + " ".join(
            f"{row['seconds_min'][n] * 1e3:12.1f} {row['spread'][n]:6.1%}" for n in variants))
    lines.append("the scale model's time, ms (bench/scale_model.py: the schedule's bytes at the rate and the cores' "
                 "bound below, overlapped as it pipelines)")
    for row in rows:
        lines.append(f"{label(row['bytes']):>5} " + " ".join(f"{row['model_s'][n] * 1e3:20.1f}" for n in variants))
    big = rows[-1]
    lines.append(f"bytes through the link per call at {label(big['bytes'])} (larger direction, MiB): " +
                 ", ".join(f"{n} {max(big['link_bytes'][n]) / 2**20:.1f}" for n in variants))
    lines.append("the cores' bound, ms: rank 0's CPU time a call (every thread) x ranks / cores, each rank taken "
                 "to use as much (every host is on this machine)")
    for row in rows:
        lines.append(f"{label(row['bytes']):>5} " + ", ".join(
            f"{n} {row['cpu_s'][n] * row['ranks'] / row['cores'] * 1e3:.1f}" for n in variants))
    lines.append("rank 0's time per call by phase at each size, ms (cnccl.stats: " + "/".join(PHASES) + ")")
    for row in rows:
        lines.append(f"{label(row['bytes']):>5} " + ", ".join(
            f"{n} " + "/".join(f"{row['phases_s'][n][p] * 1e3:.1f}" for p in PHASES) for n in row["phases_s"]))
    return "\n".join(lines)


class Goal(NamedTuple):
    """A goal of GOALS, and what its run measured: value to cores_s are None where its configuration did not run."""
    what: str
    hosts: int
    per_host: int
    gbit: float
    size: int
    wire: str
    need: object  # the ratio to gloo fp32 it must reach (where it did not run: GOALS' target)
    value: float = None  # the measured ratio to gloo fp32
    fill: float = None
    met: bool = None
    seconds: float = None  # measured, the scale model's, the link's bound, the cores' bound
    model_s: float = None
    bound_s: float = None
    cores_s: float = None


def goals(results):
    out = []
    for hosts, per_host, gbit, size, wire, target in GOALS:
        rows = results.get(f"{hosts}x{per_host}x{gbit:g}")
        row = next((r for r in rows or [] if r["bytes"] == size), None)
        what = f"{hosts} hosts x {per_host}, {gbit:g} Gbit/s, {label(size)}, cnccl {wire} vs gloo fp32"
        base, fraction = (target, 1.0) if isinstance(target, str) else target if isinstance(target, tuple) else (None, 0)
        if base:
            what += f" (at least flat {base}'s)" if fraction == 1.0 else f" (at least {fraction:g}x {base}'s)"
        goal = (what, hosts, per_host, gbit, size, wire)
        if row is None or wire not in row["ratio"] or (base and base not in row["ratio"]):
            out.append(Goal(*goal, target))
            continue
        need = row["ratio"][base] * fraction if base else target
        out.append(Goal(*goal, need, row["ratio"][wire], row["fill"][wire], row["ratio"][wire] >= need,
                        row["seconds"][wire], row["model_s"][wire], row["bound_s"][wire], row["cores_s"][wire]))
    return out


def cell(text):
    """A markdown table cell: a wire per level's "|" escaped."""
    return text.replace("|", "\\|")


def docs_section(data):
    res = data["results"]
    m = data["machine"]
    lines = [f"Regenerate with `sudo python3 bench/link.py --docs` ({m['cores']}-core machine, "
             f"{m['cpu']}, {m['date']}, torch {m['torch']}; medians of {data['trials']} interleaved trials). "
             "Hosts are network namespaces joined by a veth pair (three: each by a veth to a bridge), each end shaped "
             "with `tc tbf`; UCX over TCP. "
             "Each cell is the ratio to gloo fp32 (higher is faster) and, in brackets, the link's fill: the time the "
             "variant's bytes need at the rate over the time it took (above 1 at small sizes: the token bucket lets a "
             "burst of 1 ms of the rate through at once).", ""]
    lines += ["| goal | measured | target | fill | ms: measured / model / link / cores | |",
              "|---|---|---|---|---|---|"]
    for g in goals(res):
        if g.value is None:
            need = f"{g.need[1]:g}x {g.need[0]}'s" if isinstance(g.need, tuple) else g.need
            lines.append(f"| {cell(g.what)} | | {need} | | | not run |")
            continue
        lines.append(f"| {cell(g.what)} | {g.value:.2f}x | >= {g.need:.2f}x | {g.fill:.2f} | {g.seconds * 1e3:.0f} / "
                     f"{g.model_s * 1e3:.0f} / {g.bound_s * 1e3:.0f} / {g.cores_s * 1e3:.0f} | "
                     f"{'met' if g.met else 'not met'} |")
    misses, cells = model_misses(res)
    large = [m for m in misses if m[1] in ("16M", "64M")]
    large_cells = sum(1 for rows in res.values() for row in rows if label(row["bytes"]) in ("16M", "64M")
                      for _ in row["seconds"])
    worst = sorted(large, key=lambda m: -abs(m[4] / m[3] - 1))[:4]
    lines += ["", f"The scale model's time is within 20% of the measured one in {cells - len(misses)} of {cells} cells, "
              f"{large_cells - len(large)} of {large_cells} at 16-64 MiB (below that a message's latency and UCX's "
              "per-message cost, which it leaves out, dominate)" +
              ("; the largest misses there: " + "; ".join(f"{k} {size} {n} ({t * 1e3:.0f} ms, model {m * 1e3:.0f})"
                                                          for k, size, n, t, m in worst) if worst else "") + "."]
    for key, rows in res.items():
        hosts, per_host, gbit = key.split("x")
        variants = list(rows[0]["seconds"])
        lines += ["", f"{hosts} hosts x {per_host} rank{'s' if per_host != '1' else ''} a host, {gbit} Gbit/s", "",
                  "| size | " + " | ".join(cell(n) for n in variants) + " |", "|---" * (len(variants) + 1) + "|"]
        for row in rows:
            lines.append(f"| {label(row['bytes'])} | " +
                         " | ".join(f"{row['ratio'][n]:.2f}x ({row['fill'][n]:.2f})" for n in variants) + " |")
        if int(per_host) > 1:
            # Where the machine's cores bind (every host is on it), the link cannot be filled.
            big = rows[-1]
            lines += ["", f"At {label(big['bytes'])}, ms: measured / the scale model's / the link's bound / the cores' "
                      "bound (rank 0's CPU time a call x ranks / cores): " + ", ".join(
                          f"{n} {big['seconds'][n] * 1e3:.0f} / {big['model_s'][n] * 1e3:.0f} / "
                          f"{big['bound_s'][n] * 1e3:.0f} / {big['cores_s'][n] * 1e3:.0f}" for n in variants)]
    return "\n".join(lines)


def machine():
    import platform

    import torch

    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")),
               platform.machine())
    return {"cpu": cpu, "cores": os.cpu_count(), "torch": torch.__version__, "date": time.strftime("%Y-%m-%d")}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rates", default="1,2.5,10", help="Gbit/s, comma-separated")
    parser.add_argument("--ranks-per-host", default="1,2")
    parser.add_argument("--hosts", default="2,3",
                        help="hosts a job, comma-separated; more than 2 meet at a bridge (a switch), as in test_levels")
    parser.add_argument("--three-hosts-at", default="1",
                        help="with --hosts 3: only these rates (Gbit/s), at the largest ranks a host")
    parser.add_argument("--sizes", default="1M,4M,16M,64M")
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--wires", default=",".join(DEFAULT_WIRES),
                        help=f"cnccl's variants to run beside gloo's; beside the default ones: {', '.join(MATRIX)}")
    parser.add_argument("--json", help="where to save the results (default: bench/results/link.json for the full run)")
    parser.add_argument("--docs", action="store_true", help="rewrite docs/benchmarks.md's link section")
    parser.add_argument("--docs-from", metavar="JSON", help="rewrite it from an earlier run's --json, running nothing")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    full_run = all(getattr(args, a.dest) == a.default for a in parser._actions if a.dest in
                   ("rates", "ranks_per_host", "hosts", "three_hosts_at", "sizes", "trials", "wires"))
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    wires = args.wires.split(",")
    unknown = [w for w in wires if w not in WIRES]
    if unknown:
        sys.exit(f"unknown wires {unknown}; known: {', '.join(WIRES)}")
    if args.worker:
        worker(sizes, args.trials, wires, args.out)
        return
    if args.docs_from:
        with open(args.docs_from) as f:
            return sections.rewrite(sections.BENCHMARKS, "link", docs_section(json.load(f)))
    why = unavailable(("ip", "tc"))
    if why:
        print(f"bench/link.py skipped: {why}")
        return
    results = {}
    for hosts in (int(h) for h in args.hosts.split(",")):
        nodes = Nodes(hosts)
        per_hosts = [int(p) for p in args.ranks_per_host.split(",")]
        rates = [float(r) for r in args.rates.split(",")]
        if hosts > 2:  # 3 x L ranks on this machine's cores: one point, at the most ranks a host
            per_hosts, rates = per_hosts[-1:], [float(r) for r in args.three_hosts_at.split(",")]
        try:
            with tempfile.TemporaryDirectory(prefix="cnccl-link-") as logdir:
                for per_host in per_hosts:
                    for gbit in rates:
                        nodes.shape(gbit)
                        out = job(nodes, per_host, sizes, args.trials, wires, logdir)
                        rows = derive(out["rows"], gbit, hosts, per_host)
                        results[f"{hosts}x{per_host}x{gbit:g}"] = rows
                        print(table(hosts, per_host, gbit, rows, args.trials, out["cpu_transport"]) + "\n",
                              flush=True)
        finally:
            nodes.close()
    data = {"machine": machine(), "trials": args.trials, "results": results}
    for g in goals(results):
        if g.value is None:
            print(f"{g.what}: not run (its configuration was not in this run's --hosts/--rates/--sizes/--wires)")
            continue
        print(f"{g.what}: {g.value:.2f}x (goal >= {g.need:.2f}x, fill {g.fill:.2f}; ms: {g.seconds * 1e3:.1f}, "
              f"model {g.model_s * 1e3:.1f}, link {g.bound_s * 1e3:.1f}, cores {g.cores_s * 1e3:.1f}): "
              f"{'met' if g.met else 'NOT MET'}")
    misses, cells = model_misses(results)
    print(f"scale model within 20% in {cells - len(misses)} of {cells} cells; misses: " +
          "; ".join(f"{k} {size} {n} {t * 1e3:.1f} ms (model {m * 1e3:.1f})" for k, size, n, t, m in misses))
    saved = args.json or (os.path.join(RESULTS, "link.json") if full_run else None)
    if saved:
        os.makedirs(os.path.dirname(os.path.abspath(saved)), exist_ok=True)
        with open(saved, "w") as f:
            json.dump(data, f, indent=1)
    else:
        print("results not saved: narrower than the full run, which bench/results/link.json keeps (--json FILE saves them)")
    if args.docs:
        sections.rewrite(sections.BENCHMARKS, "link", docs_section(data))


if __name__ == "__main__":
    main()

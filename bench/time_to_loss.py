"""Time to a loss over a link: the same DDP training on each backend and wire, two hosts simulated on this
machine as bench/link.py simulates them (network and IPC namespaces, a veth shaped with `tc tbf`,
tests/python/hosts.py), 2 hosts x 1 rank and 2 hosts x 2 ranks, at 1, 2.5 and 10 Gbit/s. It answers what an
allreduce ratio does not: DDP overlaps its buckets' allreduces with the backward pass, and a wire that costs
accuracy may need more steps.

Data: a character-level language model on CPython's own standard library, the `.py` files under
`sysconfig.get_paths()["stdlib"]` (no site-packages, no tests), sorted by path and joined: real text on every
machine with Python, no download. Training draws from its first 90%; the loss that counts is measured on a
fixed held-out set from the last 10% (EVAL_SEQS sequences), every EVAL_EVERY steps, outside the timed wall
clock. Model: a GPT-style decoder (bytes in, bytes out; 2 blocks of width 512, 6.6 M parameters, 25.2 MiB
of fp32 gradients a step), sized so that its gradients make the link matter (at 1 Gbit/s gloo's fp32
allreduce of them takes about 3.6 times the step's compute on one of these cores) while a step fits 2
cores: one sequence of 64 bytes a rank. Adam, its rate on a cosine from LR down to a tenth at the last step.

Every run of a job starts from the same initialization and sees the same batches (both from the seed), on
the same processes, one after another: gloo fp32, gloo with `fp16_compress_hook`, cnccl's wires. Rank 0
records per step the training loss (the ranks' mean), the wall time and the bytes through its host's veth
(the busier direction, headers included), and the held-out loss at each evaluation. The target is gloo
fp32's held-out loss at its last step; a run's time to the loss is the wall time at which its held-out loss
first reaches the target (linear between evaluations), the same rule for every run. A run that has not
reached it at gloo's last step goes on at the last rate, up to half as many steps again (at least one
evaluation's), and reports how many more steps it needed.

Needs root, `ip` and `tc`; prints why and exits 0 elsewhere. Writes bench/results/time_to_loss.json and
time_to_loss.png. `--quick` (CI): one link, 2 x 1 and a short 2 x 2, one seed, a few steps.

Usage: sudo python3 bench/time_to_loss.py [--quick] [--rates 1,2.5,10] [--ranks-per-host 1,2] [--seeds 3]
                                          [--steps N] [--json FILE] [--png FILE] [--from JSON]
"""

import argparse
import glob
import hashlib
import json
import math
import os
import statistics
import sys
import sysconfig
import tempfile
import time
from typing import NamedTuple

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests", "python"))

import link  # noqa: E402  (bench/, beside this file)
import sections  # noqa: E402
from hosts import Nodes, unavailable  # noqa: E402

RESULTS = os.path.join(HERE, "results")
GLOO, HOOK = link.GLOO, link.HOOK
FLAT = [GLOO, HOOK, "none", "fp16", "bf16", "mxfp8", "mxfp4"]
PER_LEVEL = ["fp16|mxfp8"]  # fp16 inside a host, mxfp8 across: at 2 ranks a host only
WIDTH, BLOCKS, HEADS, CONTEXT, BATCH = 512, 2, 8, 64, 1
LR, EXTRA = 2e-3, 0.5
EVAL_EVERY, EVAL_SEQS = 8, 8
COMPUTE_STEPS = 10  # steps without communication, timed on every rank at once: the step's compute
JOB_TIMEOUT = 3600
# (ranks a host, Gbit/s, wire, the most its time to gloo fp32's final loss may be, as a share of gloo's)
GOALS = [(1, 1, "fp16", 0.6), (1, 1, "mxfp8", 0.4), (1, 2.5, "fp16", 0.7), (1, 2.5, "mxfp8", 0.5)] + \
        [(1, 10, w, 1.05) for w in FLAT[2:]]
SAME_LOSS = ["fp16", "bf16", "mxfp8"]  # final losses within the seeds' spread of gloo fp32's


def corpus():
    """The standard library's source as bytes, and what names it."""
    root = sysconfig.get_paths()["stdlib"]
    files = sorted(f for f in glob.glob(os.path.join(root, "**", "*.py"), recursive=True)
                   if "site-packages" not in f and f"{os.sep}test" not in f[len(root):])
    data = b"".join(open(f, "rb").read() for f in files)
    return data, {"source": "CPython standard library .py files (no site-packages, no tests)", "root": root,
                  "python": sys.version.split()[0], "files": len(files), "bytes": len(data),
                  "sha256": hashlib.sha256(data).hexdigest()[:16]}


def make_model(seed):
    import torch
    from torch import nn
    import torch.nn.functional as F

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(WIDTH), nn.LayerNorm(WIDTH)
            self.qkv, self.proj = nn.Linear(WIDTH, 3 * WIDTH), nn.Linear(WIDTH, WIDTH)
            self.mlp = nn.Sequential(nn.Linear(WIDTH, 4 * WIDTH), nn.GELU(), nn.Linear(4 * WIDTH, WIDTH))

        def forward(self, x):
            b, t, _ = x.shape
            q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, HEADS, WIDTH // HEADS).permute(2, 0, 3, 1, 4)
            x = x + self.proj(F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, -1))
            return x + self.mlp(self.ln2(x))

    class CharGPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.tok, self.pos = nn.Embedding(256, WIDTH), nn.Embedding(CONTEXT, WIDTH)
            self.blocks = nn.Sequential(*[Block() for _ in range(BLOCKS)])
            self.ln, self.head = nn.LayerNorm(WIDTH), nn.Linear(WIDTH, 256)

        def forward(self, idx):
            x = self.tok(idx) + self.pos(torch.arange(idx.shape[1]))
            return self.head(self.ln(self.blocks(x)))

    torch.manual_seed(seed)
    return CharGPT()


def split(data):
    """The bytes training draws from, and the held-out set: EVAL_SEQS sequences of the last 10%, fixed."""
    import torch

    cut = len(data) * 9 // 10
    held = torch.frombuffer(bytearray(data[cut:]), dtype=torch.uint8)
    starts = torch.randint(0, len(held) - CONTEXT - 1, (EVAL_SEQS,), generator=torch.Generator().manual_seed(90))
    chunk = torch.stack([held[s:s + CONTEXT + 1] for s in starts.tolist()]).long()
    return data[:cut], (chunk[:, :-1], chunk[:, 1:])


def batches(data, seed, rank, world):
    """Step s's batch for `rank`: this rank's share of the global batch the seed draws, the same on every run."""
    import torch

    text = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    gen = torch.Generator().manual_seed(seed)
    while True:
        starts = torch.randint(0, len(text) - CONTEXT - 1, (world * BATCH,), generator=gen)[rank * BATCH:(rank + 1) * BATCH]
        chunk = torch.stack([text[s:s + CONTEXT + 1] for s in starts.tolist()]).long()
        yield chunk[:, :-1], chunk[:, 1:]


def reached(evals, target):
    """When the held-out loss first reached `target`: (wall seconds, linear between the evaluations around it,
    and the step of the evaluation that reached it), or None."""
    for k, (step, wall, loss) in enumerate(evals):
        if loss <= target:
            if k == 0:
                return wall, step
            _, wall0, loss0 = evals[k - 1]
            return wall0 + (wall - wall0) * (loss0 - target) / (loss0 - loss), step
    return None


def rate(step, steps):
    """The learning rate at `step`: a cosine from LR to LR / 10 over `steps`, then LR / 10."""
    return LR / 10 + (LR - LR / 10) * 0.5 * (1 + math.cos(math.pi * min(step, steps) / steps))


def worker(runs, seeds, steps, out):
    """One rank, inside its host's namespaces; rank 0 writes the records to `out`."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.nn.parallel import DistributedDataParallel as DDP

    rank, world, groups = link.rank_groups(runs)
    dev = os.environ["CNCCL_BENCH_LINK_DEV"]
    data, held_out = split(corpus()[0])

    def loss_of(model, x, y):
        return F.cross_entropy(model(x).view(-1, 256), y.reshape(-1))

    # The step's compute: every rank at once, as in training, without communication.
    model, batch = make_model(0), batches(data, 0, rank, world)
    opt = torch.optim.Adam(model.parameters(), lr=LR)
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(COMPUTE_STEPS):
        x, y = next(batch)
        opt.zero_grad(set_to_none=True)
        loss_of(model, x, y).backward()
        opt.step()
    compute_s = (time.perf_counter() - t0) / COMPUTE_STEPS
    params = sum(p.numel() for p in model.parameters())

    records = []
    for seed in seeds:
        for run in runs:
            model = DDP(make_model(seed), process_group=groups[run])
            if run == HOOK:
                model.register_comm_hook(groups[run], default_hooks.fp16_compress_hook)
            opt = torch.optim.Adam(model.parameters(), lr=LR)
            batch = batches(data, seed, rank, world)
            target = next((r["evals"][-1][2] for r in records if r["seed"] == seed and r["run"] == GLOO), None)
            losses, wall, crossed, evals = [], [], [], []
            dist.barrier()
            start, counted, paused = time.perf_counter(), link.link_bytes(dev), 0.0

            def evaluate(step):
                # Every rank evaluates its parameters (DDP keeps them equal) on the same set; the time until
                # the slowest rank is done is left out of the wall clock.
                nonlocal paused
                t = time.perf_counter()
                with torch.no_grad():
                    evals.append([step, t - start - paused, loss_of(model.module, *held_out).item()])
                dist.barrier()
                paused += time.perf_counter() - t

            def done(step):
                # Rank 0's evaluation decides for every rank: a rank that left the loop alone would leave the
                # others waiting in the next allreduce.
                stop = torch.tensor([step >= steps and (target is None or evals[-1][2] <= target)], dtype=torch.int32)
                dist.broadcast(stop, 0)
                return bool(stop.item())

            evaluate(0)
            for step in range(steps + max(EVAL_EVERY, int(steps * EXTRA) // EVAL_EVERY * EVAL_EVERY)):
                for group in opt.param_groups:
                    group["lr"] = rate(step, steps)
                x, y = next(batch)
                opt.zero_grad(set_to_none=True)
                loss = loss_of(model, x, y)
                loss.backward()
                opt.step()
                # The ranks' mean training loss, on gloo for every run (4 bytes).
                mean = loss.detach().reshape(1) / world
                dist.all_reduce(mean)
                losses.append(mean.item())
                wall.append(time.perf_counter() - start - paused)
                now = link.link_bytes(dev)
                crossed.append(max(now[0] - counted[0], now[1] - counted[1]))
                if (step + 1) % EVAL_EVERY == 0:
                    evaluate(step + 1)
                    if done(step + 1):
                        break
            records.append({"seed": seed, "run": run, "losses": losses, "wall_s": wall, "link_bytes": crossed,
                            "evals": evals})
            del model, opt
    if rank == 0:
        with open(out, "w") as f:
            json.dump({"records": records, "compute_s": compute_s, "params": params}, f)
    dist.destroy_process_group()


def job(nodes, per_host, runs, seeds, steps, logdir):
    """One job of 2 x per_host ranks on the link as it is shaped now; returns rank 0's records."""
    out = os.path.join(logdir, f"records-{per_host}.json")
    if os.path.exists(out):
        os.remove(out)
    args = [os.path.abspath(__file__), "--worker", "--runs", ",".join(runs), "--seeds", ",".join(map(str, seeds)),
            "--steps", str(steps), "--out", out]
    codes, logs = nodes.torchrun(per_host, args, logdir, JOB_TIMEOUT,
                                 node_env=lambda node: {"CNCCL_BENCH_LINK_DEV": nodes.dev[node]})
    nodes.procs.clear()
    if codes != [0] * len(logs):
        tails = "\n".join(f"--- {path}\n" + open(path).read()[-3000:] for path in logs)
        raise SystemExit(f"time-to-loss job failed (exit codes {codes}):\n{tails}")
    with open(out) as f:
        return json.load(f)


def mean_sd(values):
    return statistics.mean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def final_eval(rec, steps):
    """The held-out loss at gloo fp32's last step."""
    return next(loss for step, _, loss in rec["evals"] if step == steps)


def summarize(result, gbit, steps):
    """Per run: time to gloo fp32's final held-out loss over gloo's (per seed), the steps past gloo's it
    needed, its held-out loss at gloo's last step (mean and sd over seeds), its median step time over
    gloo's, and what bounds the step: its compute (measured without communication), the link (its bytes a
    step at the rate) and the overlap."""
    records = result["records"]
    by = {(r["run"], r["seed"]): r for r in records}
    runs = list(dict.fromkeys(r["run"] for r in records))
    seeds = sorted({r["seed"] for r in records})
    compute = result["compute_s"]
    out = {}
    for run in runs:
        ratios, needed, finals, step_ratios, step_s, link_s = [], [], [], [], [], []
        for seed in seeds:
            rec, ref = by[run, seed], by[GLOO, seed]
            target = final_eval(ref, steps)
            mine, gloo = reached(rec["evals"], target), reached(ref["evals"], target)
            ratios.append(mine[0] / gloo[0] if mine else math.inf)
            needed.append(max(0, mine[1] - steps) if mine else None)
            finals.append(final_eval(rec, steps))
            per_step = [b - a for a, b in zip([0.0] + rec["wall_s"], rec["wall_s"])]
            ref_step = [b - a for a, b in zip([0.0] + ref["wall_s"], ref["wall_s"])]
            step_s.append(statistics.median(per_step))
            step_ratios.append(statistics.median(per_step) / statistics.median(ref_step))
            link_s.append(rec["link_bytes"][-1] / len(rec["link_bytes"]) * 8 / (gbit * 1e9))
        step, link_bound = statistics.mean(step_s), statistics.mean(link_s)
        out[run] = {"time_ratio": ratios, "extra_steps": needed, "final_loss": mean_sd(finals),
                    "step_ratio": statistics.mean(step_ratios), "step_s": step, "compute_s": compute,
                    "link_s": link_bound, "fill": link_bound / step,
                    # 1: the communication hid entirely behind the compute (or the compute behind it); 0: none did.
                    "overlap": max(0.0, min(1.0, (compute + link_bound - step) / min(compute, link_bound)))}
    return out


class Goal(NamedTuple):
    """A goal, what its run measured (value and met None where its configuration did not run) and which it is."""
    what: str
    value: float
    goal: str  # `limit`, as printed
    met: bool
    kind: str  # "time": the time to gloo fp32's final loss over gloo's; "loss": the final loss's distance from gloo's
    hosts: int
    per_host: int
    gbit: float
    wire: str
    limit: float


def goals(summaries):
    """Time-to-loss ratios, then final losses against gloo fp32's spread."""
    out = []
    for per_host, gbit, wire, most in GOALS:
        s = summaries.get(f"2x{per_host}x{gbit:g}", {}).get(wire)
        what = f"2 hosts x {per_host}, {gbit:g} Gbit/s: cnccl {wire}'s time to gloo fp32's final loss, over gloo's"
        value = statistics.mean(s["time_ratio"]) if s else None
        out.append(Goal(what, value, f"<= {most:g}x", None if s is None else value <= most, "time", 2, per_host, gbit,
                        wire, most))
    for key, runs in summaries.items():
        mean, sd = runs[GLOO]["final_loss"]
        for wire in SAME_LOSS:
            if wire not in runs:
                continue
            m, d = runs[wire]["final_loss"]
            # The seeds' spread: two of gloo fp32's standard deviations over its seeds about its mean.
            hosts, per_host, gbit = key.split("x")
            out.append(Goal(f"{hosts} hosts x {per_host}, {gbit} Gbit/s: cnccl {wire}'s final "
                            f"loss {m:.3f} ± {d:.3f}, gloo fp32's {mean:.3f} ± {sd:.3f}", abs(m - mean),
                            f"<= {2 * sd:.3f}", abs(m - mean) <= 2 * sd, "loss", int(hosts), int(per_host), float(gbit),
                            wire, 2 * sd))
    return out


def table(key, summary, seeds):
    lines = [f"{key}: {len(seeds)} seed(s); time to gloo fp32's final held-out loss over gloo's (mean over seeds), "
             "held-out loss at gloo's last step (mean ± sd), median step over gloo's, and the step's bounds"]
    lines.append(f"{'run':>12} {'time':>7} {'+steps':>7} {'final loss':>15} {'step':>6} {'step ms':>8} "
                 f"{'compute':>8} {'link ms':>8} {'fill':>5} {'overlap':>7}")
    for run, s in summary.items():
        ratio = statistics.mean(s["time_ratio"])
        extra = "never" if None in s["extra_steps"] else str(max(s["extra_steps"]))
        lines.append(f"{run:>12} {ratio:6.2f}x {extra:>7} {s['final_loss'][0]:8.3f} ± {s['final_loss'][1]:.3f} "
                     f"{s['step_ratio']:5.2f}x {s['step_s'] * 1e3:8.1f} {s['compute_s'] * 1e3:8.1f} "
                     f"{s['link_s'] * 1e3:8.1f} {s['fill']:5.2f} {s['overlap']:7.2f}")
    return "\n".join(lines)


def plot(data, path):
    """Held-out loss against wall time: a row per topology, a panel per link speed, a line per run (its seeds'
    mean held-out loss at each evaluation against their mean wall time)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = list(data["results"])
    per_hosts = sorted({k.split("x")[1] for k in keys})
    rates = sorted({float(k.split("x")[2]) for k in keys})
    fig, axes = plt.subplots(len(per_hosts), len(rates), figsize=(5 * len(rates), 3.8 * len(per_hosts)),
                             squeeze=False)
    for i, per_host in enumerate(per_hosts):
        for j, gbit in enumerate(rates):
            ax = axes[i][j]
            result = data["results"].get(f"2x{per_host}x{gbit:g}")
            if result is None:
                ax.axis("off")
                continue
            by_run = {}
            for rec in result["records"]:
                by_run.setdefault(rec["run"], []).append(rec)
            for run, recs in by_run.items():
                n = min(len(r["evals"]) for r in recs)
                t = [statistics.mean(r["evals"][k][1] for r in recs) for k in range(n)]
                v = [statistics.mean(r["evals"][k][2] for r in recs) for k in range(n)]
                style = dict(color="black", linewidth=2) if run == GLOO else \
                    dict(color="gray", linestyle="--") if run == HOOK else {}
                ax.plot(t, v, label=("cnccl " + run) if run not in (GLOO, HOOK) else
                        "gloo fp32" if run == GLOO else "gloo + fp16_compress_hook", **style)
            target = statistics.mean(final_eval(r, data["steps"]) for r in by_run[GLOO])
            ax.axhline(target, color="black", linewidth=0.5, linestyle=":")
            ax.set_title(f"2 hosts x {per_host} rank{'s' if per_host != '1' else ''}, {gbit:g} Gbit/s")
            ax.set_xlabel("wall time, s")
            ax.set_ylabel("held-out loss")
            ax.set_ylim(target - 0.15, min(ax.get_ylim()[1], target + 1.0))
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
    fig.suptitle(f"DDP, char-level GPT ({data['params'] / 1e6:.1f} M parameters) on the Python standard library; "
                 f"mean of {data['seeds']} seed(s); {data['machine']['cores']} cores")
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def report(data):
    summaries = {k: summarize(r, float(k.split("x")[2]), data["steps"]) for k, r in data["results"].items()}
    for key, summary in summaries.items():
        print(table(key, summary, range(data["seeds"])) + "\n")
    for g in goals(summaries):
        if g.value is None:
            print(f"{g.what}: not run (its configuration was not in this run)")
        else:
            print(f"{g.what}: {g.value:.3f} (goal {g.goal}): {'met' if g.met else 'NOT MET'}")
    return summaries


def readme_section(data, summaries):
    """The README's picture and, per topology and link, each run's time to gloo fp32's final loss."""
    m = data["machine"]
    runs = list(dict.fromkeys(r for s in summaries.values() for r in s))
    names = {GLOO: "gloo fp32", HOOK: "gloo + fp16 hook"}
    lines = ["![loss against wall time](bench/results/time_to_loss.png)", "",
             f"DDP training of a {data['params'] / 1e6:.1f} M-parameter character-level GPT on the Python standard "
             f"library, two hosts joined by a link of 1, 2.5 or 10 Gbit/s (simulated on one {m['cores']}-core machine, "
             f"{m['date']}, torch {m['torch']}): the time each run took to reach gloo fp32's final loss, over "
             f"gloo fp32's, mean of {data['seeds']} seeds (the loss on held-out text; lower is better; \"+N\": it needed N steps past gloo's "
             f"{data['steps']}). Regenerate with `sudo python3 bench/time_to_loss.py --readme` (about 40 minutes); "
             "method and what bounds each run: [docs/benchmarks.md](docs/benchmarks.md), \"Time to a loss\".", "",
             "| hosts x ranks, link | " + " | ".join(link.cell(names.get(r, "cnccl " + r)) for r in runs) + " |",
             "|---" * (len(runs) + 1) + "|"]
    for key, summary in summaries.items():
        hosts, per_host, gbit = key.split("x")
        cells = []
        for run in runs:
            if run not in summary:
                cells.append("")
                continue
            ratio, extra = statistics.mean(summary[run]["time_ratio"]), summary[run]["extra_steps"]
            cells.append("not reached" if None in extra else f"{ratio:.2f}x" + (f" (+{max(extra)})" if max(extra) else ""))
        lines.append(f"| {hosts} x {per_host}, {gbit} Gbit/s | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def docs_section(data, summaries):
    """docs/benchmarks.md's tables: every run's time, final loss, step and what bounds the step; the goals."""
    m, c = data["machine"], data["corpus"]
    lines = [f"Regenerate with `sudo python3 bench/time_to_loss.py --readme` ({m['cores']}-core machine, {m['cpu']}, "
             f"{m['date']}, torch {m['torch']}; {data['params'] / 1e6:.2f} M parameters; {data['seeds']} seeds; "
             f"corpus: {c['files']} files, {c['bytes'] / 1e6:.1f} MB of Python {c['python']}'s standard library, "
             f"sha256 {c['sha256']}).", "", "```"]
    for key, summary in summaries.items():
        lines += [table(key, summary, range(data["seeds"])), ""]
    lines[-1] = "```"
    lines += ["", "| goal | measured | target | |", "|---|---|---|---|"]
    for g in goals(summaries):
        shown = "not run" if g.value is None else f"{g.value:.3f}"
        lines.append(f"| {link.cell(g.what)} | {shown} | {g.goal} | "
                     f"{'' if g.value is None else 'met' if g.met else 'not met'} |")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="one link, one seed, a few steps: checks the script")
    parser.add_argument("--rates", default="1,2.5,10", help="Gbit/s, comma-separated")
    parser.add_argument("--ranks-per-host", default="1,2")
    parser.add_argument("--seeds", default="3", help="how many seeds (the worker: which)")
    parser.add_argument("--steps", type=int, default=80, help="gloo fp32's steps; the others may go on past them")
    parser.add_argument("--json", default=os.path.join(RESULTS, "time_to_loss.json"))
    parser.add_argument("--png", default=os.path.join(RESULTS, "time_to_loss.png"))
    parser.add_argument("--from", dest="from_json", metavar="JSON", help="report and plot an earlier run's --json, running no training")
    parser.add_argument("--readme", action="store_true", help="rewrite the README's time-to-loss section")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--runs", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.runs.split(","), [int(s) for s in args.seeds.split(",")], args.steps, args.out)
        return
    if args.from_json:
        with open(args.from_json) as f:
            data = json.load(f)
        summaries = report(data)
        if args.png:
            plot(data, args.png)
        if args.readme:
            sections.rewrite(sections.README, "time-to-loss", readme_section(data, summaries))
            sections.rewrite(sections.BENCHMARKS, "time-to-loss", docs_section(data, summaries))
        return
    why = unavailable(("ip", "tc"))
    if why:
        print(f"bench/time_to_loss.py skipped: {why}")
        return
    rates = [float(r) for r in args.rates.split(",")]
    per_hosts = [int(p) for p in args.ranks_per_host.split(",")]
    seeds, steps = list(range(int(args.seeds))), args.steps
    if args.quick:
        rates, seeds, steps = [2.5], [0], EVAL_EVERY
    if steps % EVAL_EVERY:
        sys.exit(f"--steps must be a multiple of {EVAL_EVERY}: gloo fp32's last step is evaluated")
    _, named = corpus()
    data = {"machine": link.machine(), "corpus": named, "steps": steps, "seeds": len(seeds),
            "model": {"width": WIDTH, "blocks": BLOCKS, "context": CONTEXT, "batch_per_rank": BATCH, "lr": LR,
                      "eval_every": EVAL_EVERY, "eval_seqs": EVAL_SEQS},
            "results": {}}
    nodes = Nodes(2)
    try:
        with tempfile.TemporaryDirectory(prefix="cnccl-ttl-") as logdir:
            for per_host in per_hosts:
                runs = FLAT + (PER_LEVEL if per_host > 1 else [])
                if args.quick and per_host > 1:
                    runs = [GLOO] + PER_LEVEL  # the wire per level, at 2 ranks a host
                for gbit in rates:
                    nodes.shape(gbit)
                    started = time.time()
                    result = job(nodes, per_host, runs, seeds, steps, logdir)
                    data["params"] = result["params"]
                    data["results"][f"2x{per_host}x{gbit:g}"] = result
                    print(f"2 x {per_host} at {gbit:g} Gbit/s: {time.time() - started:.0f} s", flush=True)
    finally:
        nodes.close()
    summaries = report(data)
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(data, f)
    if args.png:
        plot(data, args.png)
    if args.readme:
        sections.rewrite(sections.README, "time-to-loss", readme_section(data, summaries))
        sections.rewrite(sections.BENCHMARKS, "time-to-loss", docs_section(data, summaries))


if __name__ == "__main__":
    main()

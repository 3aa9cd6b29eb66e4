"""The README's headline numbers: a few goals from each benchmark's last run, read from its JSON under
bench/results/ (time_to_loss.json; link.json; allreduce.json with ddp_step.json), each beside its goal and
the command that measures it again. Runs nothing; rewrites the README between its `headline` markers.

Usage: python3 bench/headline.py
"""

import json
import os

import link
import report
import sections
import time_to_loss

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
TTL, LINK, ONE_HOST = "sudo python3 bench/time_to_loss.py --readme", "sudo python3 bench/link.py --docs", \
    "python3 bench/report.py"


def load(name):
    with open(os.path.join(RESULTS, name)) as f:
        return json.load(f)


def where(data, command):
    """The command that measures a row again, and the machine and date of the run it shows."""
    m = data["machine"]
    return f"`{command}` ({m['cores']}-core {m['cpu']}, {m['date']})"


def rows():
    """(what, measured, goal, met, command and machine)"""
    out = []
    ttl = load("time_to_loss.json")
    ttl_at = where(ttl, TTL)
    summaries = {k: time_to_loss.summarize(r, float(k.split("x")[2]), ttl["steps"]) for k, r in ttl["results"].items()}
    for g in time_to_loss.goals(summaries):
        if g.value is None:
            continue
        if g.kind == "time" and (g.gbit < 10 or g.wire == "mxfp8"):
            out.append((f"2 hosts x {g.per_host}, {g.gbit:g} Gbit/s, DDP: cnccl {g.wire}'s time to gloo fp32's final "
                        "loss, over gloo's", f"{g.value:.3f}x", g.goal, g.met, ttl_at))
        elif g.kind == "loss" and (g.hosts, g.per_host, g.gbit, g.wire) == (2, 1, 2.5, "mxfp8"):
            out.append(("2 hosts x 1, DDP: cnccl mxfp8's final loss from gloo fp32's (held-out, mean of seeds)",
                        f"{g.value:.3f}", f"{g.goal} (2 sd of gloo's seeds)", g.met, ttl_at))
    link_data = load("link.json")
    for g in link.goals(link_data["results"]):
        # The flat wires at 2.5 Gbit/s, and the wires per level that end in mxfp8 at 1 Gbit/s.
        if g.value is not None and g.size == link.M64 and (
                (g.per_host, g.gbit) == (1, 2.5) and g.wire != "none" or (g.per_host, g.gbit) == (2, 1) and
                g.wire.endswith("|mxfp8")):
            out.append((f"{g.hosts} hosts x {g.per_host}, {g.gbit:g} Gbit/s: 64 MiB allreduce, {g.wire} over gloo fp32",
                        f"{g.value:.2f}x", f">= {g.need:g}x", g.met, where(link_data, LINK)))
    ar, ddp = load("allreduce.json"), load("ddp_step.json")
    for name, value, target, higher in report.goals(ar["results"], ddp):
        if name in ("2 ranks, 16M cnccl-fp16 vs gloo fp32", "2 ranks, 16M cnccl-fp16 vs DeepSpeed shm (fp32)",
                    "DDP step, cnccl-fp16 / (gloo + fp16 hook)"):
            met = value >= target if higher else value <= target
            out.append(("one host, " + name.replace(" vs ", " over "), f"{value:.2f}x",
                        f"{'>=' if higher else '<='} {target:g}x", met, where(ar, ONE_HOST)))
    return out


def section():
    lines = ["| what (a goal with <= is a time over the baseline's, >= a speed-up) | measured | goal | | "
             "regenerate with (the run shown) |", "|---|---|---|---|---|"]
    for what, value, goal, met, command in rows():
        lines.append(f"| {link.cell(what)} | {value} | {goal} | {'met' if met else 'not met'} | "
                     f"{command} |")
    return "\n".join(lines)


if __name__ == "__main__":
    sections.rewrite(sections.README, "headline", section())

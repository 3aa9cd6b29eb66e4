"""The README's headline numbers: a few goals from each benchmark's last run, read from its JSON under
bench/results/ (time_to_loss.json; link.json; allreduce.json with ddp_step.json), each beside its goal and
the command that measures it again. Runs nothing; rewrites the README between its `headline` markers.

Usage: python3 bench/headline.py
"""

import json
import os
import statistics

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
    for per_host, gbit, wire, most in time_to_loss.GOALS:
        s = summaries.get(f"2x{per_host}x{gbit:g}", {}).get(wire)
        if s and (gbit < 10 or wire == "mxfp8"):
            value = statistics.mean(s["time_ratio"])
            out.append((f"2 hosts x {per_host}, {gbit:g} Gbit/s, DDP: cnccl {wire}'s time to gloo fp32's final loss, "
                        "over gloo's", f"{value:.3f}x", f"<= {most:g}x", value <= most, ttl_at))
    s = summaries.get("2x1x2.5", {})
    if "mxfp8" in s:
        (mean, sd), (m, _) = s[time_to_loss.GLOO]["final_loss"], s["mxfp8"]["final_loss"]
        out.append(("2 hosts x 1, DDP: cnccl mxfp8's final loss from gloo fp32's (held-out, mean of seeds)",
                    f"{abs(m - mean):.3f}", f"<= {2 * sd:.3f} (2 sd of gloo's seeds)", abs(m - mean) <= 2 * sd, ttl_at))
    link_data = load("link.json")
    for name, value, target, fill, met, *_ in link.goals(link_data["results"]):
        if value is not None and "64M" in name and ("x 1, 2.5 Gbit/s" in name and "none" not in name or
                                                    "x 2, 1 Gbit/s" in name and "mxfp8" in name):
            out.append((name.replace(", 64M, cnccl", ": 64 MiB allreduce,").replace(" vs ", " over "),
                        f"{value:.2f}x", f">= {target:g}x", met, where(link_data, LINK)))
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
        lines.append(f"| {what.replace('|', chr(92) + '|')} | {value} | {goal} | {'met' if met else 'not met'} | "
                     f"{command} |")
    return "\n".join(lines)


if __name__ == "__main__":
    sections.rewrite(sections.README, "headline", section())

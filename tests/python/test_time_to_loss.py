"""bench/time_to_loss.py's quick mode, end to end as a user runs it (root; two simulated hosts, a 2.5 Gbit/s
link, 2 x 1 with every run and 2 x 2 with gloo fp32 and the wire per level, 8 steps, one seed), so that the
benchmark keeps working. What it asserts of the run (no time is asserted: the ratios are the benchmark's):

- every run trained: the first losses (training and held-out) are the untrained model's (ln 256 = 5.55 for
  bytes, within 0.5: the full run's ranged 5.62-5.90), the losses stay finite and the held-out loss fell by at
  least 0.5 in 8 steps; a run whose reduced gradients came back zero or NaN does neither;
- each wire put its own bytes through the link a step, as a share of gloo fp32's (its bytes an element over 4,
  within the bounds below): DDP's gradients went through the compressing path, not around it;
- the report, its JSON and the picture were written, and `--from` reproduces the report from the JSON.
"""

import json
import math
import os
import subprocess
import sys

import pytest

from harness import clean_env

pytestmark = pytest.mark.needs_host_path

BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "bench")
# A step's bytes over gloo fp32's: each wire's bytes an element over fp32's 4 (fp16 2, mxfp8 33/32, mxfp4
# 17/32), within -10% (gloo's ring and cnccl's all-to-all move the same payload at 2 ranks) and +15% (frame and
# message headers, TCP's own, and the loss's 4-byte allreduce, which weigh more at a quarter of the bytes).
SHARE = {"gloo-hook": 0.5, "none": 1.0, "fp16": 0.5, "bf16": 0.5, "mxfp8": 33 / 128, "mxfp4": 17 / 128}


def test_quick_mode_trains_every_run_and_each_wire_carries_its_bytes(link_namespaces, tmp_path):
    out, png = tmp_path / "ttl.json", tmp_path / "ttl.png"
    cmd = [sys.executable, os.path.join(BENCH, "time_to_loss.py"), "--quick", "--json", str(out), "--png", str(png)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=clean_env())
    assert r.returncode == 0, f"{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    assert "time to gloo fp32's final loss" in r.stdout and png.stat().st_size > 10000, r.stdout[-3000:]
    data = json.loads(out.read_text())
    assert set(data["results"]) == {"2x1x2.5", "2x2x2.5"}, list(data["results"])
    for key, result in data["results"].items():
        per_step = {}
        for rec in result["records"]:
            run, losses = rec["run"], rec["losses"]
            assert len(losses) >= data["steps"] and all(math.isfinite(v) for v in losses), (key, run, losses)
            evals = [loss for _, _, loss in rec["evals"]]
            assert abs(evals[0] - math.log(256)) < 0.5 and abs(losses[0] - math.log(256)) < 0.5, (key, run, evals)
            assert evals[1] < evals[0] - 0.5, (key, run, evals)
            per_step[run] = rec["link_bytes"][-1] / len(rec["link_bytes"])
        runs = [rec["run"] for rec in result["records"]]
        if key == "2x1x2.5":
            assert runs == ["gloo-fp32", "gloo-hook", "none", "fp16", "bf16", "mxfp8", "mxfp4"], runs
            for run, share in SHARE.items():
                got = per_step[run] / per_step["gloo-fp32"]
                assert share * 0.9 <= got <= share * 1.15, f"{run}: {got:.3f} of gloo fp32's bytes a step, want {share:.3f}"
        else:
            assert runs == ["gloo-fp32", "fp16|mxfp8"], runs
            # gloo's ring of 4 crosses each direction of the link once (ranks 1 -> 2, 3 -> 0), with 2 (P - 1) / P
            # = 1.5 fp32 values an element; cnccl's sum of each host crosses once, in mxfp8 (33/32 bytes).
            share, got = (33 / 32) / (1.5 * 4), per_step["fp16|mxfp8"] / per_step["gloo-fp32"]
            assert share * 0.9 <= got <= share * 1.15, f"fp16|mxfp8: {got:.3f} of gloo fp32's bytes, want {share:.3f}"
    again = subprocess.run([sys.executable, os.path.join(BENCH, "time_to_loss.py"), "--from", str(out), "--png", ""],
                           capture_output=True, text=True, timeout=120, env=clean_env())
    assert again.returncode == 0, again.stderr[-3000:]
    assert again.stdout == r.stdout[r.stdout.index("2x1x2.5: "):], again.stdout

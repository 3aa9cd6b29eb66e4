"""bench/gpu_check.sh on a machine without a GPU: it checks every other prerequisite, stops naming the
missing GPU, and leaves its JSON summary, also when it is killed."""

import json
import os
import signal
import subprocess
import time

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "bench", "gpu_check.sh")
no_gpu = pytest.mark.skipif(torch.cuda.is_available(), reason="with a GPU the check builds and runs everything")


@no_gpu
def test_without_a_gpu_it_names_what_is_missing_and_leaves_its_json(tmp_path):
    r = subprocess.run(["bash", SCRIPT], capture_output=True, text=True, timeout=120, env=dict(os.environ, OUT=str(tmp_path)))
    assert r.returncode == 2, r.stdout + r.stderr
    summary = json.loads((tmp_path / "gpu_check.json").read_text())
    missing = summary["steps"]["prerequisites"]
    assert missing.startswith("missing: ") and "a visible CUDA GPU" in missing, summary
    # Every other prerequisite was checked before the GPU: their facts are there.
    assert {"python", "torch", "host_compiler"} <= set(summary["facts"]), summary
    assert summary["status"] == 2 and summary["state"] == "ended (exit 2)", summary
    # The verdict it would have given: the C++ GPU tests and the Python ones, at one rank and at several.
    assert {"cpp_codec_cuda", "cpp_frames_cuda", "cpp_composition", "python_cuda", "python_cuda_ranks"} <= \
        set(summary["verdict"]), summary
    assert json.loads(r.stdout[r.stdout.index("{"):]) == summary, r.stdout


@no_gpu
def test_killed_it_records_the_step_and_prints_its_json(tmp_path):
    summary_path = tmp_path / "gpu_check.json"
    p = subprocess.Popen(["bash", SCRIPT], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         env=dict(os.environ, OUT=str(tmp_path)))
    # The JSON is first written as the prerequisites start, before torch is imported (seconds).
    deadline = time.monotonic() + 60
    while not summary_path.exists() and time.monotonic() < deadline and p.poll() is None:
        time.sleep(0.01)
    assert summary_path.exists(), "no JSON while the check ran"
    p.send_signal(signal.SIGTERM)
    out, _ = p.communicate(timeout=60)
    assert p.returncode == 128 + signal.SIGTERM, out
    summary = json.loads(summary_path.read_text())
    assert summary["state"] == "killed by SIGTERM during prerequisites", summary
    assert summary["steps"]["prerequisites"].startswith("killed by SIGTERM"), summary
    assert summary["status"] == 128 + signal.SIGTERM, summary
    assert json.loads(out[out.index("{"):]) == summary, out


@no_gpu
def test_a_fact_with_backslashes_and_quotes_is_kept_as_it_was(tmp_path):
    # A compiler's --version line holding JSON's escape characters: the summary keeps it byte for byte (printf
    # %b would turn the escaped "\\n" back into a newline inside the JSON string, and "\\t" into a tab).
    line = r'c++ (C:\tools\n12) "quoted" \\ end'
    cxx = tmp_path / "cxx"
    cxx.write_text(f"#!/bin/sh\ncat <<'EOF'\n{line}\nEOF\n")
    cxx.chmod(0o755)
    r = subprocess.run(["bash", SCRIPT], capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, OUT=str(tmp_path), CXX=str(cxx)))
    assert r.returncode == 2, r.stdout + r.stderr
    summary = json.loads((tmp_path / "gpu_check.json").read_text())
    assert summary["facts"]["host_compiler"] == line, summary["facts"]

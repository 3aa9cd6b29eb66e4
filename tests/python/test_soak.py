"""bench/soak.py over 20,000 collectives on each CPU engine: after the warm-up nothing a rank holds grows
(RSS within 32 MiB; descriptors, threads and mapped shared-memory segments equal), though groups are made
and destroyed along the way. The long run's numbers (1,000,000 collectives on shared memory, 200,000 on UCX
and gloo) are in docs/testing.md."""

import json
import os
import subprocess
import sys

import pytest

from harness import clean_env

SOAK = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench", "soak.py")


@pytest.mark.parametrize("engine", ["shm", "ucx", "gloo"])
def test_twenty_thousand_collectives_grow_nothing(tmp_path, engine):
    out = tmp_path / "soak.json"
    r = subprocess.run([sys.executable, SOAK, "--engine", engine, "--collectives", "20000", "--timeout", "400",
                        "--json", str(out)], capture_output=True, text=True, timeout=480,
                       env=clean_env(OMP_NUM_THREADS="1"))
    assert out.exists(), f"exit {r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-5000:]}"
    data = json.loads(out.read_text())
    assert data["grew"] == [], r.stdout
    samples = data["samples"]["0"]
    assert samples[-1]["collectives"] >= 20000 and len(samples) >= 10, samples
    if engine == "shm":
        # The positive control of the segment count: a shared-memory group maps its peers' segments.
        assert samples[-1]["segments"] > 0, samples[-1]
    assert r.returncode == 0, r.stdout

"""DDP (six variants, PowerSGD) and FSDP2 on cnccl against gloo with the seed hooks; world sizes 2 and 4.

Each job's rank 0 writes what it measured (maximum differences, accuracy distances) as JSON lines;
set CNCCL_PARITY_REPORT_DIR to keep them (parity-ws2.jsonl, parity-ws4.jsonl).
"""

import functools
import os
import tempfile

import pytest

import parity_cases  # noqa: F401 - registers the cases
from harness import CASES, check_case, run_job

NAMES = sorted(n for n, (fn, _) in CASES.items() if fn.__module__ == "parity_cases")


@functools.lru_cache(maxsize=None)
def job(world_size):
    folder = os.environ.get("CNCCL_PARITY_REPORT_DIR") or tempfile.mkdtemp(prefix="cnccl-parity-")
    os.makedirs(folder, exist_ok=True)
    report = os.path.join(folder, f"parity-ws{world_size}.jsonl")
    if os.path.exists(report):
        os.remove(report)
    return run_job("parity_cases", world_size, env={"CNCCL_TEST_REPORT": report})


@pytest.mark.parametrize("world_size", [2, 4])
@pytest.mark.parametrize("name", NAMES)
def test_parity(name, world_size):
    check_case(job(world_size), name, world_size)

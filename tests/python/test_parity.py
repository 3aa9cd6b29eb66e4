"""DDP (six variants, PowerSGD) and FSDP2 on cnccl against gloo with the seed hooks; world sizes 2 and 4.

Each job's rank 0 writes what it measured (maximum differences, accuracy distances) as JSON lines;
set CNCCL_PARITY_REPORT_DIR to keep them (parity-ws2.jsonl, parity-ws4.jsonl).
"""

import os
import tempfile

import pytest

import parity_cases  # noqa: F401 - registers the cases
from harness import CASES, check_case, cached_job

NAMES = sorted(n for n, (fn, _) in CASES.items() if fn.__module__ == "parity_cases")
WORLD_SIZES = [2, 4]
REPORT_DIR = os.environ.get("CNCCL_PARITY_REPORT_DIR") or tempfile.mkdtemp(prefix="cnccl-parity-")
os.makedirs(REPORT_DIR, exist_ok=True)
for _ws in WORLD_SIZES:  # the jobs append: start from empty reports
    if os.path.exists(os.path.join(REPORT_DIR, f"parity-ws{_ws}.jsonl")):
        os.remove(os.path.join(REPORT_DIR, f"parity-ws{_ws}.jsonl"))


def job(world_size):
    return cached_job("parity_cases", world_size,
                      env={"CNCCL_TEST_REPORT": os.path.join(REPORT_DIR, f"parity-ws{world_size}.jsonl")})


@pytest.mark.parametrize("world_size", WORLD_SIZES)
@pytest.mark.parametrize("name", NAMES)
def test_parity(name, world_size):
    check_case(job(world_size), name, world_size)

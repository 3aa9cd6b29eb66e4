"""DDP (six variants, PowerSGD) and FSDP2 on cnccl against gloo with the seed hooks; world sizes 2 and 4,
on each CPU engine.

Each job's rank 0 writes what it measured (maximum differences, accuracy distances) as JSON lines;
set CNCCL_PARITY_REPORT_DIR to keep them (parity-ucx-ws2.jsonl, ...).
"""

import os
import tempfile

import pytest

import parity_cases  # noqa: F401 - registers the cases
from harness import CASES, CPU_ENGINES, cached_job, check_case, engine_env

NAMES = sorted(n for n, (fn, _) in CASES.items() if fn.__module__ == "parity_cases")
WORLD_SIZES = [2, 4]
REPORT_DIR = os.environ.get("CNCCL_PARITY_REPORT_DIR") or tempfile.mkdtemp(prefix="cnccl-parity-")
os.makedirs(REPORT_DIR, exist_ok=True)


def report(engine, world_size):
    return os.path.join(REPORT_DIR, f"parity-{engine}-ws{world_size}.jsonl")


for _engine in CPU_ENGINES:  # the jobs append: start from empty reports
    for _ws in WORLD_SIZES:
        if os.path.exists(report(_engine, _ws)):
            os.remove(report(_engine, _ws))


def job(world_size, engine):
    return cached_job("parity_cases", world_size,
                      env={"CNCCL_TEST_REPORT": report(engine, world_size), **engine_env(engine)})


@pytest.mark.parametrize("engine", CPU_ENGINES)
@pytest.mark.parametrize("world_size", WORLD_SIZES)
@pytest.mark.parametrize("name", NAMES)
def test_parity(name, world_size, engine):
    check_case(job(world_size, engine), name, world_size)

"""Disagreeing ranks, timeouts, abort and shutdown, on each CPU engine (one job per world size and engine)."""

import pytest

import reliability_cases  # noqa: F401 - registers the cases
from harness import CASES, CPU_ENGINES, cached_job, check_case, engine_env

NAMES = sorted(n for n, (fn, _) in CASES.items() if fn.__module__ == "reliability_cases")


@pytest.mark.parametrize("engine", CPU_ENGINES)
@pytest.mark.parametrize("world_size", [2, 4])
@pytest.mark.parametrize("name", NAMES)
def test_reliability(name, world_size, engine):
    check_case(cached_job("reliability_cases", world_size, timeout=600, env=engine_env(engine)), name, world_size)

"""Disagreeing ranks, timeouts, abort and shutdown on the host path (one job per world size)."""

import pytest

import reliability_cases  # noqa: F401 - registers the cases
from harness import CASES, check_case, cached_job

NAMES = sorted(n for n, (fn, _) in CASES.items() if fn.__module__ == "reliability_cases")


def job(world_size):
    return cached_job("reliability_cases", world_size, timeout=600)


@pytest.mark.parametrize("world_size", [2, 4])
@pytest.mark.parametrize("name", NAMES)
def test_reliability(name, world_size):
    check_case(job(world_size), name, world_size)

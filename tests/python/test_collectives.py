"""Every collective on CPU tensors against gloo, world sizes 1 to 4 (one job per world size)."""

import pytest

import collectives_cases  # noqa: F401 - registers the cases
from harness import CASES, check_case, cached_job

WORLD_SIZES = [1, 2, 3, 4]
NAMES = sorted(n for n, (fn, _) in CASES.items() if fn.__module__ == "collectives_cases")


def job(world_size):
    return cached_job("collectives_cases", world_size)


@pytest.mark.parametrize("world_size", WORLD_SIZES)
@pytest.mark.parametrize("name", NAMES)
def test_collective(name, world_size):
    check_case(job(world_size), name, world_size)

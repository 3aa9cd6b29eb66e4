"""Every collective on CPU tensors against gloo, world sizes 1 to 4, on each CPU engine (one job each)."""

import pytest

import collectives_cases  # noqa: F401 - registers the cases
from harness import CASES, CPU_ENGINES, cached_job, check_case, engine_env

WORLD_SIZES = [1, 2, 3, 4]
NAMES = sorted(n for n, (fn, _) in CASES.items() if fn.__module__ == "collectives_cases")


@pytest.mark.parametrize("engine", CPU_ENGINES)
@pytest.mark.parametrize("world_size", WORLD_SIZES)
@pytest.mark.parametrize("name", NAMES)
def test_collective(name, world_size, engine):
    check_case(cached_job("collectives_cases", world_size, env=engine_env(engine)), name, world_size)

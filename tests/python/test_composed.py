"""The composed path (cnccl's compression around torch's gloo for CPU tensors) at 2, 3 and 4 ranks."""

import pytest

import composed_cases  # noqa: F401 - registers the cases
from harness import CASES, check_case, cached_job

NAMES = sorted(n for n, (fn, _) in CASES.items() if fn.__module__ == "composed_cases")


@pytest.mark.parametrize("world_size", [2, 3, 4])
@pytest.mark.parametrize("name", NAMES)
def test_composed(name, world_size):
    check_case(cached_job("composed_cases", world_size), name, world_size)

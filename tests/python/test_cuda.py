"""cnccl's CUDA path on one GPU (world size 1), in one job. Skips, naming why, without a GPU."""

import pytest
import torch

import cuda_cases  # noqa: F401 - registers the cases
from harness import CASES, cached_job

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU on this machine")

NAMES = sorted(n for n, (fn, _) in CASES.items() if fn.__module__ == "cuda_cases")


def job():
    return cached_job("cuda_cases", 1)


@pytest.mark.parametrize("name", NAMES)
def test_cuda(name):
    failure = job().get(name, "case did not run")
    assert failure is None, failure

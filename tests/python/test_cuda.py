"""cnccl's CUDA path on one GPU (world size 1): one job as configured by default, one with
TORCH_NCCL_BLOCKING_WAIT=1. Skips, naming why, without a GPU."""

import pytest
import torch

import cuda_cases  # noqa: F401 - registers the cases
from harness import CASES, cached_job, check_case

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU on this machine")

NAMES = sorted(n for n, (fn, _) in CASES.items() if fn.__module__ == "cuda_cases")


ENVS = {"default": {}, "blocking-wait": {"TORCH_NCCL_BLOCKING_WAIT": "1"}}


@pytest.mark.parametrize("env", list(ENVS))
@pytest.mark.parametrize("name", NAMES)
def test_cuda(name, env):
    check_case(cached_job("cuda_cases", 1, env=ENVS[env]), name, 1)

"""Sustained load on the host path: see load_cases.py."""

import load_cases  # noqa: F401 - registers the case
from harness import run_job


def test_ten_thousand_mixed_async_collectives():
    # A fixed mmap threshold: glibc otherwise raises it after large frees and keeps later tensors
    # in its heap, growing the resident size by itself; the test measures cnccl's growth.
    env = {"MALLOC_MMAP_THRESHOLD_": str(1 << 20)}
    failure = run_job("load_cases", 2, timeout=900, env=env).get("ten_thousand_mixed_async_collectives", "case did not run")
    assert failure is None, failure

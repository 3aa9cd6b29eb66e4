"""PyTorch's own distributed suite run against cnccl (CPU tensors, 2 ranks), as torch_ucc and
torch-ccl run it against their backends: the `DistributedTest._DistTestBase` cases of
torch.testing._internal.distributed.distributed_test, each in freshly forked ranks.

Run by .ci/test as a pytest session of its own (the suite reads BACKEND and WORLD_SIZE when it is
imported): `python3 -m pytest tests/upstream`. Upstream's own decorators skip the cases that
need a GPU or name other backends; docs/testing.md lists why. A case that runs and cannot pass for a
reason outside cnccl is in KNOWN_FAILURES with that reason, and is a strict xfail: should it start
passing, the run fails until the entry is removed.
"""

import atexit
import os
import shutil
import tempfile

os.environ.setdefault("BACKEND", "cnccl")
os.environ.setdefault("WORLD_SIZE", "2")
if "TEMP_DIR" not in os.environ:
    os.environ["TEMP_DIR"] = tempfile.mkdtemp(prefix="cnccl-upstream-")
    atexit.register(shutil.rmtree, os.environ["TEMP_DIR"], ignore_errors=True)
for _name in [k for k in os.environ if k.startswith(("CNCCL_", "UCX_")) and not k.startswith("CNCCL_TEST_")]:
    del os.environ[_name]  # the defaults, whatever the caller's environment holds

import pytest  # noqa: E402
import torch  # noqa: E402
from torch.testing._internal.common_distributed import DistTestCases  # noqa: E402

# cnccl is a plugin that runs DDP and subgroups like gloo does: let upstream's feature checks
# select those cases for it (the sets are read when the suite's decorators run, at import).
for feature in ("ddp", "subgroup", "plugin"):
    DistTestCases.backend_feature[feature].add(os.environ["BACKEND"])

from torch.testing._internal.distributed.distributed_test import DistributedTest, TestDistBackend  # noqa: E402

KNOWN_FAILURES = {
    "test_ddp_logging_data_cpu": "DDP logs the process group's getBackendName(), which torch's ProcessGroup "
    "reports as 'custom' for every plugin backend; the case expects dist.get_backend()'s 'cnccl'",
}


class TestDistBackendWithFork(TestDistBackend, DistributedTest._DistTestBase):
    def setUp(self):
        super().setUp()
        # Forked, not spawned: a spawned rank imports torch again (~10 s a case here); this process
        # has loaded no communication library to inherit (cnccl's extension loads with a group).
        self._start_processes(torch.multiprocessing.get_context("fork").Process)


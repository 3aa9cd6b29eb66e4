"""A peer killed with SIGKILL in the middle of a stream of collectives: every survivor gets a
DistBackendError within the group's timeout, and destroy_process_group() returns afterwards."""

import json
import os
import re
import tempfile

import pytest

from harness import launch, wait_all

TIMEOUT = 5.0  # the group's timeout, seconds


@pytest.mark.parametrize("world_size,victim", [(2, 1), (3, 2), (3, 0)])
def test_sigkilled_peer(world_size, victim):
    out = tempfile.mkdtemp(prefix="cnccl-faults-")
    here = os.path.dirname(os.path.abspath(__file__))
    store, procs = launch([os.path.join(here, "fault_worker.py"), str(victim), "20", str(TIMEOUT)], world_size, {},
                          out)
    codes = wait_all(procs, 120)
    del store
    assert codes[victim] == -9, f"the victim should have died of SIGKILL, exit codes {codes}"
    for rank in range(world_size):
        if rank == victim:
            continue
        assert codes[rank] == 0, f"survivor {rank} exited with {codes[rank]} (crash or hang), codes {codes}"
        with open(os.path.join(out, f"rank{rank}.json")) as f:
            result = json.load(f)
        assert result["error"], f"rank {rank} saw no error: {result}"
        assert "cnccl" in result["error"] and "seq" in result["error"], result
        # The peer it waited on: the victim itself, or (at 3 ranks) a survivor stuck behind it.
        peer = re.search(r"\[peer rank (\d+)\]|rank (\d+) reported", result["error"])
        assert peer and int(peer.group(1) or peer.group(2)) != rank, result
        if world_size == 2:
            assert f"[peer rank {victim}]" in result["error"], result
        assert result["failed_tensor_unmodified"], result
        # The group's timeout, plus slack for a loaded machine (the store lives in this process).
        assert result["seconds_to_error"] < TIMEOUT + 5, result
        assert result["destroy_seconds"] < 15, result

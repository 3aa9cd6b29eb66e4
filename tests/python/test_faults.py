"""Each rank in turn killed with SIGKILL in a stream of collectives (between two, and during a
multi-chunk allreduce), through shared memory and over UCX alone: every survivor gets a DistBackendError within the group's timeout, the tensor of
the collective that failed is as it was, destroy_process_group() returns afterwards, and no
shared-memory segment outlives the job (memfd mappings in any process, files in /dev/shm, SysV
segments the job's processes created)."""

import json
import os
import re
import tempfile

import pytest

from harness import engine_env, launch, wait_all

# The group's timeout, seconds. Over UCX a survivor learns of the death only when it runs out, so
# it is short there; shared memory keeps the default group's margin for 4 busy-polling ranks on 2 cores.
TIMEOUTS = {"shm": 5.0, "ucx": 2.0}


def memfd_mappings():
    """(pid, line) of every mapping of a cnccl memfd segment in any process."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/maps") as f:
                found += [(pid, line.strip()) for line in f if "memfd:cnccl" in line]
        except OSError:
            pass
    return found


def sysv_segments_created_by(pids):
    with open("/proc/sysvipc/shm") as f:
        rows = [line.split() for line in f.readlines()[1:]]
    return [row for row in rows if int(row[4]) in pids]  # columns: key shmid perms size cpid ...


@pytest.mark.parametrize("engine", ["shm", "ucx"])
@pytest.mark.parametrize("world_size,victim,when", [(w, v, "between") for w in (2, 3, 4) for v in range(w)] +
                         [(2, 1, "during"), (3, 0, "during"), (4, 2, "during")])
def test_sigkilled_peer(world_size, victim, when, engine):
    out = tempfile.mkdtemp(prefix="cnccl-faults-")
    here = os.path.dirname(os.path.abspath(__file__))
    dev_shm_before = set(os.listdir("/dev/shm"))
    env = engine_env(engine)
    if engine == "ucx" and when == "during":
        # UCX 1.13 aborts a process whose CMA read finds its peer dead (README, "Options"): without
        # CMA a kill mid-transfer must fail the collective like any other.
        env = {**env, "UCX_TLS": "^cma"}
    timeout = TIMEOUTS[engine]
    store, procs = launch([os.path.join(here, "fault_worker.py"), str(victim), "20", str(timeout), when], world_size,
                          env, out)
    codes = wait_all(procs, 120)
    del store
    assert memfd_mappings() == [], "a shared-memory segment outlived the job"
    assert set(os.listdir("/dev/shm")) - dev_shm_before == set(), "files left in /dev/shm"
    assert sysv_segments_created_by({p.pid for p in procs}) == [], "SysV segments left behind"
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
        assert result["seconds_to_error"] < timeout + 5, result
        assert result["destroy_seconds"] < 15, result

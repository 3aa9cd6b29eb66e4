"""Jobs that torchrun restarts: `torchrun --max-restarts=1`, a rank SIGKILLed (or SIGSTOPped: a rank that
hangs) at step 10 of a DDP job on each CPU engine, at 2 and 4 ranks (elastic_job.py). The survivors fail
within seconds with an error naming cnccl, torchrun restarts every worker, the new attempt's groups form,
resume from the checkpoint and finish.

What carried over from a killed attempt: torchrun's agent serves one TCPStore for every attempt
(torch/distributed/elastic/rendezvous/api.py, RendezvousStoreInfo; the workers reach it through
TORCHELASTIC_USE_AGENT_STORE), so the keys of attempt 0's groups, under the same group names, are still
there when attempt 1 reads them: its ranks connected to the dead processes' UCX addresses ("UCX endpoint
create failed: Shared memory error"), and gloo's full mesh to their ports. A group now keeps its keys
under a prefix its ranks agree on when it is made (backend/group_store.h); the first test shows those
stale keys joined around.
"""

import datetime
import glob
import json
import os
import re
import subprocess
import sys
import threading
import time

import pytest
import torch.distributed as dist

import cnccl
from harness import clean_env, engine_env

HERE = os.path.dirname(os.path.abspath(__file__))
STEPS, KILL_STEP = 30, 10
# A survivor learns of a SIGKILLed peer through its pidfd or a closed connection within a second on
# these engines (test_faults.py's bound is 3 s); gloo's ranks that are not the victim's neighbours learn
# it when a neighbour that failed exits (under a second here). Far below the group's timeout.
PROMPT_SECONDS = 5.0
GROUP_TIMEOUT_S = 120
# A SIGSTOPped rank is alive: its peers fail at the group's timeout, which this test shortens.
STOPPED_TIMEOUT_S = 10


def test_a_group_joins_around_the_keys_an_earlier_group_left():
    store = dist.HashStore()
    timeout = datetime.timedelta(seconds=20)
    # What a killed attempt may leave: tokens and views of ranks that will never post them again.
    for key in ("cnccl/join/token/0", "cnccl/join/token/1", "cnccl/join/view/0", "cnccl/join/view/1"):
        store.set(key, "from an earlier attempt")
    joined = {}

    def join(rank, delay):
        time.sleep(delay)
        joined[rank] = cnccl._C._group_store(store, rank, 2, timeout, "g")

    for delays in ((0, 0.3), (0.3, 0)):
        threads = [threading.Thread(target=join, args=(r, d)) for r, d in enumerate(delays)]
        [t.start() for t in threads]
        [t.join() for t in threads]
        joined[0].set("probe", str(delays))
        assert joined[1].get("probe") == str(delays).encode(), "the ranks joined under different prefixes"
        first = joined
        joined = {}
    # A second group of the same name starts under a prefix of its own.
    threads = [threading.Thread(target=join, args=(r, 0)) for r in range(2)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    assert not joined[1].check(["probe"]), "a later group of the same name reads an earlier group's keys"
    del first


def test_a_rank_that_never_joins_is_named():
    store = dist.HashStore()
    with pytest.raises(dist.DistBackendError, match=r"rank 0 of group 'g' waited \d+ ms .* rank\(s\) 1 to start"):
        cnccl._C._group_store(store, 0, 2, datetime.timedelta(seconds=1), "g")


def run(tmp_path, engine, world, victim, signal_name, group_timeout):
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--max-restarts=1",
            f"--nproc_per_node={world}", "--monitor-interval=0.5", os.path.join(HERE, "elastic_job.py"),
            str(tmp_path), str(STEPS), f"{victim}:{KILL_STEP}:{signal_name}", str(group_timeout)]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=240, cwd=tmp_path,
                       env=clean_env(OMP_NUM_THREADS="1", **engine_env(engine)))
    records = {}
    for path in glob.glob(str(tmp_path / "attempt*-rank*.json")):
        with open(path) as f:
            rec = json.load(f)
        records[rec["attempt"], rec["rank"]] = rec
    log = f"exit {r.returncode}\n{r.stdout[-2000:]}\n{r.stderr[-6000:]}"
    assert r.returncode == 0, f"torchrun did not finish the job after a restart: {log}"
    return records, log


def check_restart(records, log, world, victim, bound, gloo=False):
    signalled = records[0, victim]["signalled_at"]
    for rank in range(world):
        if rank == victim:
            continue
        first = records[0, rank]
        assert first["error"], f"survivor {rank} recorded no error (torchrun ended it first): {first}\n{log}"
        # The collective, the peer that failed (gloo names a connection: cnccl names the rank whose process
        # exited) and how long the survivor waited.
        assert "DistBackendError" in first["error"] and "allreduce (seq" in first["error"], first["error"]
        assert re.search(r"after \d+ ms", first["error"]), first["error"]
        peer = int(re.search(r"\[peer rank (\d+)\]", first["error"]).group(1))
        if gloo and peer != victim:
            # A survivor that learned of the death through a neighbour may find that neighbour's process
            # gone too by then (it failed and exited first): named with its pid, also true.
            assert records[0, peer]["error"] and f"rank {peer}: its process" in first["error"], first["error"]
        else:
            assert peer == victim, first["error"]
        waited = first["failed_at"] - signalled
        assert waited < bound, f"survivor {rank} failed {waited:.1f} s after rank {victim} stopped: {first['error']}"
    for rank in range(world):
        second = records.get((1, rank))
        assert second and second.get("finished"), f"rank {rank} did not finish the restarted attempt: {second}\n{log}"
        # Resumed from the last checkpoint every rank finished: the step before the victim's.
        assert second["resumed_at"] == KILL_STEP and second["steps"][-1] == STEPS, second


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("engine", ["shm", "ucx", "gloo"])
def test_a_killed_rank_fails_its_peers_promptly_and_torchrun_restarts_the_job(tmp_path, engine, world):
    victim = world // 2
    records, log = run(tmp_path, engine, world, victim, "SIGKILL", GROUP_TIMEOUT_S)
    check_restart(records, log, world, victim, PROMPT_SECONDS, gloo=engine == "gloo")


def test_a_stopped_rank_is_ended_by_the_group_timeout_and_torchrun_restarts_the_job(tmp_path):
    records, log = run(tmp_path, "shm", 2, 1, "SIGSTOP", STOPPED_TIMEOUT_S)
    # The survivor waits out its group's timeout (the stopped rank is alive), then fails naming it.
    check_restart(records, log, 2, 1, STOPPED_TIMEOUT_S + PROMPT_SECONDS)
    error = records[0, 0]["error"]
    assert "timed out after 10000 ms" in error and "[peer rank 1]" in error, error

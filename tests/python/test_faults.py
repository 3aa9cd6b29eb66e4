"""A rank killed with SIGKILL in a stream of collectives, through shared memory and over UCX, and in
the collectives a shared-memory group sends over UCX (all_to_all, gather, point-to-point), and allreduces in power-of-two frames:
every survivor gets a DistBackendError naming the dead rank well before the group's timeout, never
an abort, the reduction that failed leaves its tensor as it was (or, for a shared-memory allreduce
without CNCCL_UNTOUCHED_ON_FAILURE, each element as it was or its result), destroy_process_group()
returns, and nothing of the job's shared memory outlives it.

"during" kills are injected at a named point (backend/host/fault_injection.h): the victim's k-th
shared-memory step posted, or its k-th large UCX send posted (a rendezvous in flight), so the kill
lands mid-transfer by construction."""

import json
import os
import re

import pytest

from harness import engine_env, launch, scratch_dir, wait_all

# Far above the detection bound: a survivor that only learns of the death at the timeout fails.
GROUP_TIMEOUT = 30.0
# What the design promises (docs/design.md, "Peer failure and teardown over UCX" and "Shared memory"):
# a peer on the same host is seen dead through its pidfd when the next wait idles (1 ms), whatever
# carries the data. 3 s: the job's ranks share two busy cores, and a survivor may first have to
# finish a chunk it was reducing.
DETECTION_SECONDS = 3.0
LARGE_SEND = "CNCCL_FAULT_SIGKILL_AT_LARGE_SEND"
SHM_STEP = "CNCCL_FAULT_SIGKILL_AT_SHM_STEP"


def sysv_segments_created_by(pids):
    with open("/proc/sysvipc/shm") as f:
        rows = [line.split() for line in f.readlines()[1:]]
    return [row for row in rows if int(row[4]) in pids]  # columns: key shmid perms size cpid ...


def dev_shm_files():
    """What cnccl or UCX could leave in /dev/shm (names of other programs' files are not looked at)."""
    return {name for name in os.listdir("/dev/shm") if "cnccl" in name or "ucx" in name}


def run(world_size, victim, engine, op, when, hook=None, untouched=False, collective=None):
    out = scratch_dir("faults-")
    here = os.path.dirname(os.path.abspath(__file__))
    dev_shm_before = dev_shm_files()
    env = {**engine_env(engine), **({hook[0]: f"{victim}:{hook[1]}"} if hook else {})}
    if untouched:
        env["CNCCL_UNTOUCHED_ON_FAILURE"] = "1"
    # Only allreduces write results as they arrive: through shared memory, in the chunked all-to-all over
    # UCX (the "allreduce" here is 4 MiB, past the direct exchange), and in frames (docs/design.md, "Where an
    # allreduce's results land"; docs/usage.md, failure semantics).
    may_be_partial = op in ("allreduce", "pow2") and not untouched
    store, procs = launch([os.path.join(here, "fault_worker.py"), str(victim), "3", str(GROUP_TIMEOUT), when, op],
                          world_size, env, out)
    codes = wait_all(procs, 120)
    del store
    assert dev_shm_files() - dev_shm_before == set(), "files left in /dev/shm"
    assert sysv_segments_created_by({p.pid for p in procs}) == [], "SysV segments left behind"
    assert codes[victim] == -9, f"the victim should have died of SIGKILL, exit codes {codes}"
    failed_in = []  # the collective each survivor's error names
    states = []  # each survivor's tensor after the failure: unmodified or partial
    for rank in range(world_size):
        if rank == victim:
            continue
        assert codes[rank] == 0, f"survivor {rank} exited with {codes[rank]} (crash, abort or hang), codes {codes}"
        with open(os.path.join(out, f"rank{rank}.json")) as f:
            result = json.load(f)
        assert result["error"], f"rank {rank} saw no error: {result}"
        assert "cnccl" in result["error"], result
        failed_in.append(result["error"].split(" (")[0])
        # The peer it waited on: the victim itself, or (at 3+ ranks) a survivor that failed on it.
        peer = re.search(r"\[peer rank (\d+)\]|rank (\d+) reported", result["error"])
        assert peer and int(peer.group(1) or peer.group(2)) != rank, result
        if world_size == 2:
            assert f"[peer rank {victim}]" in result["error"], result
        assert result.get("failed_tensor", "unmodified") in (("unmodified", "partial") if may_be_partial else
                                                              ("unmodified",)), result
        states.append(result.get("failed_tensor", "unmodified"))
        assert result["seconds_to_error"] < DETECTION_SECONDS, result
        assert result["destroy_seconds"] < 15, result
        assert result["segments_mapped"] == [], result
    # The kill lands inside that collective: some survivor fails in it (another may have had all it
    # needed from the victim, and fail in the next one).
    assert collective is None or f"cnccl: {collective}" in failed_in, failed_in
    return states


@pytest.mark.parametrize("engine", ["shm", "ucx"])
@pytest.mark.parametrize("world_size,victim", [(w, v) for w in (2, 3, 4) for v in range(w)])
def test_sigkilled_between_collectives(world_size, victim, engine):
    run(world_size, victim, engine, "allreduce", "between")


# Allreduce of 4 MiB in chunks: the 38th step is inside an allreduce: the third at 2 ranks (17 steps
# each with its broadcast: ranks that spin take 128 KiB chunks), the seventh at 3 ranks (6 steps) and
# the eighth at 4 (5 steps: ranks that share cores fill 512 KiB slots); over UCX alone the 5th large
# send is inside the first allreduce (fp16 on the wire: at 2 ranks 4 chunks of 256 KiB to the owner and 4
# results, interleaved).
@pytest.mark.parametrize("world_size,victim", [(2, 1), (3, 0), (4, 2)])
@pytest.mark.parametrize("engine,hook", [("shm", (SHM_STEP, 38)), ("ucx", (LARGE_SEND, 5))])
def test_sigkilled_during_an_allreduce(world_size, victim, engine, hook):
    states = run(world_size, victim, engine, "allreduce", "during", hook)
    if engine == "shm":
        # The positive control of the untouched case below: without the option this kill point leaves a
        # survivor's tensor partly written, so that case's "unmodified" is the option's doing.
        assert "partial" in states, states


# The same through shared memory with the tensor kept as it was until the last chunk is in.
@pytest.mark.needs_host_path
@pytest.mark.parametrize("world_size,victim", [(2, 1), (3, 0), (4, 2)])
def test_sigkilled_during_an_allreduce_that_leaves_its_tensor_untouched(world_size, victim):
    run(world_size, victim, "shm", "allreduce", "during", (SHM_STEP, 38), untouched=True)


# Synchronous allreduces of 256 KiB, one or two steps each and run on the caller's thread: the victim
# dies right after posting its 7th step (every survivor is then waiting in that call, on its own thread).
@pytest.mark.needs_host_path
@pytest.mark.parametrize("world_size,victim", [(2, 0), (3, 2)])
def test_sigkilled_during_an_allreduce_on_the_callers_thread(world_size, victim):
    run(world_size, victim, "shm", "sync_allreduce", "during", (SHM_STEP, 7))


# Allreduces in power-of-two frames (4 MiB of fp32, fp16 frames): pieces through shared memory on one
# host, an all-to-all of chunks pipelined over UCX alone. The kill lands inside the first allreduce
# (the 5th shared-memory step: at least 8 per allreduce here, more where ranks spin on cores of their
# own, or the 3rd large UCX send: 4 chunks of 256 KiB to the owner at 2 ranks).
@pytest.mark.parametrize("world_size,victim", [(2, 1), (3, 0), (4, 2)])
@pytest.mark.parametrize("engine,hook", [("shm", (SHM_STEP, 5)), ("ucx", (LARGE_SEND, 3))])
def test_sigkilled_during_an_allreduce_in_frames(world_size, victim, engine, hook):
    run(world_size, victim, engine, "pow2", "during", hook, collective="allreduce")


# ... and with the tensor kept as it was until the last frame is in: kills late enough that without
# CNCCL_UNTOUCHED_ON_FAILURE the survivors' tensors are partly written (on this 2-core machine: the
# shared-memory step count depends on whether ranks have cores of their own, the UCX one does not: at 2
# ranks the 13th large send is the second allreduce's 5th, 8 a call; at 4 the 10th is the first's, of 12).
@pytest.mark.parametrize("world_size,victim,engine,hook", [(4, 2, "shm", (SHM_STEP, 6)),
                                                           (2, 1, "ucx", (LARGE_SEND, 13)),
                                                           (4, 2, "ucx", (LARGE_SEND, 10))])
@pytest.mark.parametrize("untouched", [True, False], ids=["untouched", "control"])
def test_sigkilled_during_an_allreduce_in_frames_that_leaves_its_tensor_untouched(world_size, victim, engine, hook,
                                                                                  untouched):
    states = run(world_size, victim, engine, "pow2", "during", hook, untouched=untouched, collective="allreduce")
    if not untouched:
        # The positive control: without the option the same kill leaves a survivor's tensor partly written.
        assert "partial" in states, states


# On a shared-memory group with UCX's default transports, the collectives that go over UCX; the
# victim dies right after posting its 3rd large send (gather: a non-root, the root sends nothing).
@pytest.mark.needs_host_path
@pytest.mark.parametrize("op,victim", [("all_to_all", 0), ("gather", 1), ("p2p", 1)])
def test_sigkilled_during_a_collective_over_ucx_on_a_shared_memory_group(op, victim):
    run(2, victim, "shm", op, "during", (LARGE_SEND, 3))

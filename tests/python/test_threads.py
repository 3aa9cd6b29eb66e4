"""Every thread a group starts ends with it, on each CPU engine (docs/design.md, "Threads").

- A destroyed group leaves no thread behind: ranks create, use (synchronous and asynchronous
  collectives) and destroy three groups, and `/proc/self/task` then counts as many threads as
  before them, within BOUND_S (the engines' process-wide threads, such as UCX's async thread, are
  started by a first group before the count).
- A job that exits without `destroy_process_group`, groups still alive and a collective's work still
  held, exits 0: no thread of a group tears it down during interpreter finalization.
- A cpu_engine=gloo group's gloo group runs one worker thread, not gloo's default two: two workers
  finishing works at once race in torch's ProcessGroupGloo::runLoop (python/cnccl/_registration.py,
  _gloo_engine), counted by their name.
- A group destroyed or aborted while its issuer holds a job that every rank agreed on and that is
  not yet issued to gloo (held there by the test-only pause `CNCCL_TEST_ISSUER_DELAY`,
  backend/composed/issuer.cpp): neither crashes nor hangs, the job's work fails naming why, and the
  job is never issued, so the caller's tensor is left as it was, as the error says.

Each rank runs this file as a script in a fresh process (harness.launch), so no other test's threads
are counted.
"""

import json
import os
import sys
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
BOUND_S = 2.0
PAUSE_MS = 1500  # the issuer's pause before it issues a job (the mid-issue test)
EXITS = 5  # runs of the exit test per engine (each a fresh job)
RELEASE_PAUSE_MS = 300  # a completion thread's pause before it drops a completed work
HOLD_S = 1.0  # an exit handler keeps the GIL that long, past the pause
FINALIZE_S = 1.0  # then finalization lasts that long


def threads():
    return len(os.listdir("/proc/self/task"))


def gloo_workers():
    """ProcessGroupGloo's worker threads (torch names them pt_gloo_runloop), started by its constructor."""
    names = []
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/comm") as f:
                names.append(f.read().strip())
        except FileNotFoundError:  # a thread that ended meanwhile
            pass
    return names.count("pt_gloo_runloop")


class SlowToFinalize:
    """Held by a module global: the interpreter drops it while it finalizes, and then waits."""

    def __del__(self, sleep=time.sleep):
        sleep(FINALIZE_S)  # releases the GIL, as the engines' teardown there does


def hold_the_gil():
    """An exit handler that keeps the GIL for HOLD_S, as a long one does: threads that ask for it then
    wait, and get it only once the interpreter is finalizing."""
    sys.setswitchinterval(10 * HOLD_S)
    end = time.monotonic() + HOLD_S
    while time.monotonic() < end:
        pass


def rank_main(mode, engine):
    import datetime

    import torch
    import torch.distributed as dist

    import cnccl
    from harness import connect_store

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", store=connect_store(), rank=rank, world_size=world)
    options = dict(cpu_engine="gloo") if engine == "gloo" else dict(cpu_engine="ucx", shm="on" if engine == "shm" else "off")

    def use(group):
        t = torch.ones(1 << 16, requires_grad=True).clone()
        dist.all_reduce(t, group=group)
        work = dist.all_reduce(t, group=group, async_op=True)
        work.get_future().then(lambda f: f.value())
        work.wait()
        dist.all_reduce(torch.ones(8), op=dist.ReduceOp.AVG, group=group)
        return work

    def one_group():
        group = dist.new_group(backend="cnccl", timeout=datetime.timedelta(seconds=60),
                               pg_options=cnccl.Options(**options))
        use(group)
        dist.destroy_process_group(group)

    if mode in ("destroy_mid_issue", "abort_mid_issue"):
        group = dist.new_group(backend="cnccl", timeout=datetime.timedelta(seconds=60),
                               pg_options=cnccl.Options(cpu_engine="gloo"))
        t = torch.ones(1 << 16)
        work = dist.all_reduce(t, group=group, async_op=True)
        time.sleep(PAUSE_MS / 3000)  # the ranks have agreed; each issuer is in its pause
        start = time.monotonic()
        if mode == "destroy_mid_issue":
            dist.destroy_process_group(group)
        else:
            group.abort()
        ended_s = time.monotonic() - start
        try:
            work.wait()
            error = None
        except Exception as e:  # noqa: BLE001 - the message is the result
            error = str(e)
        time.sleep(PAUSE_MS / 1000)  # past the pause: an issued job would have written the tensor by now
        if mode == "abort_mid_issue":
            dist.destroy_process_group(group)
        with open(os.path.join(os.environ["CNCCL_TEST_OUT"], f"rank{rank}.json"), "w") as f:
            json.dump({"error": error, "unchanged": bool((t == 1).all()), "ended_s": ended_s}, f)
        dist.destroy_process_group()
        return
    if mode == "gloo_workers":
        from torch.distributed import HashStore, ProcessGroupGloo

        def settled_count():
            # A worker names itself once it runs: count until five samples 0.1 s apart agree.
            counts = [gloo_workers()]
            while len(counts) < 5 or len(set(counts[-5:])) > 1:
                time.sleep(0.1)
                counts.append(gloo_workers())
            return counts[-1]

        def workers_added(make):
            before = settled_count()
            kept = make()
            return settled_count() - before, kept

        # gloo's own default (two workers), to show that its workers are counted, then cnccl's group.
        default_added, _ = workers_added(lambda: ProcessGroupGloo(HashStore(), 0, 1))
        cnccl_added, _ = workers_added(lambda: dist.new_group(backend="cnccl", pg_options=cnccl.Options(cpu_engine="gloo")))
        with open(os.path.join(os.environ["CNCCL_TEST_OUT"], f"rank{rank}.json"), "w") as f:
            json.dump({"gloo_default": default_added, "cnccl_gloo_group": cnccl_added}, f)
        dist.destroy_process_group()
        return
    if mode in ("exit", "exit_finalizing_slowly"):
        if mode == "exit_finalizing_slowly":
            global finalizing_slowly
            finalizing_slowly = SlowToFinalize()
            import atexit

            from cnccl import _C  # noqa: F401 - its exit handler first, so the one below runs before it

            atexit.register(hold_the_gil)
        kept = [dist.new_group(backend="cnccl", pg_options=cnccl.Options(**options)) for _ in range(2)]
        works = [use(g) for g in kept]
        dist.barrier()
        sys.exit(0 if kept and works else 1)  # no destroy_process_group: groups and works alive at exit
    one_group()  # starts the process-wide threads
    dist.barrier()
    before = threads()
    for _ in range(3):
        one_group()
    deadline = time.monotonic() + BOUND_S
    while threads() > before and time.monotonic() < deadline:
        time.sleep(0.02)
    after = threads()
    with open(os.path.join(os.environ["CNCCL_TEST_OUT"], f"rank{rank}.json"), "w") as f:
        json.dump({"before": before, "after": after}, f)
    dist.destroy_process_group()


ENGINES = ["shm", "ucx", "gloo"]


def run(mode, engine, world=2, env=None):
    from harness import launch, scratch_dir, wait_all

    out = scratch_dir("threads-")
    # Fresh interpreters: these tests are about what a process does at exit.
    store, procs = launch([os.path.abspath(__file__), mode, engine], world, env or {}, out, fresh=True)
    codes = wait_all(procs, 180)
    del store
    return out, codes


@pytest.mark.parametrize("engine", ENGINES)
def test_a_destroyed_group_leaves_no_thread_behind(engine):
    out, codes = run("destroy", engine)
    assert codes == [0, 0], f"ranks exited with {codes}"
    for rank in range(2):
        with open(os.path.join(out, f"rank{rank}.json")) as f:
            counts = json.load(f)
        assert counts["after"] <= counts["before"], (
            f"rank {rank} on {engine}: {counts['after'] - counts['before']} threads outlived three destroyed groups "
            f"by {BOUND_S} s ({counts})")


def test_a_gloo_engine_group_runs_one_gloo_worker():
    # Its devices are gloo's own choice, GLOO_SOCKET_IFNAME as torch reads it (an empty last piece dropped).
    out, codes = run("gloo_workers", "gloo", world=1, env={"GLOO_SOCKET_IFNAME": "lo,"})
    assert codes == [0], f"the rank exited with {codes}"
    with open(os.path.join(out, "rank0.json")) as f:
        added = json.load(f)
    assert added["gloo_default"] == 2, f"gloo's default group started {added['gloo_default']} pt_gloo_runloop threads"
    assert added["cnccl_gloo_group"] == 1, f"a cpu_engine=gloo group started {added['cnccl_gloo_group']} gloo workers"


@pytest.mark.parametrize("engine", ENGINES)
def test_a_job_that_never_destroys_its_groups_exits_cleanly(engine):
    for attempt in range(EXITS):
        _, codes = run("exit", engine)
        assert codes == [0, 0], f"run {attempt + 1} of {EXITS} on {engine}: ranks exited with {codes}"


def test_a_job_that_exits_while_a_completion_still_holds_its_work_exits_cleanly():
    # Each completion thread pauses after completing a work and before dropping it; meanwhile the
    # job exits and an exit handler holds the GIL, so the drop of the job's last works (whose tensors
    # hold PyObjects) waits for the GIL and would get it only once the interpreter finalizes, and a
    # thread that is not Python's and gets the GIL then is ended by pthread_exit: the process aborts
    # ("terminate called without an active exception"). The release gate (backend/release_gate.h)
    # closes at exit after those drops end, and leaks later ones.
    for attempt in range(2):
        _, codes = run("exit_finalizing_slowly", "gloo", env={"CNCCL_TEST_ISSUER_DELAY": f"before_release:{RELEASE_PAUSE_MS}"})
        assert codes == [0, 0], f"run {attempt + 1}: ranks exited with {codes}"


@pytest.mark.parametrize("how", ["destroy", "abort"])
def test_a_group_ended_between_agreement_and_issue_never_issues(how):
    out, codes = run(f"{how}_mid_issue", "gloo", env={"CNCCL_TEST_ISSUER_DELAY": f"before_issue:{PAUSE_MS}"})
    assert codes == [0, 0], f"ranks exited with {codes}"
    why = "shutdown()" if how == "destroy" else "abort()"
    for rank in range(2):
        with open(os.path.join(out, f"rank{rank}.json")) as f:
            result = json.load(f)
        assert result["error"] is not None, f"rank {rank}: the work of a {how}ed group completed"
        assert why in result["error"] and "were not modified" in result["error"], f"rank {rank}: {result['error']}"
        assert result["unchanged"], f"rank {rank}: the tensor was written after its work failed ({how})"
        # destroy joins the issuer, which ends when its pause does; abort waits for nothing.
        bound = PAUSE_MS / 1000 + BOUND_S if how == "destroy" else BOUND_S
        assert result["ended_s"] < bound, f"rank {rank}: {how} took {result['ended_s']:.2f} s (bound {bound} s)"


if __name__ == "__main__":
    sys.path.insert(0, HERE)
    rank_main(sys.argv[1], sys.argv[2])

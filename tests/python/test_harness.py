"""The job runner itself (harness.py): one case that fails part way must not fail the cases after it,
a rank that stops early must be reported with its cause, not as a job that "wrote no results", and a
case that hangs must be reported within its budget with every rank's stack.

Both were seen in CI: a disagreement case that failed on one rank before it created its second group
left that rank one group behind, so every later group (torch names them by count) timed out and the
whole job died with four bare exit codes.
"""

import datetime
import json
import os
import time

import pytest
import torch
import torch.distributed as dist

from harness import Cases, gloo_group, run_job

case = Cases()
crash = Cases()
hang = Cases()


class Context:
    def __init__(self, rank, world):
        self.rank, self.world = rank, world
        self.gloo = gloo_group()


@case
def fails_on_rank_1_before_creating_a_group(ctx):
    if ctx.rank == 1:
        raise AssertionError("deliberate failure before the group")
    g = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=5))
    dist.destroy_process_group(g)


@case
def later_cases_get_working_groups(ctx):
    t = torch.ones(3)
    dist.all_reduce(t, group=ctx.gloo)
    assert torch.equal(t, torch.full((3,), float(ctx.world)))


@crash
def passes_first(ctx):
    pass


@crash
def rank_1_exits_mid_case(ctx):
    if ctx.rank == 1:
        print("rank 1's last words", flush=True)
        os._exit(3)


HANG_BUDGET_S = 5


def rank_0_sleeps_past_the_budget():
    time.sleep(10 * HANG_BUDGET_S)


def rank_1_waits_for_rank_0(ctx):
    t = torch.ones(1)
    dist.all_reduce(t, group=ctx.gloo)


@hang
def passes_before_the_hang(ctx):
    pass


@hang(budget=HANG_BUDGET_S)
def hangs(ctx):
    if ctx.rank == 0:
        rank_0_sleeps_past_the_budget()
    else:
        rank_1_waits_for_rank_0(ctx)


def test_a_failure_part_way_leaves_later_cases_working():
    results = run_job(__name__, 2, timeout=200)
    assert "deliberate failure before the group" in (results["fails_on_rank_1_before_creating_a_group"] or "")
    assert results["later_cases_get_working_groups"] is None, results["later_cases_get_working_groups"]


def test_a_shared_job_isolates_each_module():
    """Modules run one after another in one job (harness.share): a case that fails part way and a
    Context that fails on one rank fail only their own module's cases; the next module gets a working
    Context and groups, and the earlier modules' groups are gone."""
    modules = [__name__, "harness_probe_broken", "harness_probe_after"]
    results = run_job(modules, 2, timeout=300)
    ours = results[__name__]
    assert "deliberate failure before the group" in (ours["fails_on_rank_1_before_creating_a_group"] or "")
    assert ours["later_cases_get_working_groups"] is None, ours["later_cases_get_working_groups"]
    broken = results["harness_probe_broken"]["needs_the_context"] or ""
    assert "harness_probe_broken's Context failed on this rank" in broken, broken
    assert "deliberate failure in the Context" in broken and "failed on another rank" in broken, broken
    after = results["harness_probe_after"]
    assert after == {"earlier_modules_left_no_groups": None, "its_groups_work": None}, after


def test_a_rank_that_stops_early_is_reported_with_its_log():
    # Rank 0 waits for rank 1 in the harness's step group; with rank 1 gone it fails at once.
    results = run_job(__name__, 2, timeout=200, env={"CNCCL_TEST_CASES": "crash"})
    assert results["passes_first"] is None, results["passes_first"]
    failure = results["rank_1_exits_mid_case"] or ""
    assert "rank 1 of test_harness (world 2) stopped early" in failure, failure
    assert "exit codes [" in failure and "rank 1's last words" in failure, failure


def test_a_hanging_case_is_reported_within_its_budget_with_every_ranks_stack():
    start = time.monotonic()
    results = run_job(__name__, 2, timeout=200, env={"CNCCL_TEST_CASES": "hang"})
    elapsed = time.monotonic() - start
    assert results["passes_before_the_hang"] is None, results["passes_before_the_hang"]
    failure = results["hangs"] or ""
    # The budget, the ranks' start (importing torch, two groups) and the dump, with room for a slow machine.
    assert elapsed < HANG_BUDGET_S + 60, f"reported after {elapsed:.0f} s"
    for rank, where in ((0, "rank_0_sleeps_past_the_budget"), (1, "rank_1_waits_for_rank_0")):
        assert f"rank {rank} of test_harness (world 2): case hangs ran past its budget" in failure, failure
        assert where in failure, failure


# Launched by the test below through harness.launch: prints what its process sees, then exits with the
# code in argv[1] (or sleeps, to be killed).
_PROBE = r"""
import json, os, sys
# One write per line: the ranks share the file, and a print() may be two writes (PYTHONUNBUFFERED).
os.write(1, (json.dumps({"name": __name__, "argv": sys.argv, "cwd": os.getcwd(),
                         "rank": os.environ["RANK"], "setting": os.environ.get("CNCCL_TEST_PROBE_SETTING"),
                         "preloaded": "torch" in sys.modules}) + "\n").encode())
if sys.argv[1] == "sleep":
    import time
    time.sleep(60)
sys.exit(int(sys.argv[1]))
"""


def _probe(tmp_path, env, code=3, fresh=False):
    from harness import launch, wait_all

    script = tmp_path / "probe.py"
    script.write_text(_PROBE)
    out = tmp_path / f"out{len(list(tmp_path.iterdir()))}"
    with open(out, "w") as f:
        saved = os.dup(1)
        os.dup2(f.fileno(), 1)  # what a launched rank inherits as its stdout
        try:
            store, procs = launch([str(script), str(code)], 2, env, str(tmp_path), fresh=fresh)
        finally:
            os.dup2(saved, 1)
            os.close(saved)
        codes = wait_all(procs, 60)
    del store
    return codes, [json.loads(line) for line in out.read_text().splitlines()]


@pytest.mark.skipif(os.environ.get("CNCCL_TEST_FORKSERVER") == "0", reason="CNCCL_TEST_FORKSERVER=0: every rank starts fresh")
def test_a_forked_rank_is_the_script_run_as_python_would(tmp_path):
    """Ranks forked by forkserver.py (harness.launch) see what `python script` would: `__main__`, their
    argv, environment and folder, their exit code, the launcher as parent; a variable the server's
    imports might have read makes a fresh interpreter; a forked rank can be killed."""
    codes, seen = _probe(tmp_path, {"CNCCL_TEST_PROBE_SETTING": "a"})
    assert codes == [3, 3]
    assert sorted(s["rank"] for s in seen) == ["0", "1"]
    for s in seen:
        assert s["name"] == "__main__" and s["argv"][1:] == ["3"] and s["setting"] == "a"
        assert s["cwd"] == os.path.dirname(os.path.abspath(__file__))
        assert s["preloaded"], "launched fresh: the fork server did not start these ranks"
    # Read at import by torch: the server's copy may be stale, so these ranks start fresh.
    codes, seen = _probe(tmp_path, {"TORCH_CPP_LOG_LEVEL": "INFO"}, code=0)
    assert codes == [0, 0] and not any(s["preloaded"] for s in seen)
    codes, seen = _probe(tmp_path, {}, code=0, fresh=True)
    assert codes == [0, 0] and not any(s["preloaded"] for s in seen)

    from harness import launch, wait_all

    store, procs = launch([str(tmp_path / "probe.py"), "sleep"], 1, {}, str(tmp_path))
    with open(f"/proc/{procs[0].pid}/stat") as f:
        parent = int(f.read().rsplit(")", 1)[1].split()[1])
    assert parent == os.getpid(), "a forked rank must be the launcher's child once launch() returns"
    procs[0].kill()
    assert wait_all(procs, 10) == [-9]
    del store

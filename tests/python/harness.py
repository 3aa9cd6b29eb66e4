"""Runs many cases inside one multi-process job, so ranks are started once for many cases.

A test module holds its cases and its pytest functions together (tests/README.md): `case = Cases()`,
then `@case` on each case; `run_job(module, world_size)` launches the ranks (gloo and cnccl groups
over one TCPStore), imports the module in each, runs its cases on every rank, and returns
{case name: failure text or None}. A case fails if it fails on any rank.

Starting ranks (importing torch on 2-4 processes of a 2-core machine) is most of what a job costs, so
the modules whose jobs differ only by CPU engine and world size share them: `share(__name__,
engines, world_sizes)` at a module's top, then `shared_job(__name__, world_size, engine)` in its
tests. The first test that asks launches one job for that (engine, world size) which runs, module by
module, the cases of every shared module that pytest selected for it; each module builds its own
Context, and the groups a module created are destroyed before the next one starts.

What keeps one job's outcome from depending on anything but its cases:
- The store's server lives in the launching process on a port the kernel picked (port 0), so no
  port is found free, released and then raced for.
- Ranks start with no inherited CNCCL_* or UCX_* variable: only what the test passes applies.
- After a case fails on any rank, every rank builds its module's Context again (fresh groups), so
  a group left unusable by one failure does not fail the cases after it. The default group
  cannot be rebuilt: cases that use it say so by failing with the earlier failure's message.
- After a failed case the ranks also agree again on how many groups they have created (torch names
  groups by that count), since a case that failed part way may have created fewer on some ranks.
- Each rank's output goes to a log in the job's folder; a rank that stops early fails the cases
  it did not finish with its error and the end of that log.
- A watchdog in every rank (faulthandler) ends a rank whose case runs past its budget, after
  writing every Python thread's stack to its log; the case's failure quotes that dump for each
  rank it fired on. A rank still running at the job's timeout is killed and reported as such.
- `cached_job` keeps a job's exception as well as its results: a job that timed out is not
  launched again for each of its parametrized tests.
- In a shared job a module whose Context fails on some rank fails its own cases with that error;
  the ranks realign and go on with the next module.
"""

import atexit
import ctypes
import datetime
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import traceback

# How long one case may run on a rank, the harness's step after it included, before the watchdog
# dumps every thread's Python stack into the rank's log and ends the rank: well above the slowest
# case's time on a 2-core machine, and below a job's timeout, so a hang is reported with its stacks
# instead of as a job that was killed. `@case(budget=...)` sets another.
CASE_BUDGET_S = 600


class Cases:
    """The cases of one job: `@cases` or `@cases(min_world=2)` on a function taking the module's
    Context. A module may hold several (one per job it runs); a job runs the one named by the
    CNCCL_TEST_CASES variable of its environment, `case` by default."""

    def __init__(self):
        self.all = {}
        self.only = {}  # name: (predicate of (world, engine), why it runs nowhere else)

    def __call__(self, fn=None, *, min_world=1, budget=CASE_BUDGET_S, only=None):
        def register(f):
            self.all[f.__name__] = (f, min_world, budget)
            if only:
                self.only[f.__name__] = only
            return f

        return register(fn) if fn is not None else register

    def names(self):
        return sorted(self.all)

    def min_world(self, name):
        return self.all[name][1]

    def not_here(self, name, world, engine):
        """Why case `name` does not run at this world size on this engine, or None where it does."""
        if world < self.min_world(name):
            return f"needs at least {self.min_world(name)} ranks"
        predicate, why = self.only.get(name, (None, None))
        return why if predicate and not predicate(world, engine) else None


# A case's collectives, cnccl's and gloo's alike, fail after this instead of hanging: a case that
# fails on some ranks only leaves the others waiting in its next collective.
CASE_TIMEOUT = datetime.timedelta(seconds=120)


def gloo_group():
    """A gloo group over every rank for a case module's reference computations."""
    import torch.distributed as dist

    return dist.new_group(backend="gloo", timeout=CASE_TIMEOUT)


def everyones(t, group):
    """Every rank's `t`, in rank order, gathered over `group` (a gloo group): what oracles start from."""
    import torch
    import torch.distributed as dist

    out = [torch.empty_like(t) for _ in range(dist.get_world_size(group))]
    dist.all_gather(out, t.contiguous(), group=group)
    return out


def clean_env(**extra):
    """The caller's environment without cnccl's and UCX's settings (CNCCL_*, UCX_*; the harness's own
    CNCCL_TEST_* stay), plus `extra`."""
    env = {k: v for k, v in os.environ.items()
           if k.startswith("CNCCL_TEST_") or not k.startswith(("CNCCL_", "UCX_"))}
    env.update(extra)
    return env


def store_server(world_size):
    """A TCPStore server on a port the kernel chose; ranks connect with `connect_store`."""
    import torch.distributed as dist

    return dist.TCPStore("127.0.0.1", 0, world_size + 1, is_master=True, wait_for_workers=False,
                         timeout=datetime.timedelta(seconds=300))


def connect_store():
    import torch.distributed as dist

    return dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                         timeout=datetime.timedelta(seconds=300))


# Started inside a host's IPC namespace: starts that host's ranks (argv[1]: JSON list of
# [argv, env]) and exits with the first nonzero exit code among them, or 0.
_HOST_LAUNCHER = (
    "import json, subprocess, sys\n"
    "ps = [subprocess.Popen(a, env=e) for a, e in json.loads(sys.argv[1])]\n"
    "codes = [p.wait() for p in ps]\n"
    "sys.exit(next((c for c in codes if c), 0))\n"
)


def separate_hosts_unavailable():
    """Why ranks cannot be put in IPC namespaces of their own here, or None."""
    if shutil.which("unshare") is None:
        return "the `unshare` command (util-linux) is not installed"
    probe = subprocess.run(["unshare", "--ipc", "true"], capture_output=True, text=True)
    if probe.returncode != 0:
        return f"`unshare --ipc` failed (needs root or CAP_SYS_ADMIN): {probe.stderr.strip()}"
    return None


_SESSION_DIRS = {}
# The variable a caller sets to choose a session folder itself.
_SESSION_DIR_VARIABLES = {"inductor": "TORCHINDUCTOR_CACHE_DIR", "report": "CNCCL_TEST_REPORT_DIR"}
# The session folders made here, not chosen by the caller: removed when the session passes.
_MADE_SESSION_DIRS = []


def _session_dir(what):
    """Folders every job of this pytest run shares: "inductor", torch.compile's cache (each rank of
    each job compiling the same graphs again cost seconds per job); "report", where ranks write
    what they measured (CNCCL_TEST_REPORT_DIR, kept when the caller sets it; its .jsonl files are
    written afresh each run); "shared", results that no CPU engine changes (references computed on
    gloo alone), computed by the first job that needs them and read by the others; "scratch", the
    jobs' own folders (scratch_dir)."""
    if what not in _SESSION_DIRS:
        variable = _SESSION_DIR_VARIABLES.get(what)
        path = os.environ.get(variable) if variable else None
        if not path:
            path = tempfile.mkdtemp(prefix=f"cnccl-{what}-")
            _MADE_SESSION_DIRS.append(path)
        os.makedirs(path, exist_ok=True)
        if what == "report":
            for name in os.listdir(path):
                if name.endswith(".jsonl"):
                    os.remove(os.path.join(path, name))
        _SESSION_DIRS[what] = path
    return _SESSION_DIRS[what]


def scratch_dir(prefix):
    """A new folder for one job's files (its ranks' logs and reports), inside this session's scratch folder."""
    return tempfile.mkdtemp(prefix=prefix, dir=_session_dir("scratch"))


def end_session(passed):
    """Removes the session folders made here (a run's worth of folders a job and test each, left behind,
    filled /tmp), all when the session passed; after a failure it keeps the scratch folder, for its logs,
    and returns it."""
    kept = None if passed else _SESSION_DIRS.get("scratch")
    for path in _MADE_SESSION_DIRS:
        if path != kept:
            shutil.rmtree(path, ignore_errors=True)
    return kept


def _rank_env(**extra):
    """What every rank's environment holds besides its own settings."""
    return clean_env(OMP_NUM_THREADS="1", TORCHINDUCTOR_CACHE_DIR=_session_dir("inductor"),
                     CNCCL_TEST_REPORT_DIR=_session_dir("report"), CNCCL_TEST_SHARED_DIR=_session_dir("shared"),
                     **extra)


def launch(script_args, world_size, env, out, hosts=1, fresh=False):
    """Starts the ranks of `python script_args...` against a store this process holds; returns
    (store, processes). Keep the store alive until the ranks have exited. Ranks are forked from
    forkserver.py's process where their environment allows it; `fresh` starts new interpreters (for
    tests of what a process does at exit). With `hosts` > 1 the ranks are split into that many blocks
    of consecutive ranks, each started in an IPC namespace of its own (`unshare --ipc`), as on separate
    machines; the processes are then one per block."""
    store = store_server(world_size)
    here = os.path.dirname(os.path.abspath(__file__))
    argv = [sys.executable, *script_args]
    envs = [_rank_env(RANK=str(rank), WORLD_SIZE=str(world_size), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(store.port), CNCCL_TEST_OUT=out, **(env or {}))
            for rank in range(world_size)]
    if hosts == 1:
        server = None if fresh else _ForkServer.get()
        return store, [server.start(argv, e, here) if server and server.takes(e) else subprocess.Popen(argv, env=e, cwd=here)
                       for e in envs]
    per_host = world_size // hosts
    procs = []
    for h in range(hosts):
        ranks = json.dumps([[argv, envs[r]] for r in range(h * per_host, (h + 1) * per_host)])
        procs.append(subprocess.Popen(["unshare", "--ipc", sys.executable, "-c", _HOST_LAUNCHER, ranks], cwd=here))
    return store, procs


class _ForkServer:
    """The harness's side of forkserver.py: one server per pytest session, started on first use."""

    # Variables read only after a rank has started (by cnccl, UCX and torch.distributed when a group
    # is made, or by the harness and the tests): a rank whose environment differs from the server's
    # in anything else starts fresh, since torch or cnccl may have read it at import.
    LATE = ("CNCCL_", "UCX_", "RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "PYTEST_")
    _server = None
    _started = False

    @classmethod
    def get(cls):
        """The server, or None where it cannot run (CNCCL_TEST_FORKSERVER=0 or it refused)."""
        if not cls._started:
            cls._started = True
            if os.environ.get("CNCCL_TEST_FORKSERVER", "1") != "0":
                server = cls()
                cls._server = server if server.ready else None
        return cls._server

    def __init__(self):
        pr_set_child_subreaper = 36
        if ctypes.CDLL(None, use_errno=True).prctl(pr_set_child_subreaper, 1, 0, 0, 0) != 0:
            print(f"harness: no fork server (prctl: errno {ctypes.get_errno()})", file=sys.stderr)
            self.ready = False
            return
        self.sock, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.env = _rank_env()
        here = os.path.dirname(os.path.abspath(__file__))
        self.proc = subprocess.Popen([sys.executable, os.path.join(here, "forkserver.py"), str(theirs.fileno())],
                                     env=self.env, cwd=here, pass_fds=[theirs.fileno()])
        theirs.close()
        answer = self.sock.recv(256).decode()
        self.ready = answer == "ready"
        if not self.ready:
            print(f"harness: no fork server ({answer or 'it exited'})", file=sys.stderr)
        atexit.register(self.close)

    def close(self):
        self.sock.close()
        self.proc.wait()

    def takes(self, env):
        return all(k.startswith(self.LATE) for k in set(env) | set(self.env) if env.get(k) != self.env.get(k))

    def start(self, argv, env, cwd):
        socket.send_fds(self.sock, [json.dumps({"argv": argv, "env": env, "cwd": cwd}).encode()],
                        [1, 2])  # what a Popen child would inherit
        return _ForkedRank(int(self.sock.recv(64)), argv)


class _ForkedRank:
    """A forked rank, as much of `subprocess.Popen` as the tests use: the launcher is its parent (a
    child subreaper), so its exit status is waited for as any child's."""

    def __init__(self, pid, argv):
        self.pid, self.args, self.returncode = pid, argv, None

    def poll(self):
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout=None):
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(self.args, timeout)
            time.sleep(0.01)
        return self.returncode

    def kill(self):
        if self.poll() is None:
            os.kill(self.pid, 9)


def wait_all(procs, timeout):
    """Exit codes of every process within `timeout` seconds in all; what is left then is killed and
    reads as None."""
    deadline = time.monotonic() + timeout
    codes = []
    for p in procs:
        try:
            codes.append(p.wait(timeout=max(0.0, deadline - time.monotonic())))
        except subprocess.TimeoutExpired:
            codes.append(None)
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait()
    return codes


_JOBS = {}

# Every case's wall time (the slowest rank's), summed over the jobs that ran it, "module::case" ->
# seconds, and each job's launch: what conftest.py prints at the end of the session.
CASE_TIMES = {}
LAUNCHES = []
# Each job's count of cases run (on any rank).
CASE_RUNS = []
# The harness's own steps in a job, timed like cases: a module's Context, and its teardown.
_STEPS = ("::(context)", "::(teardown)")


def cached_job(module, world_size, **kwargs):
    """run_job once per (modules, world_size, env, hosts); later calls return its results or raise its error."""
    modules = module if isinstance(module, str) else tuple(module)
    key = (modules, world_size, tuple(sorted((kwargs.get("env") or {}).items())), kwargs.get("hosts", 1))
    if key not in _JOBS:
        try:
            _JOBS[key] = (run_job(module, world_size, **kwargs), None)
        except Exception as e:  # noqa: BLE001 - kept and raised again for every test of this job
            _JOBS[key] = (None, e)
    results, error = _JOBS[key]
    if error is not None:
        raise error
    return results


# The modules that share jobs: module -> (engines, world sizes, its part of a job's timeout).
_SHARED = {}
# The (module, engine, world size) of the tests pytest selected (conftest.py), or None: all.
_SELECTED = None


def share(module, engines, world_sizes, timeout=900):
    """Declares that `module`'s cases run in the shared job of each of these (engine, world size)."""
    _SHARED[module] = (tuple(engines), tuple(world_sizes), timeout)


def select(items):
    """Narrows the shared jobs to what pytest will run: each collected test's module, with its
    `engine` and `world_size` parameters where it has them (else every one its module declared)."""
    global _SELECTED
    _SELECTED = set()
    for module, params in items:
        if module in _SHARED:
            engines, sizes, _ = _SHARED[module]
            for engine in [params["engine"]] if "engine" in params else engines:
                for size in [params["world_size"]] if "world_size" in params else sizes:
                    _SELECTED.add((module, engine, size))


def shared_job(module, world_size, engine):
    """`module`'s results from the one job that runs, at this world size on this CPU engine, the
    cases of every shared module selected for it."""
    modules = [m for m, (engines, sizes, _) in sorted(_SHARED.items())
               if engine in engines and world_size in sizes and (_SELECTED is None or (m, engine, world_size) in _SELECTED)]
    if module not in modules:  # asked for outside pytest's selection
        modules = sorted(modules + [module])
    timeout = sum(_SHARED[m][2] if m in _SHARED else 900 for m in modules)
    return cached_job(modules, world_size, env=engine_env(engine), timeout=timeout)[module]


def run_job(module, world_size, timeout=900, env=None, hosts=1):
    """Starts `world_size` ranks of `python -m harness module` (on `hosts` simulated hosts, as
    `launch`) and returns the merged results. A rank that stopped early (an error outside its cases,
    a crash, the job's timeout) fails every case it did not finish, with what stopped it and the end
    of its log; a job in which no rank ran any case raises that instead. `module` may be a list of
    modules run one after another: the results are then {module: {case: failure}}."""
    modules = [module] if isinstance(module, str) else list(module)
    what = ",".join(modules)
    out = scratch_dir("job-")
    start = time.monotonic()
    store, procs = launch([os.path.abspath(__file__), what], world_size, env, out, hosts)
    codes = wait_all(procs, timeout)
    del store
    LAUNCHES.append((what, world_size, env or {}, time.monotonic() - start))
    reports = [_read_report(out, rank) for rank in range(world_size)]
    logs = {rank: _log_lines(out, rank) for rank, report in enumerate(reports) if not report["finished"]}
    stopped = {rank: _why_stopped(what, world_size, out, rank, log, reports[rank]["error"], codes, timeout)
               for rank, log in logs.items()}
    if not any(r["cases"] for r in reports) and stopped:
        raise RuntimeError("\n".join(stopped.values()))
    results = {}
    for rank, report in enumerate(reports):
        for name, failure in report["cases"].items():
            if failure:
                results[name] = (results.get(name) or "") + f"[rank {rank}] {failure}\n"
            else:
                results.setdefault(name, None)
    CASE_RUNS.append(sum(1 for name in results if not name.endswith(_STEPS)))
    for name in {name for report in reports for name in report.get("times", {})}:
        CASE_TIMES[name] = CASE_TIMES.get(name, 0.0) + max(r.get("times", {}).get(name, 0.0) for r in reports)
    for rank, why in stopped.items():
        # The case it stopped in, which no report names, fails with it too.
        current = _current_case(logs[rank])
        if current and current not in reports[rank]["cases"]:
            results.setdefault(current, None)
        for name in results:
            if name not in reports[rank]["cases"]:
                results[name] = (results.get(name) or "") + why + "\n"
    by_module = {m: {} for m in modules}
    for qualified, failure in results.items():
        m, name = qualified.split("::", 1)
        by_module[m][name] = failure
    if stopped:
        for m in modules:
            by_module[m][_NOT_REACHED] = "\n".join(stopped.values())
    return by_module[module] if isinstance(module, str) else by_module


# The results' entry for the cases no rank reached: why the job stopped before them.
_NOT_REACHED = "(not reached)"


def _current_case(log):
    """The case a rank's log says it started last (`_worker` prints "[rank N] case MODULE::NAME")."""
    for line in reversed(log):
        if line.startswith("[rank ") and "] case " in line:
            return line.split("] case ", 1)[1].strip()
    return None


# What faulthandler.dump_traceback_later writes first when the watchdog fires.
_WATCHDOG_MARK = "Timeout ("


def _why_stopped(module, world_size, out, rank, log, error, codes, timeout):
    fired = next((i for i, line in enumerate(log) if line.startswith(_WATCHDOG_MARK)), None)
    where = f"rank {rank} of {module} (world {world_size})"
    if fired is not None:
        case = (_current_case(log[:fired]) or "?").split("::", 1)[-1]
        return (f"{where}: case {case} ran past its budget; the watchdog's dump of every Python thread's stack "
                f"({out}/rank{rank}.log):\n" + "\n".join(log[fired:fired + 120]))
    if codes[rank] is None:
        cause = f"it was still running at the job's timeout ({timeout} s) and was killed; exit codes {codes}"
    else:
        cause = error or f"no Python error: it crashed or was killed; exit codes {codes}"
    return f"{where} stopped early: {cause}\nthe end of its log ({out}/rank{rank}.log):\n{_log_tail(log)}"


def _read_report(out, rank):
    path = os.path.join(out, f"rank{rank}.json")
    if not os.path.exists(path):
        return {"cases": {}, "times": {}, "finished": False, "error": None}
    with open(path) as f:
        return json.load(f)


def _log_lines(out, rank):
    try:
        with open(os.path.join(out, f"rank{rank}.log"), errors="replace") as f:
            return f.read().splitlines()
    except OSError as e:
        return [f"(no log: {e})"]


def _log_tail(text, lines=40):
    """The last lines of a rank's log, less UCX's warnings (a failed collective leaves many behind)."""
    kept = [line for line in text if "UCX  WARN" not in line]
    left_out = len(text) - len(kept)
    return "\n".join(kept[-lines:]) + (f"\n({left_out} UCX warnings left out)" if left_out else "")


# What carries CPU tensors' collectives: cnccl's host path through shared memory (every rank on
# this host; forced on, so a failed setup fails the job instead of falling back), the host path
# over UCX alone, or the composed path over torch's gloo. The collective, compression, parity,
# reliability and observability suites run each of their jobs on all three.
CPU_ENGINES = ["shm", "ucx", "gloo"]


def host_path_built():
    """Whether this build has the host path (the "shm" and "ucx" engines): not without UCX."""
    import cnccl

    return bool(cnccl.build_info()["ucx_version"])


NO_HOST_PATH = "this build has no UCX (CNCCL_WITH_UCX=OFF), so no host path: the shm and ucx engines do not exist"


def engine_of(env=os.environ):
    """The CPU engine a rank runs on, from its environment (engine_env's inverse)."""
    if env.get("CNCCL_CPU_ENGINE") == "gloo":
        return "gloo"
    return "shm" if env.get("CNCCL_SHM") == "on" else "ucx"


def engine_env(engine):
    return {"shm": {"CNCCL_CPU_ENGINE": "ucx", "CNCCL_SHM": "on"},
            "ucx": {"CNCCL_CPU_ENGINE": "ucx", "CNCCL_SHM": "off"},
            "gloo": {"CNCCL_CPU_ENGINE": "gloo"}}[engine]


def check_case(results, name, world_size, cases, engine=None):
    """The pytest side of one case: skipped where it does not run (`Cases.not_here`), else it must
    have passed."""
    import pytest

    why = cases.not_here(name, world_size, engine)
    if why:
        pytest.skip(why)
    failure = results.get(name, results.get(_NOT_REACHED, "case did not run"))
    assert failure is None, failure


def _realign_group_names(steps):
    """torch names a new group by how many groups this rank has created, and its ranks meet in the
    store under that name. A case that failed part way on some ranks may have left them having
    created fewer groups than the others; every later group would then wait for peers under
    another name until its timeout. All ranks continue from the highest count."""
    import torch
    import torch.distributed as dist
    from torch.distributed import distributed_c10d

    count = torch.tensor([distributed_c10d._world.group_count], dtype=torch.int64)
    dist.all_reduce(count, op=dist.ReduceOp.MAX, group=steps)
    distributed_c10d._world.group_count = int(count.item())


def _worker(modules):
    import faulthandler
    import importlib

    out, rank, world = os.environ["CNCCL_TEST_OUT"], int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    # Everything the rank prints, UCX's and torch's C++ output included, goes to its log, which a
    # failure quotes: a job's output interleaved from every rank would bury the one line that matters.
    log = os.open(os.path.join(out, f"rank{rank}.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(log, 1)
    os.dup2(log, 2)
    report = {"cases": {}, "times": {}, "finished": False, "error": None}

    def save():
        # Rewritten after every case, so a rank that dies later still reports what it finished.
        path = os.path.join(out, f"rank{rank}.json")
        with open(path + ".tmp", "w") as f:
            json.dump(report, f)
        os.replace(path + ".tmp", path)

    try:
        import torch
        import torch.distributed as dist
        from torch.distributed import distributed_c10d

        import cnccl  # noqa: F401

        dist.init_process_group("cnccl", store=connect_store(), rank=rank, world_size=world, timeout=CASE_TIMEOUT)
        # The harness's own group, which keeps ranks in step between cases: it outwaits the ranks that
        # are still failing their case's collectives one timeout at a time.
        steps = dist.new_group(backend="gloo", timeout=10 * CASE_TIMEOUT)

        def step(label, fn, budget, is_case=True):
            """Runs fn on every rank under the watchdog; returns (its value, this rank's failure text,
            whether it failed on any rank). A case's outcome is saved before the ranks compare."""
            print(f"[rank {rank}] case {label}", file=sys.stderr, flush=True)
            faulthandler.dump_traceback_later(budget, exit=True, file=sys.stderr)
            started = time.monotonic()
            value, failure = None, None
            try:
                value = fn()
            except Exception:  # noqa: BLE001 - every failure is reported, then the next case runs
                failure = traceback.format_exc(limit=6)
            report["times"][label] = round(time.monotonic() - started, 3)
            if is_case:
                report["cases"][label] = failure
                save()
            failed = torch.tensor([failure is not None], dtype=torch.int32)
            dist.all_reduce(failed, op=dist.ReduceOp.MAX, group=steps)
            faulthandler.cancel_dump_traceback_later()
            if failed.item():
                _realign_group_names(steps)
            return value, failure, bool(failed.item())

        for module in modules.split(","):
            mod = importlib.import_module(module)
            cases = getattr(mod, os.environ.get("CNCCL_TEST_CASES", "case"))
            earlier_groups = set(distributed_c10d._world.pg_map)

            def context():
                if not hasattr(mod, "Context"):
                    return None, None
                ctx, failure, failed = step(f"{module}::(context)", lambda: mod.Context(rank, world), CASE_BUDGET_S,
                                            is_case=False)
                return ctx, (f"{module}'s Context failed " +
                             (f"on this rank:\n{failure}" if failure else "on another rank")) if failed else None

            ctx, broken = context()
            for name, (fn, min_world, budget) in cases.all.items():
                if cases.not_here(name, world, engine_of()):
                    continue
                if broken:
                    report["cases"][f"{module}::{name}"] = broken
                    continue
                _, _, failed = step(f"{module}::{name}", lambda: fn(ctx), budget)
                if failed:
                    ctx, broken = context()
            save()
            # What this module's cases left behind (UCX workers, segments, gloo pairs) is not the next one's.
            ctx = None

            def destroy_groups():
                for group in [g for g in list(distributed_c10d._world.pg_map) if g not in earlier_groups]:
                    try:
                        dist.destroy_process_group(group)
                    except Exception as e:  # noqa: BLE001 - a group a case left broken may refuse
                        print(f"[rank {rank}] destroying a group of {module}: {e}", file=sys.stderr, flush=True)

            step(f"{module}::(teardown)", destroy_groups, CASE_BUDGET_S, is_case=False)
    except BaseException:
        report["error"] = traceback.format_exc(limit=8)
        save()
        raise
    report["finished"] = True
    save()
    dist.destroy_process_group()


if __name__ == "__main__":
    sys.modules["harness"] = sys.modules["__main__"]
    _worker(sys.argv[1])

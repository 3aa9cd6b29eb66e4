import os
import re
import sys
from collections import Counter

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import harness  # noqa: E402
from hosts import Nodes, unavailable  # noqa: E402


def require_namespaces(tools=("ip",)):
    """Skips naming why where namespaces (and `tools`) cannot be used, which CNCCL_REQUIRE_NETNS=1 (CI) turns
    into a failure."""
    why = unavailable(tools)
    if why:
        if os.environ.get("CNCCL_REQUIRE_NETNS") == "1":
            pytest.fail(f"CNCCL_REQUIRE_NETNS=1 but {why}")
        pytest.skip(why)


@pytest.fixture
def link_namespaces():
    """For a test whose program makes its own simulated hosts and shapes their link (`ip`, `tc`)."""
    require_namespaces(("ip", "tc"))


def simulated_hosts(hosts):
    """`hosts` simulated hosts (hosts.py); skips or fails as require_namespaces() does."""
    require_namespaces()
    n = Nodes(hosts)
    yield n
    n.close()


@pytest.fixture(scope="module")
def nodes():
    """Two simulated hosts for a module's tests, joined by one veth pair."""
    yield from simulated_hosts(2)


@pytest.fixture(scope="module")
def three_nodes():
    """Three simulated hosts for a module's tests, each with a veth to one bridge."""
    yield from simulated_hosts(3)


@pytest.fixture(scope="module")
def four_nodes():
    """Four simulated hosts, each with a veth to one bridge."""
    yield from simulated_hosts(4)


# Why a test may skip where CI runs it (CNCCL_KNOWN_SKIPS_ONLY=1): a skip for any other reason fails the
# run, so that a new one cannot hide among these. (pattern of the reason, why that skip is expected)
KNOWN_SKIPS = [
    (r"no CUDA GPU|torch is a CPU-only build|needs a CUDA GPU", "no GPU where CI runs"),
    (r"^needs at least \d+ ranks$", "a case for more ranks than its job has"),
    (r"^gloo's point-to-point is gloo's own$|^UCX tags carry the sequence over UCX alone|^parts of many chunks",
     "a case for one engine or world size alone"),
    (r"^checks a build without UCX", "the no-UCX build's own test (.ci/no_ucx.sh runs it)"),
]


def pytest_collection_modifyitems(config, items):
    # A build without UCX has no host path: what runs on it, or a module marked needs_host_path, skips,
    # unless the run requires the host path (CI's main build), where that build fails the run at once.
    if harness.host_path_built():
        return
    if os.environ.get("CNCCL_REQUIRE_HOST_PATH") == "1":
        raise pytest.UsageError(f"CNCCL_REQUIRE_HOST_PATH=1 but {harness.NO_HOST_PATH}")
    for item in items:
        engine = getattr(getattr(item, "callspec", None), "params", {}).get("engine")
        if engine in ("shm", "ucx") or item.get_closest_marker("needs_host_path"):
            item.add_marker(pytest.mark.skip(reason=harness.NO_HOST_PATH))


def pytest_configure(config):
    config.addinivalue_line("markers", "needs_host_path: runs only in a build with UCX (the host path)")


def pytest_collection_finish(session):
    # The shared jobs run the cases of the tests pytest selected, not of every module it imported,
    # and not of those that skip as a whole.
    harness.select((item.module.__name__, getattr(getattr(item, "callspec", None), "params", {}))
                   for item in session.items
                   if getattr(item, "module", None) is not None and not item.get_closest_marker("skip"))


def skip_reason(report):
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    return reason[len("Skipped: "):] if reason.startswith("Skipped: ") else reason


def unknown_skips(reports):
    return Counter(r for r in map(skip_reason, reports) if not any(re.search(p, r) for p, _ in KNOWN_SKIPS))


def pytest_sessionfinish(session, exitstatus):
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None and os.environ.get("CNCCL_KNOWN_SKIPS_ONLY") == "1":
        if unknown_skips(reporter.stats.get("skipped", [])) and session.exitstatus == 0:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
    # Before the terminal summary (the reporter writes it after every other sessionfinish), which names it.
    session.config.cnccl_kept_folder = harness.end_session(passed=session.exitstatus == 0)


def pytest_terminal_summary(terminalreporter):
    kept = getattr(terminalreporter.config, "cnccl_kept_folder", None)
    if kept:
        terminalreporter.write_line(f"harness: the jobs' folders (each rank's log and report) are kept in {kept}")
    skipped = terminalreporter.stats.get("skipped", [])
    if skipped:
        write = terminalreporter.write_line
        write("skips by reason:")
        for reason, n in Counter(map(skip_reason, skipped)).most_common():
            write(f"  {n:4d}  {reason}")
        unknown = unknown_skips(skipped)
        if unknown and os.environ.get("CNCCL_KNOWN_SKIPS_ONLY") == "1":
            write(f"CNCCL_KNOWN_SKIPS_ONLY=1: {sum(unknown.values())} skips for reasons not in conftest.py's "
                  f"KNOWN_SKIPS fail the run: {sorted(unknown)}", red=True)
    if not harness.LAUNCHES:
        return
    write = terminalreporter.write_line
    total = sum(seconds for *_, seconds in harness.LAUNCHES)
    write(f"harness: {len(harness.LAUNCHES)} jobs launched, {sum(harness.CASE_RUNS)} cases run in them, "
          f"{total:.0f} s in jobs")
    for what, world, env, seconds in sorted(harness.LAUNCHES, key=lambda j: -j[3])[:10]:
        engine = env.get("CNCCL_CPU_ENGINE", "")
        shm = {"on": "shm", "off": "ucx"}.get(env.get("CNCCL_SHM", ""), "") if engine == "ucx" else engine
        write(f"  {seconds:7.1f} s  world {world} {shm or '-':4s} {what}")
    write("harness: slowest cases (the slowest rank, summed over jobs)")
    for name, seconds in sorted(harness.CASE_TIMES.items(), key=lambda c: -c[1])[:15]:
        write(f"  {seconds:7.1f} s  {name}")

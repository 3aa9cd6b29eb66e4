import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import harness  # noqa: E402


def pytest_collection_finish(session):
    # The shared jobs run the cases of the tests pytest selected, not of every module it imported.
    harness.select((item.module.__name__, getattr(getattr(item, "callspec", None), "params", {}))
                   for item in session.items if getattr(item, "module", None) is not None)


def pytest_terminal_summary(terminalreporter):
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

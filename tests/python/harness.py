"""Runs many cases inside one multi-process job, so a test module starts its ranks once.

A worker module defines cases with @case; `run_job(module, world_size)` launches the ranks
(torch.multiprocessing, gloo and cnccl groups over one TCPStore), runs every case on every
rank, and returns {case name: failure text or None}. A case fails if it fails on any rank.
"""

import datetime
import json
import os
import socket
import subprocess
import sys
import tempfile
import traceback

CASES = {}


def case(fn=None, *, min_world=1):
    def register(f):
        CASES[f.__name__] = (f, min_world)
        return f

    return register(fn) if fn is not None else register


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_job(module, world_size, timeout=900, env=None):
    """Starts `world_size` ranks of `python -m harness module` and returns the merged results."""
    out = tempfile.mkdtemp(prefix="cnccl-test-")
    port = free_port()
    procs = []
    for rank in range(world_size):
        e = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(world_size), MASTER_ADDR="127.0.0.1",
                 MASTER_PORT=str(port), CNCCL_TEST_OUT=out, OMP_NUM_THREADS="1", **(env or {}))
        procs.append(subprocess.Popen([sys.executable, os.path.abspath(__file__), module], env=e,
                                      cwd=os.path.dirname(os.path.abspath(__file__))))
    try:
        codes = [p.wait(timeout=timeout) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    results = {}
    for rank in range(world_size):
        path = os.path.join(out, f"rank{rank}.json")
        if not os.path.exists(path):
            raise RuntimeError(f"rank {rank} of {module} (world {world_size}) wrote no results; exit codes {codes}")
        with open(path) as f:
            for name, failure in json.load(f).items():
                if failure:
                    results[name] = (results.get(name) or "") + f"[rank {rank}] {failure}\n"
                else:
                    results.setdefault(name, None)
    return results


def check_case(results, name, world_size):
    """The pytest side of one case: skipped below its world size, else it must have passed."""
    import pytest

    if world_size < CASES[name][1]:
        pytest.skip(f"needs at least {CASES[name][1]} ranks")
    failure = results.get(name, "case did not run")
    assert failure is None, failure


def _worker(module):
    import importlib

    import torch.distributed as dist

    import cnccl  # noqa: F401

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    # A case that fails on some ranks only leaves the others waiting in its next collective: a
    # short group timeout turns that into errors instead of a hung suite.
    dist.init_process_group("cnccl", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=120))
    mod = importlib.import_module(module)
    ctx = mod.Context(rank, world) if hasattr(mod, "Context") else None
    results = {}
    for name, (fn, min_world) in CASES.items():
        if world < min_world:
            continue
        if os.environ.get("CNCCL_TEST_TRACE"):
            print(f"[rank {rank}] case {name}", file=sys.stderr, flush=True)
        try:
            fn(ctx)
            results[name] = None
        except Exception:  # noqa: BLE001 - every failure is reported, then the next case runs
            results[name] = traceback.format_exc(limit=6)
        # Keep ranks in step even when a case failed on one of them.
        dist.barrier(group=ctx.gloo if ctx is not None else None)
    with open(os.path.join(os.environ["CNCCL_TEST_OUT"], f"rank{rank}.json"), "w") as f:
        json.dump(results, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    sys.modules["harness"] = sys.modules["__main__"]
    _worker(sys.argv[1])

"""cuda_engine (CNCCL_CUDA_ENGINE, Options.cuda_engine) on the CPU side: how it is read and reported, the
gloo group a cuda_engine=gloo group builds for its CUDA tensors, and the ranks' agreement at creation on
the engines they build (a rank building another would leave the others in gloo's connections until the
timeout). Its CUDA tensors' collectives at 2-4 ranks on one GPU are test_cuda_ranks.py's."""

import os
import subprocess
import sys

import pytest

import cnccl

CUDA_PATH = cnccl.build_info()["cuda_collectives"]
needs_cuda_path = pytest.mark.skipif(not CUDA_PATH, reason="torch is a CPU-only build: cnccl has no CUDA path")


def test_it_is_read_from_options_and_the_environment(monkeypatch):
    monkeypatch.delenv("CNCCL_CUDA_ENGINE", raising=False)
    assert cnccl.Options()._resolved_cuda_engine() == "nccl"
    assert cnccl.Options(cuda_engine="GLOO")._resolved_cuda_engine() == "gloo"
    assert "cuda_engine=gloo" in repr(cnccl.Options(cuda_engine="gloo"))
    with pytest.raises(ValueError, match=r"Options\.cuda_engine='mpi' is not valid; allowed: nccl, gloo"):
        cnccl.Options(cuda_engine="mpi")
    monkeypatch.setenv("CNCCL_CUDA_ENGINE", "gloo")
    assert cnccl.Options()._resolved_cuda_engine() == "gloo"
    assert cnccl.Options(cuda_engine="nccl")._resolved_cuda_engine() == "nccl"  # the field wins
    monkeypatch.setenv("CNCCL_CUDA_ENGINE", "ucc")
    with pytest.raises(ValueError, match=r"CNCCL_CUDA_ENGINE='ucc' is not valid; allowed: nccl, gloo"):
        cnccl.Options()


def python(code, env=None, timeout=120):
    here = os.path.dirname(os.path.abspath(__file__))
    e = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [here, os.environ.get("PYTHONPATH")])), **(env or {}))
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=e)


def finish(procs, timeout=120):
    outs = []
    for p in procs:
        out, _ = p.communicate(timeout=timeout)
        outs.append((p.returncode, out))
    return outs


@needs_cuda_path
def test_a_gloo_group_builds_a_gloo_engine_for_cuda_tensors_and_says_so():
    code = """
import torch, torch.distributed as dist, cnccl
from cnccl import _C
store = dist.HashStore()
dist.init_process_group("cnccl", store=store, rank=0, world_size=1, pg_options=cnccl.Options(cuda_engine="gloo"))
print("config:", cnccl.config()["cuda_engine"], cnccl.config()["cpu_engine"])
t = torch.ones(4)
dist.all_reduce(t)
print("cpu:", t.tolist())
# Made without the registration, the group names what it lacks; a gloo passed for nothing is refused too.
for options, engine in ((cnccl.Options(cuda_engine="gloo"), None),
                        (cnccl.Options(), dist.ProcessGroupGloo(dist.PrefixStore("x/", store), 0, 1))):
    try:
        _C.ProcessGroupCNCCL(dist.PrefixStore("y/", store), 0, 1, options, None, engine)
        print("made")
    except ValueError as e:
        print("refused:", e)
dist.destroy_process_group()
"""
    [(rc, out)] = finish([python(code)])
    assert rc == 0, out
    assert "config: gloo ucx" in out or "config: gloo gloo" in out, out
    assert "cpu: [1.0, 1.0, 1.0, 1.0]" in out, out
    assert "refused: cnccl: cuda_engine=gloo needs a torch ProcessGroupGloo for CUDA tensors" in out, out
    assert "refused: cnccl: a CUDA engine was passed, but cuda_engine is nccl" in out, out


RANK = """
import ast, os, sys, datetime, torch.distributed as dist, cnccl
rank = int(sys.argv[1])
try:
    dist.init_process_group("cnccl", store=dist.FileStore(sys.argv[2], 2), rank=rank, world_size=2,
                            timeout=datetime.timedelta(seconds=60),
                            pg_options=cnccl.Options(**ast.literal_eval(os.environ["OPTIONS"])))
    print("made")
except Exception as e:
    print(type(e).__name__ + ":", e)
"""


@pytest.mark.parametrize("field,values", [("cuda_engine", ("gloo", "nccl")),
                                          pytest.param("cpu_engine", ("gloo", "ucx"), marks=pytest.mark.needs_host_path)])
def test_ranks_that_would_build_different_engines_fail_at_once_naming_both(tmp_path, field, values):
    store = str(tmp_path / "store")
    procs = [subprocess.Popen([sys.executable, "-c", RANK, str(r), store], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True,
                              env=dict(os.environ, OPTIONS=repr({field: values[r]}))) for r in range(2)]
    outs = finish(procs, timeout=50)  # well inside the group's 60 s timeout: it fails at once
    for r, (rc, out) in enumerate(outs):
        assert "DistBackendError: cnccl: the ranks of group" in out and "would build different engines" in out, out
        mine, theirs = values[r], values[1 - r]
        assert f"rank {r} has " in out and f"{field}={mine}" in out and f"rank {1 - r} has " in out, out
        assert f"{field}={theirs}" in out, out


@needs_cuda_path
def test_python_m_cnccl_says_gloo_carries_cuda_tensors():
    r = subprocess.run([sys.executable, "-m", "cnccl"], capture_output=True, text=True, timeout=180, cwd="/",
                       env=dict(os.environ, CNCCL_CUDA_ENGINE="gloo"))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "CUDA tensors over gloo, staged through host memory" in r.stdout, r.stdout

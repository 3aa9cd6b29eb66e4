"""What users of gloo and NCCL expect to see of a backend, on each CPU engine: every collective as a
named torch.profiler range (with its tensors and wire), one INFO line at group creation, and torch's
collective-fingerprint checks under TORCH_DISTRIBUTED_DEBUG=DETAIL."""

import os
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.distributed as dist

import cnccl
from harness import CASE_TIMEOUT, CPU_ENGINES, Cases, cached_job, check_case, engine_env, share, shared_job

case = Cases()
share(__name__, CPU_ENGINES, [2])


class Context:
    def __init__(self, rank, world):
        self.rank, self.world = rank, world
        self.fp16 = dist.new_group(backend="cnccl", timeout=CASE_TIMEOUT, pg_options=cnccl.Options(min_bytes=1024))


def ranges(prof, prefix="cnccl:"):
    return {e.name: e for e in prof.events() if e.name.startswith(prefix)}


@case
def every_collective_is_a_named_profiler_range(ctx):
    from torch.profiler import ProfilerActivity, profile

    big, small = torch.ones(70_000), torch.ones(4, dtype=torch.int64)
    out = [torch.empty(4, dtype=torch.int64) for _ in range(ctx.world)]
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        dist.all_reduce(big, group=ctx.fp16)
        dist.broadcast(small, 0, group=ctx.fp16)
        dist.all_gather(out, small, group=ctx.fp16)
        dist.barrier(group=ctx.fp16)
    got = ranges(prof)
    for name in ("cnccl:all_reduce", "cnccl:broadcast", "cnccl:all_gather", "cnccl:barrier"):
        assert name in got, f"{name} missing from the trace; cnccl ranges: {sorted(got)}"
    allreduce = got["cnccl:all_reduce"]
    assert allreduce.input_shapes == [[70_000]], allreduce.input_shapes
    assert allreduce.input_dtypes == ["float"], allreduce.input_dtypes
    assert allreduce.kwinputs.get("wire") == "fp16", allreduce.kwinputs
    assert got["cnccl:broadcast"].kwinputs.get("wire") == "none", got["cnccl:broadcast"].kwinputs
    assert got["cnccl:broadcast"].input_dtypes == ["long int"], got["cnccl:broadcast"].input_dtypes


@case
def no_range_is_recorded_without_a_profiler(ctx):
    # Opening a range costs nothing when no profiler is on: the collectives still work.
    t = torch.ones(70_000)
    dist.all_reduce(t, group=ctx.fp16)
    assert torch.equal(t, torch.full_like(t, ctx.world))


@pytest.mark.parametrize("engine", CPU_ENGINES)
@pytest.mark.parametrize("name", case.names())
def test_observability(name, engine):
    check_case(shared_job(__name__, 2, engine), name, 2, case)


# Under TORCH_DISTRIBUTED_DEBUG=DETAIL torch wraps every group's backend (cnccl's too) in its
# ProcessGroupWrapper, which checks each collective's fingerprint across ranks over gloo first.
detail = Cases()


@detail
def collectives_run_under_the_fingerprint_checks(ctx):
    t = torch.ones(70_000)
    dist.all_reduce(t, group=ctx.fp16)
    assert torch.equal(t, torch.full_like(t, ctx.world))
    assert cnccl.stats(ctx.fp16)["compressed_collectives"] >= 1, cnccl.stats(ctx.fp16)
    assert cnccl.config(ctx.fp16)["min_bytes"] == 1024


@detail
def mismatched_shapes_fail_with_torchs_fingerprint_error(ctx):
    t = torch.ones(1000 + ctx.rank)
    try:
        dist.all_reduce(t, group=ctx.fp16)
    except RuntimeError as e:
        assert "mismatch" in str(e).lower(), e
    else:
        raise AssertionError("ranks that called all_reduce with different shapes were not told")
    assert torch.equal(t, torch.ones(1000 + ctx.rank)), "the failed call changed the tensor"


@pytest.mark.parametrize("engine", CPU_ENGINES)
@pytest.mark.parametrize("name", detail.names())
def test_debug_detail(name, engine):
    env = dict(engine_env(engine), TORCH_DISTRIBUTED_DEBUG="DETAIL", CNCCL_TEST_CASES="detail")
    check_case(cached_job(__name__, 2, env=env), name, 2, detail)


@pytest.mark.parametrize("engine", ["ucx", "gloo"])  # one rank: shared memory has nobody to share with
def test_one_info_line_at_group_creation(engine):
    script = textwrap.dedent("""
        import torch.distributed as dist
        import cnccl
        store = dist.HashStore()
        dist.init_process_group("cnccl", store=store, rank=0, world_size=1,
                                pg_options=cnccl.Options(wire_dtype="bf16", min_bytes=4096))
        dist.destroy_process_group()
    """)
    env = dict(os.environ, TORCH_CPP_LOG_LEVEL="INFO", CNCCL_CPU_ENGINE=engine)
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stderr.splitlines() if "cnccl: group" in line]
    assert len(lines) == 1, done.stderr
    path = "the host path over ucx (a single rank)" if engine == "ucx" else "the composed path over gloo"
    for part in ("rank 0/1", f"CPU tensors on {path}", "CUDA tensors on", "wire bf16", "min_bytes 4096"):
        assert part in lines[0], f"{part!r} not in {lines[0]!r}"
    quiet = subprocess.run([sys.executable, "-c", script], env=dict(env, TORCH_CPP_LOG_LEVEL="WARNING"),
                           capture_output=True, text=True, timeout=300)
    assert "cnccl: group" not in quiet.stderr, quiet.stderr

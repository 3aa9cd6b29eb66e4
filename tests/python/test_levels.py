"""A wire per level (inter_host_wire; docs/numerics.md, "A wire per level") across simulated hosts: 2 x 2
and 3 x 2 ranks (network namespaces, each host's ranks one torchrun in an IPC namespace of its own,
tests/python/hosts.py), so the host path runs shared memory inside each host and UCX across. Every
allreduce and reduce_scatter_tensor must give, bit for bit, what wire_formats.level_allreduce and
level_reduce_scatter compute from every rank's input (the frames and MX blocks through wire_formats'
emulations, torchao the MX oracle); a group with one 16-bit wire at both levels (the plain hierarchical
allreduce), each host's fp32 sum rounded once and the hosts' sums added in the wire type in host order. Also:
cnccl.config() names each level's wire, and a group whose hosts
disagree on inter_host_wire fails on every rank naming both settings, at 4 x 2 too, where two hosts see no
disagreement themselves and learn it across hosts.

On one host (harness.py's shared jobs, 2 ranks): the setting's checks, and that a group there sums
with wire_dtype alone (it has no link between hosts) on cnccl's host path, while cpu_engine=gloo refuses it.
The hosts' tests need root for `ip netns`; they skip naming that elsewhere, and CI
(CNCCL_REQUIRE_NETNS=1) turns the skip into a failure. A CUDA tensor's refusal is in test_cuda.py.
"""

import json
import os
import signal
import sys
import time
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cnccl  # noqa: E402
from harness import CASE_TIMEOUT, CPU_ENGINES, Cases, check_case, engine_of, gloo_group, share, shared_job  # noqa: E402
from wire_formats import (WIRE_DTYPE, level_allreduce, level_reduce_scatter, mixed_magnitudes,  # noqa: E402
                          rank_order_sum)

TIMEOUT = 600
# (inside, across): the per-level pairs, exact fp32 inside, 16-bit across, 8-bit frames, and NVFP4
# frames at either level.
LEVELS = [("fp16", "mxfp8"), ("none", "mxfp8"), ("fp16", "mxfp4"), ("bf16", "e4m3"), ("mxfp8", "fp16"),
          ("fp16", "none"), ("fp16", "nvfp4"), ("nvfp4", "fp16")]
# Allreduce sizes: parts with their last blocks short, local parts left empty (n below 32 x hosts), and
# several chunks of shared memory; reduce_scatter outputs: a short last MX block, and many blocks.
ALLREDUCE_SIZES = [5, 1000, 300_001]
SCATTER_SIZES = [37, 40_000]


def inputs(seed, rank, n):
    gen = torch.Generator().manual_seed(seed * 1000 + rank)
    return mixed_magnitudes(gen, n, 3) * (1 + rank)


FACTOR = 0.37


def small_integers(seed, rank, n):
    return torch.randint(-8, 9, (n,), generator=torch.Generator().manual_seed(seed * 1000 + rank)).float() * 1.5


def allreduce_input(case, i, rank):
    if case.get("strided"):
        return inputs(i, rank, 2 * case["n"])[::2]
    x = inputs(i, rank, case["n"])
    if case.get("fp64"):
        return x.double()
    return x * 1e-37 if case.get("flush") else x


def scatter_input(case, i, rank, world):
    x = inputs(i, rank, case["n"] * world)
    return x.double() if case.get("fp64") else x


def cases():
    out = []
    for inside, across in LEVELS:
        for n in ALLREDUCE_SIZES:
            out.append(dict(kind="allreduce", inside=inside, across=across, n=n, op="sum"))
        for each in SCATTER_SIZES:
            out.append(dict(kind="reduce_scatter", inside=inside, across=across, n=each, op="sum"))
    out.append(dict(kind="allreduce", inside="fp16", across="mxfp8", n=4099, op="avg"))
    # PREMUL_SUM's factor and sum_scaling's 1/N before the first level, its N after the last.
    out.append(dict(kind="allreduce", inside="fp16", across="mxfp4", n=3001, op="premul"))
    out.append(dict(kind="allreduce", inside="fp16", across="mxfp8", n=3001, op="sum", sum_scaling="world"))
    out.append(dict(kind="reduce_scatter", inside="bf16", across="e4m3", n=301, op="sum", sum_scaling="world"))
    # reduce() is exact at every level: small integers sum exactly.
    out.append(dict(kind="reduce", inside="fp16", across="mxfp8", n=70_000, op="sum"))
    # A strided tensor's results go through a staging copy (as with untouched_on_failure).
    out.append(dict(kind="allreduce", inside="fp16", across="mxfp8", n=5003, op="sum", strided=True))
    out.append(dict(kind="allreduce", inside="bf16", across="e4m3", n=5003, op="sum", strided=True))
    out.append(dict(kind="reduce_scatter", inside="none", across="mxfp8", n=333, op="avg"))
    # MX scales by mx_scale=floor at both levels.
    out.append(dict(kind="allreduce", inside="mxfp8", across="mxfp4", n=3001, op="sum", mx_scale="floor"))
    out.append(dict(kind="reduce_scatter", inside="mxfp4", across="mxfp8", n=301, op="sum", mx_scale="floor"))
    # Several chunks of every pipeline (shared memory's, the MX one across hosts): 1.5 M elements a local part.
    out.append(dict(kind="allreduce", inside="fp16", across="mxfp8", n=3_000_001, op="sum"))
    out.append(dict(kind="allreduce", inside="bf16", across="e4m3", n=3_000_001, op="avg"))
    out.append(dict(kind="allreduce", inside="fp16", across="nvfp4", n=3_000_001, op="sum"))
    out.append(dict(kind="reduce_scatter", inside="mxfp8", across="fp16", n=300_007, op="sum"))
    # A group made on a thread that flushes subnormals (its threads take that setting), on values that are
    # mostly subnormal once scaled: the same bits.
    for inside, across in [("fp16", "mxfp8"), ("none", "mxfp8"), ("bf16", "e4m3"), ("fp16", "none"), ("fp16", "nvfp4")]:
        out.append(dict(kind="allreduce", inside=inside, across=across, n=20_011, op="sum", flush=True))
    # fp64 tensors holding fp32 values, summed or averaged by a power of two: every product and cast is the
    # one the fp32 emulation makes, so the results are its values, in fp64.
    for inside, across in [("fp16", "mxfp8"), ("none", "e4m3"), ("mxfp8", "fp16"), ("nvfp4", "none")]:
        out.append(dict(kind="allreduce", inside=inside, across=across, n=70_001, op="avg", fp64=True))
        out.append(dict(kind="reduce_scatter", inside=inside, across=across, n=7_001, op="sum", fp64=True))
    # rounding=sr, every compressed level a block wire: exact fp32 or mxfp8 inside and nvfp4 across, nvfp4
    # inside and mxfp4 across (whose owners round their sums as they add), several chunks across too.
    for inside, across in [("none", "nvfp4"), ("mxfp8", "nvfp4"), ("nvfp4", "mxfp4")]:
        out.append(dict(kind="allreduce", inside=inside, across=across, n=300_001, op="sum", sr=True))
        out.append(dict(kind="reduce_scatter", inside=inside, across=across, n=40_000, op="avg", sr=True))
    out.append(dict(kind="allreduce", inside="none", across="nvfp4", n=3_000_001, op="avg", sr=True))
    # One wire at both levels, accumulate=wire: the plain hierarchical allreduce, its levels pipelined too.
    for wire in ("fp16", "bf16"):
        for n in (5, 1000, 300_001, 3_000_001):
            out.append(dict(kind="hierarchical", inside=wire, across=wire, n=n, op="sum"))
        out.append(dict(kind="hierarchical", inside=wire, across=wire, n=70_001, op="avg"))
    return out


def test_the_settings_name_what_they_need(monkeypatch):
    both = r"wire_dtype=fp16 inside a host and inter_host_wire=mxfp8 across hosts"
    with pytest.raises(ValueError, match=both + r".*need accumulate=fp32.*got accumulate=wire"):
        cnccl.Options(wire_dtype="fp16", inter_host_wire="mxfp8")
    with pytest.raises(ValueError, match=both + r".* with rounding=sr .*need each level a block wire .* or none: a "
                                              r"16-bit or 8-bit level travels in power-of-two frames"):
        cnccl.Options(wire_dtype="fp16", inter_host_wire="mxfp8", accumulate="fp32", rounding="sr")
    with pytest.raises(ValueError, match=r"inter_host_wire=e4m3 across hosts .* with rounding=sr"):
        cnccl.Options(wire_dtype="none", inter_host_wire="e4m3", accumulate="fp32", rounding="sr")
    assert cnccl.Options(wire_dtype="none", inter_host_wire="nvfp4", accumulate="fp32", rounding="sr") is not None
    with pytest.raises(ValueError, match=r"Options.inter_host_wire='fp12' is not valid; allowed: fp16, bf16, e4m3"):
        cnccl.Options(inter_host_wire="fp12")
    # The same wire at both levels is one level: nothing more is needed.
    assert cnccl.Options(wire_dtype="fp16", inter_host_wire="fp16") is not None
    assert "inter_host_wire=None" in repr(cnccl.Options()) and "inter_host_wire=e4m3)" in repr(
        cnccl.Options(inter_host_wire="e4m3", accumulate="fp32"))
    monkeypatch.setenv("CNCCL_INTER_HOST_WIRE", "mxfp4")
    with pytest.raises(ValueError, match=r"inter_host_wire=mxfp4 across hosts.*need accumulate=fp32"):
        cnccl.Options(wire_dtype="none")


# --- One host (harness.py's shared jobs).

case = Cases()
share(__name__, CPU_ENGINES, [2])


class Context:
    def __init__(self, rank, world):
        self.rank, self.world = rank, world
        self.gloo = gloo_group()
        self.gen = torch.Generator().manual_seed(71 + rank)


def levels_group(**fields):
    return dist.new_group(backend="cnccl", timeout=CASE_TIMEOUT, pg_options=cnccl.Options(
        wire_dtype="fp16", inter_host_wire="mxfp8", accumulate="fp32", min_bytes=0, **fields))


@case
def one_host_sums_with_wire_dtype_alone(ctx):
    """No link between hosts, so no level for inter_host_wire: the sums are wire_dtype's, bit for bit;
    config() names both settings and the one level. gloo, which decides its own topology, refuses."""
    if engine_of() == "gloo":
        with pytest.raises(ValueError, match=r"inter_host_wire=mxfp8 differs from wire_dtype=fp16, but "
                                             r"cpu_engine=gloo"):
            levels_group()
        return
    levels = levels_group()
    plain = dist.new_group(backend="cnccl", timeout=CASE_TIMEOUT, pg_options=cnccl.Options(
        wire_dtype="fp16", accumulate="fp32", min_bytes=0))
    c = cnccl.config(levels)
    assert (c["wire_dtype"], c["inter_host_wire"], c["wire_levels"]) == ("fp16", "mxfp8", "fp16 on every link"), c
    for n in [5, 100_003]:
        x = mixed_magnitudes(ctx.gen, n, 3)
        a, b = x.clone(), x.clone()
        dist.all_reduce(a, group=levels)
        dist.all_reduce(b, group=plain)
        assert torch.equal(a, b), f"allreduce n={n}"
        src = mixed_magnitudes(ctx.gen, n * ctx.world, 3)
        a, b = torch.empty(n), torch.empty(n)
        dist.reduce_scatter_tensor(a, src, group=levels)
        dist.reduce_scatter_tensor(b, src, group=plain)
        assert torch.equal(a, b), f"reduce_scatter n={n}"


@pytest.mark.parametrize("engine", CPU_ENGINES)
@pytest.mark.parametrize("name", case.names())
def test_one_host(name, engine):
    check_case(shared_job(__name__, 2, engine), name, 2, case, engine)


# --- Across simulated hosts.

SR_SEED = 0x5EED


def group_key(case):
    """The settings that make a case's group: cases with the same key share one, in case order."""
    return (case["inside"], case["across"], case.get("sum_scaling", "none"), case.get("mx_scale", "rceil"),
            case.get("flush", False), case.get("fp64", False), case.get("sr", False))


def worker(outdir):
    """One rank: every case on its own group; then the disagreement. Writes outputs and what it saw."""
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    per_host = int(os.environ["LOCAL_WORLD_SIZE"])
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    seen = {}
    results = []
    groups = {}
    for i, case in enumerate(cases()):
        levels = group_key(case)
        if levels not in groups:
            torch.set_flush_denormal(levels[4])
            options = (dict(wire_dtype=case["inside"], min_bytes=0) if case["kind"] == "hierarchical" else
                       dict(wire_dtype=case["inside"], inter_host_wire=case["across"], accumulate="fp32", min_bytes=0,
                            sum_scaling=levels[2], mx_scale=levels[3], compress_fp64=levels[5],
                            **(dict(rounding="sr", sr_seed=SR_SEED) if levels[6] else {})))
            groups[levels] = dist.new_group(backend="cnccl", pg_options=cnccl.Options(**options))
            torch.set_flush_denormal(False)
        group = groups[levels]
        if i == 0:
            seen["config"] = {k: cnccl.config(group)[k] for k in ("wire_dtype", "inter_host_wire", "wire_levels")}
        op = {"avg": dist.ReduceOp.AVG, "sum": dist.ReduceOp.SUM,
              "premul": dist._make_nccl_premul_sum(FACTOR)}[case["op"]]
        if case["kind"] == "reduce":
            x = small_integers(i, rank, case["n"])
            dist.reduce(x, dst=world - 1, op=op, group=group)
        elif case["kind"] in ("allreduce", "hierarchical"):
            x = allreduce_input(case, i, rank)
            dist.all_reduce(x, op=op, group=group)
            x = x.clone()
        else:
            src = scatter_input(case, i, rank, world)
            x = torch.empty(case["n"], dtype=src.dtype)
            dist.reduce_scatter_tensor(x, src, op=op, group=group)
        results.append(x)
    # A reduce_scatter reads its input where it is: no copy of it (at::cat made one a call, 1x the input).
    g = groups[("fp16", "mxfp8", "none", "rceil", False, False, False)]
    src, out = inputs(99, rank, (1 << 18) * world), torch.empty(1 << 18)
    seen["reduce_scatter_peak"] = [cnccl._C._cpu_bytes_peak(lambda: dist.reduce_scatter_tensor(out, src, group=g)),
                                   src.nbytes, cnccl._C._cpu_bytes_peak(lambda: torch.empty(src.numel()))]
    # Hosts whose ranks do not share memory have no level inside a host: group creation says so.
    try:
        dist.new_group(backend="cnccl", pg_options=cnccl.Options(
            wire_dtype="fp16", inter_host_wire="mxfp8", accumulate="fp32", shm="off"))
        seen["no_shm"] = None
    except ValueError as e:
        seen["no_shm"] = str(e)
    torch.save(results, os.path.join(outdir, f"out-{rank}.pt"))
    disagree(outdir, seen)


def disagree(outdir, seen):
    """Hosts that disagree on the wire across: every rank's allreduce must fail at once, naming both. The
    first host sums across in mxfp8, the others in mxfp4. Within the group's timeout (60 s) a rank that
    waited for it would report the timeout instead."""
    rank, per_host = int(os.environ["RANK"]), int(os.environ["LOCAL_WORLD_SIZE"])
    if not dist.is_initialized():
        dist.init_process_group("gloo")
    mine = "mxfp8" if rank < per_host else "mxfp4"
    group = dist.new_group(backend="cnccl", timeout=timedelta(seconds=60), pg_options=cnccl.Options(
        wire_dtype="fp16", inter_host_wire=mine, accumulate="fp32", min_bytes=0))
    if rank < per_host:
        # The first host comes late: the hosts that agree with their ring neighbours are then waiting
        # across hosts, not for the group's headers, when the disagreement is found.
        time.sleep(3)
    try:
        dist.all_reduce(torch.ones(1 << 12), group=group)
        seen["disagreement"] = None
    except Exception as e:  # noqa: BLE001 - the test asserts on the message
        seen["disagreement"] = f"{type(e).__name__}: {e}"
    with open(os.path.join(outdir, f"seen-{rank}.json"), "w") as f:
        json.dump(seen, f)
    dist.barrier()  # on gloo: no rank leaves (and looks dead) before every rank has seen the failure
    os._exit(0)  # the failed group is unusable, and destroying it would only wait out its peers


def killed_across(outdir):
    """The second host's ranks SIGKILL themselves at their first large send across hosts (the fault variable is
    set on that host only: its cross-host transports number it 1), midway through level 2 of an allreduce. The
    first host's ranks must fail promptly with a DistBackendError, never hang or abort."""
    rank = int(os.environ["RANK"])
    dist.init_process_group("gloo")
    group = dist.new_group(backend="cnccl", timeout=timedelta(seconds=120), pg_options=cnccl.Options(
        wire_dtype="fp16", inter_host_wire="mxfp8", accumulate="fp32", min_bytes=0))
    x = torch.randn(1 << 22)
    start = time.monotonic()
    try:
        dist.all_reduce(x, group=group)
        seen = {"error": None}
    except Exception as e:  # noqa: BLE001 - the test asserts on the type and message
        seen = {"error": f"{type(e).__name__}: {e}"}
    seen["seconds"] = time.monotonic() - start
    with open(os.path.join(outdir, f"killed-{rank}.json"), "w") as f:
        json.dump(seen, f)
    # This host's torchrun would wait at its exit barrier for the dead host's, for minutes.
    os.kill(os.getppid(), signal.SIGKILL)
    os._exit(0)


def run_job(nodes, hosts, per_host, tmp_path, mode="--worker"):
    codes, logs = nodes.torchrun(per_host, [os.path.abspath(__file__), mode, str(tmp_path)], str(tmp_path), TIMEOUT)
    nodes.procs.clear()
    if codes != [0] * hosts:
        pytest.fail(f"job failed (exit codes {codes}):\n" +
                    "\n".join(f"--- {p}\n" + open(p).read()[-4000:] for p in logs))


def bits(t):
    """Bitwise identity, NaNs included (a block holding a non-finite value decodes as NaN)."""
    return t.view(torch.int32)


def check(tmp_path, hosts, per_host):
    world = hosts * per_host
    outs = [torch.load(tmp_path / f"out-{r}.pt") for r in range(world)]
    seen = [json.load(open(tmp_path / f"seen-{r}.json")) for r in range(world)]
    stochastic_calls = {}  # a stochastic group's calls so far: the next one's seq
    for i, case in enumerate(cases()):
        world_scaled = case.get("sum_scaling") == "world"
        pre = {"avg": 1.0 / world, "premul": FACTOR}.get(case["op"], 1.0 / world if world_scaled else 1.0)
        post = world if world_scaled else 1.0
        mx_scale = case.get("mx_scale", "rceil")
        sr = None
        if case.get("sr"):
            seq = stochastic_calls.get(group_key(case), 0)
            stochastic_calls[group_key(case)] = seq + 1
            sr = (SR_SEED, seq)
        name = (f"{case['kind']} {case['inside']}|{case['across']} n={case['n']} {case['op']} mx_scale={mx_scale}" +
                (" strided" if case.get("strided") else "") + (" sum_scaling=world" if world_scaled else "") +
                (" flushing" if case.get("flush") else "") + (" fp64" if case.get("fp64") else "") +
                (" rounding=sr" if sr else ""))
        if case["kind"] == "reduce":
            total = sum(small_integers(i, r, case["n"]) for r in range(world))
            got = outs[world - 1][i]
            assert torch.equal(got, total), f"{name}: the root's result is not the exact sum"
            continue
        if case["kind"] == "hierarchical":
            # Each host's fp32 sum in rank order rounded once to the wire, then the hosts' sums added in the
            # wire type in host order (each add rounded), widened.
            xs = [allreduce_input(case, i, r).float() for r in range(world)]
            host_sums = [rank_order_sum(xs[h * per_host:(h + 1) * per_host], case["inside"], pre)
                         .to(WIRE_DTYPE[case["inside"]]) for h in range(hosts)]
            total = host_sums[0]
            for host_sum in host_sums[1:]:
                total = total + host_sum
            want = [total.float() * post] * world
        elif case["kind"] == "allreduce":
            xs = [allreduce_input(case, i, r).contiguous().float() for r in range(world)]
            want = [level_allreduce(xs, hosts, per_host, case["inside"], case["across"], pre, post, mx_scale,
                                    sr)] * world
        else:
            xs = [scatter_input(case, i, r, world).float() for r in range(world)]
            want = level_reduce_scatter(xs, hosts, per_host, case["inside"], case["across"], pre, post, mx_scale, sr)
        for r in range(world):
            got = outs[r][i]
            assert got.dtype == (torch.float64 if case.get("fp64") else torch.float32), f"{name}: {got.dtype}"
            got = got.float()  # exact for fp64 results: the emulation's fp32 values
            differ = (bits(got) != bits(want[r])).nonzero()
            assert differ.numel() == 0, (
                f"{name}, rank {r}: {differ.numel()} of {got.numel()} elements differ from the emulation, first "
                f"at {differ[0].item()}: {got[differ[0]].item()!r} vs {want[r][differ[0]].item()!r}")
    levels = f"fp16 inside each host, mxfp8 across {hosts} hosts"
    for r, s in enumerate(seen):
        assert s["config"] == {"wire_dtype": "fp16", "inter_host_wire": "mxfp8", "wire_levels": levels}, s["config"]
        assert s["no_shm"] and "do not share memory within each host (off on rank" in s["no_shm"], s["no_shm"]
        peak, input_bytes, control = s["reduce_scatter_peak"]
        assert control >= input_bytes, f"rank {r}: the allocator counted {control} bytes of a {input_bytes}-byte tensor"
        assert peak < input_bytes / 16, f"rank {r}: a reduce_scatter of {input_bytes} bytes held {peak} at once"
    check_disagreement(seen)


def check_disagreement(seen):
    for r, s in enumerate(seen):
        assert s["disagreement"] and "mxfp8 across" in s["disagreement"] and "mxfp4 across" in s["disagreement"], (
            f"rank {r}: {s['disagreement']}")


@pytest.mark.needs_host_path
def test_two_hosts_of_two_ranks_sum_as_the_emulation(nodes, tmp_path):
    run_job(nodes, 2, 2, tmp_path)
    check(tmp_path, 2, 2)


@pytest.mark.needs_host_path
def test_two_hosts_of_three_ranks_sum_as_the_emulation(nodes, tmp_path):
    """Three ranks a host: three local parts, and shared-memory reductions of three contributions."""
    run_job(nodes, 2, 3, tmp_path)
    check(tmp_path, 2, 3)


@pytest.mark.needs_host_path
def test_a_host_killed_across_hosts_fails_the_others_promptly(nodes, tmp_path):
    kill = {"CNCCL_FAULT_SIGKILL_AT_LARGE_SEND": "1:1"}
    nodes.torchrun(2, [os.path.abspath(__file__), "--killed-across", str(tmp_path)], str(tmp_path), TIMEOUT,
                   node_env=lambda node: kill if node == 1 else {})
    nodes.procs.clear()
    for r in range(2):
        path = tmp_path / f"killed-{r}.json"
        log = open(tmp_path / "host0.log").read()[-4000:]
        assert path.exists(), f"survivor {r} wrote nothing (crashed or hung):\n{log}"
        seen = json.load(open(path))
        assert seen["error"] and seen["error"].startswith("DistBackendError"), f"rank {r}: {seen}"
        assert seen["seconds"] < 60, f"rank {r} failed only after {seen['seconds']:.0f} s (timeout 120): {seen}"
    assert not (tmp_path / "killed-2.json").exists(), "the second host's ranks were not killed"


@pytest.mark.needs_host_path
def test_three_hosts_of_two_ranks_sum_as_the_emulation(three_nodes, tmp_path):
    run_job(three_nodes, 3, 2, tmp_path)
    check(tmp_path, 3, 2)


@pytest.mark.needs_host_path
def test_four_hosts_that_disagree_fail_on_every_rank(four_nodes, tmp_path):
    """From four hosts on, a host whose ring neighbours agree with it sees no disagreement itself: its
    ranks wait across hosts on ranks that failed, and learn why from their notices."""
    run_job(four_nodes, 4, 2, tmp_path, mode="--disagree")
    check_disagreement([json.load(open(tmp_path / f"seen-{r}.json")) for r in range(8)])


if __name__ == "__main__" and sys.argv[1:2] == ["--worker"]:
    worker(sys.argv[2])
if __name__ == "__main__" and sys.argv[1:2] == ["--killed-across"]:
    killed_across(sys.argv[2])
if __name__ == "__main__" and sys.argv[1:2] == ["--disagree"]:
    disagree(sys.argv[2], {})

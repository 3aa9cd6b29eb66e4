"""How far compressed gradient communication moves training from fp32, at 4 CPU ranks.

Usage: python3 bench/accuracy.py [--ranks 4] [--steps 30] [--long-steps 500] [--no-levels] [--json FILE]
       python3 bench/accuracy.py --seeds 3 [--steps 30] [--long-steps 500]

Every run trains its own copy of the same small transformer block (tests/python/models.py) on the
same data for the same SGD steps, its gradients averaged by DDP, or reduce-scattered by FSDP2
(fully_shard), over a different group. Reported: each run's parameters' relative L2 distance from
the run over gloo in fp32, after the last step. cnccl's runs go over UCX (CNCCL_SHM=off), where
reduce_scatter's wire path is a ring of 16-bit adds (FSDP2's); an allreduce past 256 KiB on the wire (DDP's
bucket here) is the chunked all-to-all, and through shared memory every sum is fp32 in rank order, whatever
`accumulate` says.

The long runs train DDP for --long-steps on the fp32 reference and on the wires LONG_RUNS names
(16-bit, 8-bit with one scale a part, MX with one scale a block of 32), and report each one's final
loss (the mean over the ranks of the last step's) beside its distance.

MX runs use each block scale rule (mx_scale): rceil, the default, and floor. Last, with no training, the
error of one encoding of heavy-tailed values (Gaussians times e^(2g), g Gaussian: a log-normal spread of
magnitudes, of which e4m3 with one exponent a part flushes about one in six to zero) through e4m3 with one
exponent a part and through MX blocks under each rule: the relative L2 error and the mean per-element
relative error, with the goals for RCEIL's mxfp8 (L2 at most e4m3's, the per-element error at most 0.2x
its) printed as met or not met.

--seeds K runs only the 4-bit matrix (MATRIX: {mxfp4, nvfp4} x {rne, sr} x {no rotation, hadamard}, and
mxfp8 with and without the rotation), K times, each seed its own initialisation, data and sr_seed, DDP and
FSDP2 for --steps and --long-steps: each combination's distance and its ratio to mxfp8's of the same seed,
the mean and the range over the seeds, and the goal (the best 4-bit combination within 2.5x mxfp8) for each.

A wire per level (inter_host_wire) has levels only across hosts: its runs (LEVEL_RUNS, beside mxfp8 everywhere)
are a job of 2 hosts x 2 ranks, each host a torchrun in an IPC namespace of its own on this machine's network
(needs root for `unshare --ipc`; UCX over TCP), DDP and FSDP2 for --steps and --long-steps each. Goal: DDP's
distance with fp16 inside and mxfp8 across within 2x mxfp8 everywhere's, printed as met or not met.
"""

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP

from allreduce import RESULTS, save_json, spawn

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "python"))
from models import Block  # noqa: E402

CNCCL_RUNS = {  # name -> cnccl.Options fields
    "cnccl fp16": {"wire_dtype": "fp16"},
    "cnccl fp16, accumulate=fp32": {"wire_dtype": "fp16", "accumulate": "fp32"},
    "cnccl bf16": {"wire_dtype": "bf16"},
    "cnccl bf16, accumulate=fp32": {"wire_dtype": "bf16", "accumulate": "fp32"},
    "cnccl fp16, accumulate=fp32, sr": {"wire_dtype": "fp16", "accumulate": "fp32", "rounding": "sr"},
    "cnccl bf16, accumulate=fp32, sr": {"wire_dtype": "bf16", "accumulate": "fp32", "rounding": "sr"},
    "cnccl fp16, accumulate=fp32, pow2": {"wire_dtype": "fp16", "accumulate": "fp32", "scaling": "pow2"},
    "cnccl e4m3, accumulate=fp32, pow2": {"wire_dtype": "e4m3", "accumulate": "fp32", "scaling": "pow2"},
    "cnccl e5m2, accumulate=fp32, pow2": {"wire_dtype": "e5m2", "accumulate": "fp32", "scaling": "pow2"},
    "cnccl mxfp8, accumulate=fp32": {"wire_dtype": "mxfp8", "accumulate": "fp32"},
    "cnccl mxfp8_e5m2, accumulate=fp32": {"wire_dtype": "mxfp8_e5m2", "accumulate": "fp32"},
    "cnccl mxfp4, accumulate=fp32": {"wire_dtype": "mxfp4", "accumulate": "fp32"},
    "cnccl mxfp8, accumulate=fp32, floor": {"wire_dtype": "mxfp8", "accumulate": "fp32", "mx_scale": "floor"},
    "cnccl mxfp4, accumulate=fp32, floor": {"wire_dtype": "mxfp4", "accumulate": "fp32", "mx_scale": "floor"},
    "cnccl nvfp4, accumulate=fp32": {"wire_dtype": "nvfp4", "accumulate": "fp32"},
    "cnccl nvfp4, accumulate=fp32, sr": {"wire_dtype": "nvfp4", "accumulate": "fp32", "rounding": "sr"},
    "cnccl mxfp8, accumulate=fp32, hadamard": {"wire_dtype": "mxfp8", "accumulate": "fp32", "rotation": "hadamard"},
    "cnccl mxfp4, accumulate=fp32, hadamard": {"wire_dtype": "mxfp4", "accumulate": "fp32", "rotation": "hadamard"},
    "cnccl nvfp4, accumulate=fp32, hadamard": {"wire_dtype": "nvfp4", "accumulate": "fp32", "rotation": "hadamard"},
    "cnccl nvfp4, accumulate=fp32, sr, hadamard": {"wire_dtype": "nvfp4", "accumulate": "fp32", "rounding": "sr",
                                                   "rotation": "hadamard"},
}
PER_PART_E4M3 = "cnccl e4m3, accumulate=fp32, pow2"
LONG_RUNS = ["cnccl fp16", "cnccl e4m3, accumulate=fp32, pow2", "cnccl mxfp8, accumulate=fp32",
             "cnccl mxfp8, accumulate=fp32, floor", "cnccl mxfp4, accumulate=fp32", "cnccl nvfp4, accumulate=fp32",
             "cnccl nvfp4, accumulate=fp32, sr", "cnccl mxfp4, accumulate=fp32, hadamard",
             "cnccl nvfp4, accumulate=fp32, hadamard", "cnccl nvfp4, accumulate=fp32, sr, hadamard"]
# One encoding of heavy-tailed values: (label, wire, mx_scale).
BLOCK_ERROR_RUNS = [("e4m3, one exponent a part", "e4m3", "rceil"), ("mxfp8, rceil", "mxfp8", "rceil"),
                    ("mxfp8, floor", "mxfp8", "floor"), ("mxfp4, rceil", "mxfp4", "rceil"),
                    ("mxfp4, floor", "mxfp4", "floor"), ("nvfp4", "nvfp4", "rceil")]
# The same values rotated (rotation=hadamard, the signs of seed 0) before the encoding and back after.
ROTATED_BLOCK_ERROR_RUNS = [("mxfp8, rceil, hadamard", "mxfp8"), ("mxfp4, rceil, hadamard", "mxfp4"),
                            ("nvfp4, hadamard", "nvfp4")]
# The 4-bit wires, against mxfp8 (issue: the best within 2.5x mxfp8's distance).
FOUR_BIT = ["cnccl mxfp4, accumulate=fp32", "cnccl nvfp4, accumulate=fp32", "cnccl nvfp4, accumulate=fp32, sr",
            "cnccl mxfp4, accumulate=fp32, hadamard", "cnccl nvfp4, accumulate=fp32, hadamard",
            "cnccl nvfp4, accumulate=fp32, sr, hadamard"]
EIGHT_BIT = "cnccl mxfp8, accumulate=fp32"
FOUR_BIT_GOAL = 2.5
# --seeds: every 4-bit combination {mxfp4, nvfp4} x {rne, sr} x {no rotation, hadamard}, and mxfp8 with and
# without the rotation, each seed its own initialisation, data and sr_seed; DDP and FSDP2 for --steps and
# --long-steps.
MATRIX = {f"{wire}{', sr' if sr else ''}{', hadamard' if rotated else ''}": dict(
    wire_dtype=wire, accumulate="fp32", **({"rounding": "sr"} if sr else {}), **({"rotation": "hadamard"} if rotated else {}))
    for wire in ("mxfp8", "mxfp4", "nvfp4") for sr in (False, True) for rotated in (False, True)
    if not (wire == "mxfp8" and sr)}
MATRIX_EIGHT_BIT = "mxfp8"
# A wire per level, (inside a host | across hosts), against mxfp8 everywhere, on 2 hosts x 2 ranks.
MXFP8_EVERYWHERE = "cnccl mxfp8, accumulate=fp32"
LEVEL_RUNS = {
    MXFP8_EVERYWHERE: {"wire_dtype": "mxfp8", "accumulate": "fp32"},
    "cnccl fp16|mxfp8": {"wire_dtype": "fp16", "inter_host_wire": "mxfp8", "accumulate": "fp32"},
    "cnccl none|mxfp8": {"wire_dtype": "none", "inter_host_wire": "mxfp8", "accumulate": "fp32"},
    "cnccl fp16|mxfp4": {"wire_dtype": "fp16", "inter_host_wire": "mxfp4", "accumulate": "fp32"},
    "cnccl fp16|nvfp4": {"wire_dtype": "fp16", "inter_host_wire": "nvfp4", "accumulate": "fp32"},
    "cnccl none|nvfp4, sr": {"wire_dtype": "none", "inter_host_wire": "nvfp4", "accumulate": "fp32", "rounding": "sr"},
}
LEVEL_GOAL = ("cnccl fp16|mxfp8", 2.0)  # DDP's distance at most this times mxfp8 everywhere's
HOOKS = {"gloo + fp16_compress_hook": default_hooks.fp16_compress_hook,
         "gloo + bf16_compress_hook": default_hooks.bf16_compress_hook}


def params(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def batches(rank, steps, seed=0):
    gen = torch.Generator().manual_seed(1000 + rank + 100 * seed)
    return [Block.batch(gen, "cpu") for _ in range(steps)]


def train_ddp(group, steps, rank, hook=None, losses=None, seed=0):
    """The parameters after `steps` from the initialisation and data of `seed`; the last step's loss is
    appended to `losses`."""
    torch.manual_seed(seed)
    net = Block()
    model = DDP(net, process_group=group)
    if hook:
        model.register_comm_hook(group, hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    for tokens, target in batches(rank, steps, seed):
        opt.zero_grad()
        loss = Block.loss(model(tokens), target)
        loss.backward()
        opt.step()
    if losses is not None:
        losses.append(loss.item())
    return params(net)


def train_fsdp2(group, steps, rank, seed=0):
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(seed)
    net = Block()
    fully_shard(net, mesh=DeviceMesh.from_group(group, "cpu"))
    opt = torch.optim.SGD(net.parameters(), lr=0.5)
    for tokens, target in batches(rank, steps, seed):
        opt.zero_grad()
        Block.loss(net(tokens), target).backward()
        opt.step()
    return torch.cat([p.full_tensor().reshape(-1) for p in net.parameters()])


def mean_over_ranks(value):
    t = torch.tensor([value], dtype=torch.float64)
    dist.all_reduce(t)
    return t.item() / dist.get_world_size()


def distance(p, reference):
    return ((p.double() - reference.double()).norm() / reference.double().norm()).item()


def worker(rank, world, port, steps, long_steps, out):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1", CNCCL_SHM="off")
    import cnccl

    dist.init_process_group("gloo", rank=rank, world_size=world)
    groups = {name: dist.new_group(backend="cnccl", pg_options=cnccl.Options(min_bytes=0, **fields))
              for name, fields in CNCCL_RUNS.items()}
    results = {}
    for kind, train in (("DDP", train_ddp), ("FSDP2", train_fsdp2)):
        reference = train(dist.group.WORLD, steps, rank)
        runs = {name: (dist.group.WORLD, hook) for name, hook in HOOKS.items()} if kind == "DDP" else {}
        runs.update({name: (g, None) for name, g in groups.items()})
        for name, (g, hook) in runs.items():
            p = train(g, steps, rank, hook) if hook else train(g, steps, rank)
            results[f"{kind}|{name}"] = distance(p, reference)
    long = {}
    if long_steps:
        losses = []
        reference = train_ddp(dist.group.WORLD, long_steps, rank, losses=losses)
        long["fp32 (gloo)"] = {"loss": mean_over_ranks(losses[-1]), "distance": 0.0}
        for name in LONG_RUNS:
            p = train_ddp(groups[name], long_steps, rank, losses=losses)
            long[name] = {"loss": mean_over_ranks(losses[-1]), "distance": distance(p, reference)}
    if rank == 0:
        out.put((results, long))
    dist.destroy_process_group()


def run_lengths(steps, long_steps):
    """The runs' step counts: `steps`, then `long_steps` unless it is 0 (no long runs) or the same."""
    return (steps,) if not long_steps or long_steps == steps else (steps, long_steps)


def seeds_worker(rank, world, port, seeds, steps, long_steps, out):
    """MATRIX's distances from gloo fp32 for each seed, DDP and FSDP2, after `steps` and `long_steps`:
    {"seed|kind|steps|name": distance}, from rank 0."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1", CNCCL_SHM="off")
    import cnccl

    dist.init_process_group("gloo", rank=rank, world_size=world)
    results = {}
    for seed in range(seeds):
        groups = {name: dist.new_group(backend="cnccl", pg_options=cnccl.Options(min_bytes=0, sr_seed=seed, **fields))
                  for name, fields in MATRIX.items()}
        for kind, train in (("DDP", train_ddp), ("FSDP2", train_fsdp2)):
            for n in run_lengths(steps, long_steps):
                reference = train(dist.group.WORLD, n, rank, seed=seed)
                for name, g in groups.items():
                    results[f"{seed}|{kind}|{n}|{name}"] = distance(train(g, n, rank, seed=seed), reference)
        for g in groups.values():
            dist.destroy_process_group(g)
    if rank == 0:
        out.put(results)
    dist.destroy_process_group()


def print_seeds(results, seeds, steps, long_steps):
    """Each combination's distance and its ratio to mxfp8's of the same seed: mean and range over the
    seeds; the goal (the best 4-bit combination's mean ratio within FOUR_BIT_GOAL) for each run."""
    print(f"\n{seeds} seeds, {len(MATRIX)} wires: relative L2 distance from the fp32 gloo run of the same seed, and "
          "its ratio to mxfp8's (mean [min, max] over the seeds)")
    goals = []
    for kind in ("DDP", "FSDP2"):
        for n in run_lengths(steps, long_steps):
            print(f"{kind} {n} steps")
            ratios = {}
            for name in MATRIX:
                d = [results[f"{s}|{kind}|{n}|{name}"] for s in range(seeds)]
                r = [x / results[f"{s}|{kind}|{n}|{MATRIX_EIGHT_BIT}"] for s, x in enumerate(d)]
                ratios[name] = sum(r) / seeds
                print(f"{'':8}{name:24}{sum(d) / seeds:12.3e} [{min(d):.3e}, {max(d):.3e}]"
                      f"{ratios[name]:9.2f}x [{min(r):.2f}, {max(r):.2f}]")
            four_bit = [name for name in MATRIX if not name.startswith("mxfp8")]
            best = min(four_bit, key=ratios.get)
            goals.append(f"goal: {kind}, {n} steps: the best 4-bit combination ({best}) / mxfp8 = "
                         f"{ratios[best]:.2f} (<= {FOUR_BIT_GOAL:g}, mean of {seeds} seeds): "
                         f"{'met' if ratios[best] <= FOUR_BIT_GOAL else 'not met'}")
    print("\n".join(goals))


def levels_worker(steps, long_steps, out):
    """One rank of the 2 x 2 job (torchrun): each LEVEL_RUNS group's distance from gloo fp32, DDP and FSDP2,
    after `steps` and `long_steps`; rank 0 writes them to `out`."""
    import cnccl

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    groups = {name: dist.new_group(backend="cnccl", pg_options=cnccl.Options(min_bytes=0, **fields))
              for name, fields in LEVEL_RUNS.items()}
    levels = {name: cnccl.config(g)["wire_levels"] for name, g in groups.items()}
    results = {}
    for kind, train in (("DDP", train_ddp), ("FSDP2", train_fsdp2)):
        for n in run_lengths(steps, long_steps):
            reference = train(dist.group.WORLD, n, rank)
            for name, g in groups.items():
                results[f"{kind}|{n}|{name}"] = distance(train(g, n, rank), reference)
    if rank == 0:
        with open(out, "w") as f:
            json.dump({"distance": results, "levels": levels}, f)
    dist.destroy_process_group()


def run_levels(steps, long_steps):
    """The 2 hosts x 2 ranks job (two IPC namespaces); None, with the reason printed, where it cannot run."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        print("wire per level: skipped (two simulated hosts need root and `unshare --ipc`)")
        return None
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = dict({k: v for k, v in os.environ.items() if k != "UCX_NET_DEVICES"}, UCX_TLS="tcp", OMP_NUM_THREADS="1")
    with tempfile.TemporaryDirectory(prefix="cnccl-accuracy-") as tmp:
        out = os.path.join(tmp, "levels.json")
        procs, logs = [], []
        for host in range(2):
            logs.append(os.path.join(tmp, f"host{host}.log"))
            cmd = ["unshare", "--ipc", sys.executable, "-m", "torch.distributed.run", "--nnodes=2",
                   "--nproc_per_node=2", "--rdzv_backend=c10d", f"--rdzv_id=cnccl-accuracy-{port}",
                   f"--rdzv_endpoint=127.0.0.1:{port}", f"--rdzv_conf=is_host={int(host == 0)}",
                   os.path.abspath(__file__), "--levels-worker", out, "--steps", str(steps),
                   "--long-steps", str(long_steps)]
            with open(logs[-1], "w") as log:
                procs.append(subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT))
        codes = [p.wait() for p in procs]
        if codes != [0, 0]:
            raise SystemExit(f"the 2 x 2 job failed ({codes}):\n" +
                             "\n".join(open(p).read()[-3000:] for p in logs))
        with open(out) as f:
            return json.load(f)


def block_errors(n=1 << 20):
    """Relative L2 and mean per-element relative error of one encoding of heavy-tailed values, as the
    part's owner decodes it (cnccl's own frames: _C._encode_frames / _decode_frames)."""
    from cnccl import _C

    gen = torch.Generator().manual_seed(5)
    x = torch.randn(n, generator=gen) * torch.exp(2 * torch.randn(n, generator=gen))
    from wire_formats import hadamard, rotation_signs

    signs = rotation_signs(0)
    runs = [(label, wire, rule, False) for label, wire, rule in BLOCK_ERROR_RUNS]
    runs += [(label, wire, "rceil", True) for label, wire in ROTATED_BLOCK_ERROR_RUNS]
    out = {}
    for label, wire, rule, rotated in runs:
        v = hadamard(x, signs) if rotated else x
        decoded = _C._decode_frames(_C._encode_frames([v], n, 1.0, wire, rule), n, wire)[0]
        if rotated:
            decoded = hadamard(decoded, signs, forward=False)
        err = (decoded.double() - x.double()).abs()
        out[label] = {"l2": (err.norm() / x.double().norm()).item(),
                      "per_element": (err / x.double().abs()).mean().item(),
                      "zero": (decoded == 0).double().mean().item()}
    return out


def gaussian_errors(n=1 << 20):
    """Relative L2 error of one encoding of Gaussian values (a gradient's blocks have no outliers here) on
    each block wire, to nearest and stochastically (cnccl's frames: _C._encode_frames with sr_seed): the
    noise a 4-bit wire adds to every contribution, against mxfp8's."""
    from cnccl import _C

    x = torch.randn(n, generator=torch.Generator().manual_seed(6))
    out = {}
    for wire in ("mxfp8", "mxfp4", "nvfp4"):
        for sr in (False, True):
            frames = _C._encode_frames([x], n, 1.0, wire, sr_seed=1 if sr else None)
            decoded = _C._decode_frames(frames, n, wire)[0]
            out[f"{wire}{', sr' if sr else ''}"] = ((decoded.double() - x.double()).norm() / x.double().norm()).item()
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--long-steps", type=int, default=500, help="0: no long runs")
    ap.add_argument("--no-levels", action="store_true", help="skip the 2 hosts x 2 ranks job (a wire per level)")
    ap.add_argument("--levels-only", action="store_true", help="only that job")
    ap.add_argument("--seeds", type=int, default=0,
                    help="only the 4-bit matrix (MATRIX), over this many seeds, DDP and FSDP2 for --steps and "
                         "--long-steps")
    ap.add_argument("--json", default=os.path.join(RESULTS, "accuracy.json"))
    ap.add_argument("--levels-worker", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.levels_worker:
        return levels_worker(args.steps, args.long_steps, args.levels_worker)
    if args.seeds:
        results = spawn(seeds_worker, args.ranks, args.seeds, args.steps, args.long_steps)
        print_seeds(results, args.seeds, args.steps, args.long_steps)
        noise = gaussian_errors()
        print("\none encoding of 2^20 Gaussian values: relative L2 error, and its ratio to mxfp8's")
        for name, e in noise.items():
            print(f"{'':8}{name:24}{e:12.3e}{e / noise['mxfp8']:9.2f}x")
        return save_json({"ranks": args.ranks, "seeds": args.seeds, "steps": args.steps, "long_steps": args.long_steps,
                          "matrix": results, "gaussian_errors": noise},
                         args.json.replace("accuracy.json", "accuracy_seeds.json"))
    levels = None if args.no_levels else run_levels(args.steps, args.long_steps)
    if levels:
        print_levels(levels, args.steps, args.long_steps)
    if args.levels_only:
        return save_json({"steps": args.steps, "long_steps": args.long_steps, "levels": levels}, args.json)
    results, long = spawn(worker, args.ranks, args.steps, args.long_steps)
    print(f"relative L2 distance of the parameters from the fp32 gloo run after {args.steps} SGD steps, "
          f"{args.ranks} ranks")
    print(f"{'':8}{'run':38}{'distance':>12}{'vs':>10}  the run it is compared with")
    for key, d in results.items():
        kind, name = key.split("|")
        # 16-bit runs against the same wire with accumulate=wire; 8-bit and MX ones against e4m3 with one
        # exponent a part.
        base = name.split(",")[0] if name.split(",")[0] in ("cnccl fp16", "cnccl bf16") else PER_PART_E4M3
        ref = results.get(f"{kind}|{base}")
        ratio = f"{d / ref:9.2f}x  {base}" if ref and name.startswith("cnccl") and base != name else ""
        print(f"{kind:8}{name:38}{d:12.3e} {ratio}")
    if long:
        print(f"\nDDP for {args.long_steps} steps, {args.ranks} ranks: final loss (mean over ranks) and distance")
        print(f"{'':8}{'run':38}{'loss':>12}{'distance':>12}{'vs e4m3 per part':>18}")
        for name, r in long.items():
            e4m3 = long.get(PER_PART_E4M3, {}).get("distance")
            ratio = f"{r['distance'] / e4m3:17.2f}x" if e4m3 and r["distance"] else ""
            print(f"{'DDP':8}{name:38}{r['loss']:12.4f}{r['distance']:12.3e}{ratio}")
    blocks = block_errors()
    print("\none encoding of 2^20 heavy-tailed values (Gaussians times e^(2g)), as the owner decodes it")
    print(f"{'':8}{'wire':38}{'rel. L2':>12}{'per element':>12}{'to zero':>10}")
    for label, r in blocks.items():
        print(f"{'':8}{label:38}{r['l2']:12.3e}{r['per_element']:12.3e}{r['zero']:10.1%}")
    e4m3, rceil = blocks["e4m3, one exponent a part"], blocks["mxfp8, rceil"]
    for what, got, goal in (("mxfp8 rceil L2 / e4m3's", rceil["l2"] / e4m3["l2"], 1.0),
                            ("mxfp8 rceil per-element / e4m3's", rceil["per_element"] / e4m3["per_element"], 0.2)):
        print(f"goal: {what} = {got:.3f} (<= {goal}): {'met' if got <= goal else 'not met'}")
    four_bit_goals(results, long, args.steps, args.long_steps)
    if levels:
        print_levels(levels, args.steps, args.long_steps)
    save_json({"ranks": args.ranks, "steps": args.steps, "distance": results, "long_steps": args.long_steps,
               "long": long, "block_errors": blocks, "levels": levels}, args.json)


def four_bit_goals(results, long, steps, long_steps):
    """The best 4-bit wire's distance over mxfp8's, for each run that has both, printed met or not met."""
    rows = [(f"DDP, {steps} steps", {n: results[f"DDP|{n}"] for n in FOUR_BIT + [EIGHT_BIT]}),
            (f"FSDP2, {steps} steps", {n: results[f"FSDP2|{n}"] for n in FOUR_BIT + [EIGHT_BIT]})]
    if long:
        rows.append((f"DDP, {long_steps} steps", {n: long[n]["distance"] for n in FOUR_BIT + [EIGHT_BIT]}))
    for what, d in rows:
        best = min(FOUR_BIT, key=d.get)
        ratio = d[best] / d[EIGHT_BIT]
        short = lambda name: name[6:].replace(", accumulate=fp32", "")  # noqa: E731
        others = ", ".join(f"{short(n)} {d[n] / d[EIGHT_BIT]:.2f}x" for n in FOUR_BIT)
        print(f"goal: {what}: the best 4-bit wire ({short(best)}) / mxfp8 = {ratio:.2f} "
              f"(<= {FOUR_BIT_GOAL:g}): {'met' if ratio <= FOUR_BIT_GOAL else 'not met'} ({others})")


def print_levels(levels, steps, long_steps):
    wires = "; ".join(f"{n}: {w}" for n, w in levels["levels"].items())
    print(f"\na wire per level, 2 hosts x 2 ranks: relative L2 distance from the fp32 gloo run ({wires})")
    print(f"{'':8}{'run':38}" + "".join(f"{f'{n} steps':>14}{'vs mxfp8':>10}" for n in run_lengths(steps, long_steps)))
    d = levels["distance"]
    for kind in ("DDP", "FSDP2"):
        for name in LEVEL_RUNS:
            cells = ""
            for n in run_lengths(steps, long_steps):
                value, base = d[f"{kind}|{n}|{name}"], d[f"{kind}|{n}|{MXFP8_EVERYWHERE}"]
                cells += f"{value:14.3e}{value / base:9.2f}x"
            print(f"{kind:8}{name:38}{cells}")
    name, limit = LEVEL_GOAL
    for n in run_lengths(steps, long_steps):
        ratio = d[f"DDP|{n}|{name}"] / d[f"DDP|{n}|{MXFP8_EVERYWHERE}"]
        print(f"goal: DDP {name} distance / mxfp8 everywhere's after {n} steps = {ratio:.2f} (<= {limit:g}): "
              f"{'met' if ratio <= limit else 'not met'}")


if __name__ == "__main__":
    main()

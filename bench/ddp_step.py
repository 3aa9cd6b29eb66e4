"""DDP training step time of a ~25M-parameter model on CPU ranks: gloo, gloo + fp16_compress_hook, cnccl fp16.

Usage: python3 bench/ddp_step.py [--ranks 2] [--rounds 6] [--steps-per-round 2] [--batch 32] [--json FILE]

The three runs train their own copy of the same model on the same data (each rank cycles over two
fixed batches, which the model learns within a few steps), interleaved round by round so that
machine noise hits all alike. Reported: the median step time of each, its ratio to gloo + hook,
and the loss before and after the measured steps, so that speed is never bought with a broken
gradient: the losses must fall and agree across the three runs to the 16-bit rounding.
"""

import argparse
import os
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP

from allreduce import RESULTS, pin_to_own_core, save_json, spawn

CONFIGS = ["gloo", "gloo+fp16_hook", "cnccl-fp16"]
IN, WIDTH, CLASSES, DEPTH = 1024, 2048, 1024, 5


def make_model():
    torch.manual_seed(0)
    layers = [nn.Linear(IN, WIDTH), nn.ReLU()]
    for _ in range(DEPTH):
        layers += [nn.Linear(WIDTH, WIDTH), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(WIDTH, CLASSES))


def worker(rank, world, port, rounds, steps_per_round, batch, out):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")
    pin_to_own_core(rank, world)
    import cnccl

    dist.init_process_group("gloo", rank=rank, world_size=world)
    cnccl_group = dist.new_group(backend="cnccl", pg_options=cnccl.Options(wire_dtype="fp16"))
    teacher = torch.randn(IN, CLASSES, generator=torch.Generator().manual_seed(1))
    gen = torch.Generator().manual_seed(100 + rank)
    batches = [torch.randn(batch, IN, generator=gen) for _ in range(2)]
    batches = [(x, (x @ teacher).argmax(1)) for x in batches]
    runs = {}
    for name in CONFIGS:
        group = cnccl_group if name.startswith("cnccl") else dist.group.WORLD
        model = DDP(make_model(), process_group=group)
        if name == "gloo+fp16_hook":
            model.register_comm_hook(group, default_hooks.fp16_compress_hook)
        runs[name] = {"model": model, "opt": torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.9),
                      "steps": 0, "times": [], "losses": []}

    def step(run, timed):
        x, y = batches[run["steps"] % len(batches)]
        run["steps"] += 1
        t0 = time.perf_counter()
        loss = nn.functional.cross_entropy(run["model"](x), y)
        run["opt"].zero_grad(set_to_none=False)
        loss.backward()
        run["opt"].step()
        if timed:
            run["times"].append(time.perf_counter() - t0)
        run["losses"].append(loss.detach())

    for name in CONFIGS:  # warm-up: allocations, DDP's bucket rebuild after the first step
        for _ in range(2):
            step(runs[name], False)
    for _ in range(rounds):
        for name in CONFIGS:
            dist.barrier()
            for _ in range(steps_per_round):
                step(runs[name], True)
    result = {}
    for name in CONFIGS:
        losses = torch.stack([runs[name]["losses"][0], runs[name]["losses"][-1]])
        dist.all_reduce(losses)
        first, last = (losses / world).tolist()
        result[name] = {"step_s": statistics.median(runs[name]["times"]), "first_loss": first, "loss": last}
    params = sum(p.numel() for p in runs["gloo"]["model"].parameters())
    if rank == 0:
        out.put({"params": params, "runs": result, "steps": 2 + rounds * steps_per_round})
    dist.destroy_process_group()


def run(world=2, rounds=6, steps_per_round=2, batch=32):
    result = spawn(worker, world, rounds, steps_per_round, batch)
    result.update(ranks=world, batch=batch)
    return result


def table(result):
    runs = result["runs"]
    hook = runs["gloo+fp16_hook"]["step_s"]
    lines = [f"DDP step, {result['ranks']} ranks, {result['params'] / 1e6:.1f}M parameters, batch {result['batch']} "
             f"per rank; median step time; loss at the first and after the last of {result['steps']} steps "
             "(mean over ranks)"]
    lines.append(f"{'run':>15} {'step ms':>9} {'vs gloo+hook':>13} {'loss':>18}")
    for name in CONFIGS:
        r = runs[name]
        lines.append(f"{name:>15} {r['step_s'] * 1e3:9.1f} {r['step_s'] / hook:12.2f}x "
                     f"{r['first_loss']:8.4f} -> {r['loss']:.4f}")
    return "\n".join(lines)


def check(result):
    """Exits with an error unless every run's loss fell and the runs agree."""
    runs = result["runs"]
    for name, r in runs.items():
        if not r["loss"] < r["first_loss"]:
            raise SystemExit(f"{name}: the loss did not fall ({r['first_loss']:.4f} -> {r['loss']:.4f})")
    losses = [r["loss"] for r in runs.values()]
    if max(losses) - min(losses) > 1e-2 * max(losses):
        raise SystemExit(f"the runs' final losses disagree: {losses}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--steps-per-round", type=int, default=2)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--json", default=os.path.join(RESULTS, "ddp_step.json"), help="results file ('' for none)")
    args = parser.parse_args()
    result = run(args.ranks, args.rounds, args.steps_per_round, args.batch)
    print(table(result), flush=True)
    check(result)
    save_json(result, args.json)


if __name__ == "__main__":
    main()

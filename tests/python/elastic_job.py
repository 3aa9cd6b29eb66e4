"""A DDP job run by torchrun with --max-restarts (test_elastic.py): it trains a small model, saving a
checkpoint after every step and resuming from it, as an elastic job does. On the first attempt one rank
ends itself at a step (SIGKILL, or SIGSTOP: a rank that hangs); every rank records what it saw in
OUTDIR/attempt<N>-rank<R>.json: the steps it ran, the error that ended it and when, and the loss.

On the first attempt the survivors ignore SIGTERM, which torchrun sends them once it sees the victim
gone (torch/distributed/elastic/multiprocessing/api.py, PContext.close: SIGTERM, then SIGKILL after 30
s): each then lives to record the error its collective raised, so a survivor that waits for its
group's timeout instead is seen (torchrun kills it first, and it records nothing).

Usage (under torchrun): elastic_job.py OUTDIR STEPS VICTIM:STEP:SIGNAL GROUP_TIMEOUT_S
"""

import datetime
import json
import os
import signal
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

import cnccl  # noqa: F401  (registers the backend)


def main():
    outdir, steps, fault, timeout = sys.argv[1], int(sys.argv[2]), sys.argv[3], float(sys.argv[4])
    victim, kill_step, signame = fault.split(":")
    victim, kill_step, sig = int(victim), int(kill_step), getattr(signal, signame)
    attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    rank = int(os.environ["RANK"])
    record = {"attempt": attempt, "rank": rank, "pid": os.getpid(), "steps": [], "error": None}
    path = os.path.join(outdir, f"attempt{attempt}-rank{rank}.json")

    def save():
        with open(path + ".tmp", "w") as f:
            json.dump(record, f)
        os.replace(path + ".tmp", path)

    if attempt == 0 and rank != victim:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    started = time.time()
    dist.init_process_group("cnccl", timeout=datetime.timedelta(seconds=timeout))
    record["init_seconds"] = time.time() - started
    record["transport"] = cnccl.config()["cpu_transport"]
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(64, 256), nn.Tanh(), nn.Linear(256, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    checkpoint = os.path.join(outdir, "checkpoint.pt")
    first = 1
    if os.path.exists(checkpoint):
        state = torch.load(checkpoint)
        model.module.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        first = state["step"] + 1
    record["resumed_at"] = first
    save()
    gen = torch.Generator().manual_seed(rank)
    target = torch.linspace(-1, 1, 64)
    try:
        for step in range(first, steps + 1):
            if attempt == 0 and rank == victim and step == kill_step:
                record["signalled_at"] = time.time()
                save()
                os.kill(os.getpid(), sig)
            x = torch.randn(32, 64, generator=gen)
            loss = nn.functional.mse_loss(model(x).squeeze(1), x @ target)
            opt.zero_grad()
            loss.backward()
            opt.step()
            mean = loss.detach().clone()
            dist.all_reduce(mean, op=dist.ReduceOp.AVG)
            record["steps"].append(step)
            record["loss"] = mean.item()
            save()
            if rank == 0:
                torch.save({"model": model.module.state_dict(), "opt": opt.state_dict(), "step": step},
                           checkpoint + ".tmp")
                os.replace(checkpoint + ".tmp", checkpoint)
            dist.barrier()
    except Exception as e:
        record["error"] = f"{type(e).__name__}: {e}"
        record["failed_at"] = time.time()
        save()
        raise
    record["finished"] = True
    save()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

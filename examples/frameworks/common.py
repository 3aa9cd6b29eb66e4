"""What the framework examples share: one small model, its data, and the result file the tests read."""

import argparse
import time

import torch
import torch.distributed as dist
import torch.nn as nn


def arguments(hooks=()):
    """The options every example takes; `--hook` where the framework can run a seed hook."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--backend", default="cnccl")
    if hooks:
        parser.add_argument("--hook", choices=sorted(hooks), help="a seed compression hook (for gloo)")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--out", help="rank 0 saves the trained parameters and cnccl's counters here")
    return parser


def model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10))


def dataset(rank, n=256):
    """Each rank's own samples (no sampler: every framework gives each rank its own loader)."""
    gen = torch.Generator().manual_seed(100 + rank)
    x = torch.randn(n, 32, generator=gen)
    return torch.utils.data.TensorDataset(x, x[:, :10].argmax(1))


def save(path, params, **extra):
    """Rank 0 writes the trained parameters and what the backend counted (cnccl.stats() on cnccl).

    Every rank first waits in a barrier and then sleeps 200 ms with the GIL released. torch's gloo
    worker threads take the GIL after a work completes, while the training goes on: to free a comm
    hook's Python callback (c10::ivalue::ConcretePyObjectHolder) and the Python state a work captured
    (at::ThreadLocalState's SafePyObject). One that asks for it once the interpreter is finalizing is
    ended by CPython with pthread_exit, whose unwinding meets those noexcept destructors: the rank
    aborts with "terminate called without an active exception" (seen about once in 20 runs of the
    gloo reference, in a core dump). The pause lets them finish first; nothing signals when they have.
    """
    dist.barrier()
    time.sleep(0.2)
    if path and dist.get_rank() == 0:
        stats = {}
        if dist.get_backend() == "cnccl":
            import cnccl

            stats = dict(cnccl.stats())
        torch.save({"params": [p.detach().float().clone() for p in params], "stats": stats,
                    "backend": dist.get_backend(), **extra}, path)

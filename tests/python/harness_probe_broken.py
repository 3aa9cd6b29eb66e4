"""A module for test_harness.py's shared job: its Context fails on rank 1 alone, so its cases
cannot run on any rank."""

import torch.distributed as dist

from harness import Cases, gloo_group

case = Cases()


class Context:
    def __init__(self, rank, world):
        self.gloo = gloo_group()
        if rank == 1:
            raise RuntimeError("deliberate failure in the Context")
        self.rank = rank


@case
def needs_the_context(ctx):
    dist.barrier()

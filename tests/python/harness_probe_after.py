"""The module test_harness.py's shared job runs last: its Context and cases must work after the
modules before it failed a case part way and a Context, and none of their groups may be left."""

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d

from harness import Cases, gloo_group

case = Cases()


class Context:
    def __init__(self, rank, world):
        self.world = world
        self.groups_before = len(distributed_c10d._world.pg_map)
        self.gloo = gloo_group()


@case
def earlier_modules_left_no_groups(ctx):
    # The default group and the harness's step group.
    assert ctx.groups_before == 2, f"{ctx.groups_before} groups were left by the modules before"


@case
def its_groups_work(ctx):
    t = torch.ones(3)
    dist.all_reduce(t, group=ctx.gloo)
    assert torch.equal(t, torch.full((3,), float(ctx.world)))

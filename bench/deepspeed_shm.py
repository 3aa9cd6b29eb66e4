"""DeepSpeed's shared-memory CPU allreduce, as a benchmark variant.

DeepSpeed JIT-builds it as `ShareMemCommBuilder` (op_builder/cpu/comm.py) from
deepspeed/ops/csrc/cpu/comm/{shm_interface,shm}.cpp and calls `torch.ops.deepspeed.inference_all_reduce_`
for a SUM of ranks that all share one host (deepspeed/comm/torch.py). This module builds the same two
files with the builder's flags (-O2 -fopenmp) through torch.utils.cpp_extension, without importing
deepspeed (which pulls in far more than the op), so the benchmark measures exactly that op in the same run
as cnccl and gloo. Installing deepspeed (`pip install deepspeed`) is all it needs; without it the
benchmark leaves the variant out.

Its waits spin without yielding (shm.cpp, wait_buffer_state_until_2), so the benchmark runs it only
where every rank has a core of its own.
"""

import importlib.util
import os

_module = None


def sources():
    """The directory of DeepSpeed's CPU communication sources, or None where deepspeed is not installed."""
    spec = importlib.util.find_spec("deepspeed")
    if spec is None or not spec.submodule_search_locations:
        return None
    comm = os.path.join(spec.submodule_search_locations[0], "ops", "csrc", "cpu", "comm")
    return comm if os.path.isfile(os.path.join(comm, "shm.cpp")) else None


def available():
    return sources() is not None


def load():
    """Builds (once per machine, cached by cpp_extension) and loads the op; returns the module."""
    global _module
    if _module is None:
        from torch.utils import cpp_extension

        comm = sources()
        _module = cpp_extension.load(name="deepspeed_shm_comm_bench",
                                     sources=[os.path.join(comm, "shm_interface.cpp"), os.path.join(comm, "shm.cpp")],
                                     extra_include_paths=[comm], extra_cflags=["-O2", "-fopenmp"],
                                     extra_ldflags=["-fopenmp"], verbose=False)
    return _module


def initialize(module, rank, world):
    """What deepspeed.comm's CCLBackend-free CPU path does at init: every rank is local (LOCAL_SIZE),
    and the ranks meet through a shared-memory file named after MASTER_ADDR/MASTER_PORT."""
    os.environ["LOCAL_SIZE"] = str(world)
    module.initialize(world, rank)


def allreduce(x):
    """fp32 SUM in place over every rank."""
    import torch

    torch.ops.deepspeed.inference_all_reduce_(x)

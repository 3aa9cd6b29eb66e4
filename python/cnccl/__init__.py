"""cnccl: a c10d process-group backend that sends fp32 gradients as fp16/bf16.

``import cnccl`` registers the backend name ``"cnccl"`` for CPU and CUDA tensors; with the package
installed, ``torch.distributed.init_process_group("cnccl")`` also works without the import.
"""

import os

from cnccl._registration import register

__version__ = "0.1.0"

# For C++ programs: CMAKE_PREFIX_PATH=<this> finds cnccl's CMake package (find_package(cnccl)) in an
# installed package (pip install .), as torch.utils.cmake_prefix_path finds torch's.
cmake_prefix_path = os.path.dirname(os.path.abspath(__file__))

register()

# The extension loads on first use, not at import: torch's autoload imports this package inside
# `import torch`, which must never fail because of it.
_EXTENSION_NAMES = ("Options", "ProcessGroupCNCCL", "build_info")


def __getattr__(name):
    if name in _EXTENSION_NAMES:
        from cnccl import _C

        return getattr(_C, name)
    raise AttributeError(f"module 'cnccl' has no attribute {name!r}")


def stats(group=None):
    """Counters of a cnccl group (the default group when None): collectives run, bytes the
    tensors would have sent uncompressed, bytes actually sent, the transport's byte count, and what the
    casts met (cast_nonfinite, cast_saturated; with telemetry=error, quantization_error)."""
    return backend(group).stats()


def config(group=None):
    """The settings a cnccl group runs with (defaults, CNCCL_* variables and Options combined)."""
    return backend(group).config()


def backend(group=None):
    """The ProcessGroupCNCCL behind a process group."""
    import torch
    import torch.distributed as dist

    pg = group if group is not None else dist.distributed_c10d._get_default_group()
    impl = pg._get_backend(torch.device("cpu"))
    from cnccl._C import ProcessGroupCNCCL

    # Under TORCH_DISTRIBUTED_DEBUG=DETAIL torch wraps every backend in its collective checker.
    impl = getattr(impl, "wrapped_pg", impl)

    if not isinstance(impl, ProcessGroupCNCCL):
        raise ValueError(f"process group uses backend {dist.get_backend(pg)!r}, not cnccl")
    return impl


__all__ = ["Options", "ProcessGroupCNCCL", "backend", "build_info", "cmake_prefix_path", "config", "register", "stats",
           "__version__"]

"""Registers "cnccl" with torch.distributed. Cheap: the C++ extension loads on first group creation."""

import threading
import warnings

_lock = threading.Lock()
_registered = False


def _check_torch():
    """cnccl._C serves the torch minor it was built against; beside another it may fail to load, or load
    and misbehave. Checked where a group is made, so that registering stays unable to fail."""
    import torch

    try:
        from cnccl._built_for import TORCH_VERSION
    except ImportError as err:
        raise RuntimeError("cnccl: this install has no build (cnccl/_built_for.py is missing): reinstall cnccl "
                           "(pip install --no-build-isolation .)") from err
    built, running = TORCH_VERSION.split(".")[:2], torch.__version__.split("+")[0].split(".")[:2]
    if built != running:
        raise RuntimeError(f"cnccl: built for torch {'.'.join(built)}, running with torch {'.'.join(running)}: "
                           "reinstall cnccl beside this torch (pip install --no-build-isolation .)")


def _create(dist_backend_opts, pg_options):
    _check_torch()
    from cnccl._C import Options, ProcessGroupCNCCL, _group_store, build_info

    if pg_options is None:
        options = Options()
    elif isinstance(pg_options, Options):
        options = pg_options
    else:
        raise TypeError(f"cnccl: pg_options must be a cnccl.Options, got {type(pg_options).__name__}")
    # The group's timeout wins, as torch does for nccl's options: it is what every other backend of
    # the group (and torch's own checks) use.
    from torch.distributed.constants import default_pg_timeout

    if options._timeout not in (default_pg_timeout, dist_backend_opts.timeout):
        warnings.warn(
            f"cnccl: pg_options timeout {options._timeout} is overridden by the group's timeout "
            f"{dist_backend_opts.timeout} (pass timeout= to init_process_group/new_group instead)",
            stacklevel=2,
        )
    options._timeout = dist_backend_opts.timeout
    options.group_name = dist_backend_opts.group_id or ""
    options.global_ranks_in_group = list(dist_backend_opts.global_ranks_in_group)
    rank, size = dist_backend_opts.group_rank, dist_backend_opts.group_size
    # Keys of an earlier group of this name (a job torchrun restarted) may still be in the store.
    # The ranks also agree there on the engines they build next: a rank building another would leave the
    # others waiting in gloo's connections until the timeout.
    store = _group_store(dist_backend_opts.store, rank, size, dist_backend_opts.timeout, options.group_name or "unnamed",
                         options._engine_settings())
    cpu_engine = cuda_engine = None
    if options._resolved_cpu_engine() == "gloo":
        cpu_engine = _gloo_engine(store, rank, size, dist_backend_opts.timeout, "cnccl/gloo/")
    # cuda_engine=gloo: CUDA tensors' collectives on a gloo group of their own (the CPU engine's runs its
    # calls on an issuer thread, with which the callers' CUDA calls would interleave).
    if options._resolved_cuda_engine() == "gloo" and build_info()["cuda_collectives"]:
        cuda_engine = _gloo_engine(store, rank, size, dist_backend_opts.timeout, "cnccl/gloo-cuda/")
    return ProcessGroupCNCCL(store, rank, size, options, cpu_engine, cuda_engine)


def _gloo_engine(store, rank, size, timeout, prefix):
    """The gloo group a cpu_engine=gloo group composes (built here: torch's wheel ships no gloo headers
    for C++ to build it with), with one worker thread where gloo's default is two.

    After every work, ProcessGroupGloo::runLoop (torch/csrc/distributed/c10d/ProcessGroupGloo.cpp)
    assigns the group's pgStatus_->lastCompletedWorkName outside its lock: two workers finishing at once
    race on one std::string. cnccl keeps several works of its gloo group in flight (a call per dtype of a
    coalesced collective, the agreement beside the collective), and the names of some are too long for the
    string's inline buffer (ALLGATHER_COALESCED, ALLREDUCE_COALESCED, _REDUCE_SCATTER_BASE): the race then
    frees a heap buffer twice, which corrupts the heap (docs/testing.md, "The heap corruption at 4 ranks").
    One worker runs the group's works in order; none of them waits on another of the group's works there.
    """
    import os

    from torch.distributed import PrefixStore, ProcessGroupGloo

    gloo_options = ProcessGroupGloo._Options()
    gloo_options._timeout = timeout
    # The devices gloo's own constructor picks (torch/csrc/distributed/c10d/init.cpp, ProcessGroupGloo's
    # init from a timeout): one per interface in GLOO_SOCKET_IFNAME, else the host's default. torch splits
    # the list with std::getline, which drops an empty last piece ("eth0,").
    interfaces = os.environ.get("GLOO_SOCKET_IFNAME", "")
    if len(interfaces) > 1:
        names = interfaces.split(",")
        if names[-1] == "":
            names.pop()
        gloo_options._devices = [ProcessGroupGloo.create_device(interface=i) for i in names]
    else:
        gloo_options._devices = [ProcessGroupGloo.create_default_device()]
    gloo_options._threads = 1
    return ProcessGroupGloo(PrefixStore(prefix, store), rank, size, gloo_options)


def register():
    """Registers the backend once per process (later calls do nothing)."""
    global _registered
    # Imported before taking the lock: when `import cnccl` comes first, this import runs torch's
    # autoload, which calls register() again on this thread.
    from torch.distributed import Backend

    with _lock:
        if _registered:
            return
        existing = Backend._plugins.get("CNCCL")
        if existing is not None and getattr(existing.creator_fn, "__module__", None) != __name__:
            fn = existing.creator_fn
            raise RuntimeError(
                f"cnccl: the backend name 'cnccl' is already registered by "
                f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', fn)}; refusing to replace it"
            )
        if existing is None:
            Backend.register_backend("cnccl", _create, extended_api=True, devices=["cpu", "cuda"])
        _registered = True

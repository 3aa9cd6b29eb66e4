"""What a cnccl process group costs each rank: memory, descriptors and threads, beside a gloo group.

Usage: python3 bench/group_memory.py [--ranks 2] [--groups 64] [--json FILE]

Each rank creates the groups one after another and runs a 4 KiB allreduce on each (so that every
group has connected), then reports per group: its private memory (Private_Dirty of
/proc/self/smaps_rollup), the machine's shared memory (Shmem of /proc/meminfo: the ranks' segments
and UCX's shared-memory pools; run nothing beside it), open descriptors and threads. Variants, each
in fresh processes: cnccl on shared memory (the default), cnccl with CNCCL_SHM=off (UCX only), gloo.
"""

import argparse
import json
import os
import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

VARIANTS = {"cnccl-shm": ("cnccl", "auto"), "cnccl-ucx": ("cnccl", "off"), "gloo": ("gloo", "auto")}


def private_kib():
    for line in open("/proc/self/smaps_rollup"):
        if line.startswith("Private_Dirty:"):
            return int(line.split()[1])
    raise RuntimeError("no Private_Dirty in smaps_rollup")


def machine_shmem_kib():
    for line in open("/proc/meminfo"):
        if line.startswith("Shmem:"):
            return int(line.split()[1])
    raise RuntimeError("no Shmem in /proc/meminfo")


def counts():
    return len(os.listdir("/proc/self/fd")), len(os.listdir("/proc/self/task"))


def rank_main(rank, world, port, backend, shm, groups, out):
    os.environ["CNCCL_SHM"] = shm
    if backend == "cnccl":
        import cnccl  # noqa: F401  registers the backend
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    x = torch.ones(1024)
    dist.barrier()
    private, shmem, (fds, threads) = private_kib(), machine_shmem_kib(), counts()
    made = []
    for _ in range(groups):
        made.append(dist.new_group(backend=backend))
        dist.all_reduce(x, group=made[-1])
    dist.barrier()
    fds_after, threads_after = counts()
    result = {"private_mib": (private_kib() - private) / 1024 / groups,
              "fds": (fds_after - fds) / groups, "threads": (threads_after - threads) / groups}
    dist.barrier()  # every rank has made every group before the machine-wide reading
    if rank == 0:
        result["machine_shmem_mib"] = (machine_shmem_kib() - shmem) / 1024 / groups
        out.put(result)
    dist.destroy_process_group()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def measure(world, backend, shm, groups):
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=rank_main, args=(r, world, port, backend, shm, groups, out)) for r in range(world)]
    for p in procs:
        p.start()
    result = out.get(timeout=600)
    for p in procs:
        p.join(timeout=120)
        if p.exitcode != 0:
            raise RuntimeError(f"a rank of {backend} (CNCCL_SHM={shm}) exited with {p.exitcode}")
    return result


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--groups", type=int, default=64)
    ap.add_argument("--json")
    args = ap.parse_args()
    rows = {name: measure(args.ranks, backend, shm, args.groups) for name, (backend, shm) in VARIANTS.items()}
    print(f"per group, {args.ranks} ranks, {args.groups} groups:")
    print(f"{'variant':<10} {'private MiB/rank':>17} {'machine shmem MiB':>18} {'fds/rank':>9} {'threads/rank':>13}")
    for name, r in rows.items():
        print(f"{name:<10} {r['private_mib']:>17.2f} {r['machine_shmem_mib']:>18.2f} {r['fds']:>9.1f} "
              f"{r['threads']:>13.1f}")
    for name in ("cnccl-shm", "cnccl-ucx"):
        r = rows[name]
        total = args.groups * (args.ranks * r["private_mib"] + r["machine_shmem_mib"])
        print(f"{name}: {args.groups} groups cost the {args.ranks} ranks {total:.0f} MiB of memory in all")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"ranks": args.ranks, "groups": args.groups, "per_group": rows}, f, indent=1)


if __name__ == "__main__":
    main()

"""One rank of test_faults.py: a stream of collectives during which the victim rank SIGKILLs itself,
between two collectives ("between") or from a timer while a multi-chunk allreduce is in flight
("during"). Survivors record how the failure surfaced and how long destroy_process_group() took."""

import datetime
import json
import os
import signal
import random
import sys
import threading
import time

import torch
import torch.distributed as dist

import cnccl  # noqa: F401
from harness import connect_store


def main():
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    victim, kill_at, timeout, when = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
    # 4 MiB of fp32 is several shared-memory chunks: a kill during it lands between chunks' steps.
    n = 1 << (20 if when == "during" else 16)
    dist.init_process_group("cnccl", store=connect_store(), rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=timeout))
    result = {"rank": rank}
    last_ok = time.monotonic()
    try:
        for i in range(100_000):
            if rank == victim and i == kill_at:
                if when == "between":
                    os.kill(os.getpid(), signal.SIGKILL)
                threading.Timer(random.uniform(0, 0.002), os.kill, (os.getpid(), signal.SIGKILL)).start()
            t = torch.full((n,), float(rank))
            b = torch.full((1000,), float(rank + 10))
            works = [(dist.all_reduce(t, async_op=True), t, float(rank)),
                     (dist.broadcast(b, 0, async_op=True), b, float(rank + 10))]
            for w, tensor, before in works:
                try:
                    w.wait()
                except dist.DistBackendError:
                    # The collective that failed must have left its tensor as it was.
                    result["failed_tensor_unmodified"] = bool(torch.all(tensor == before))
                    raise
            assert torch.all(t == sum(range(world))) and torch.all(b == 10.0), (t[0].item(), b[0].item())
            last_ok = time.monotonic()
        result["error"] = None
    except dist.DistBackendError as e:
        result["error"] = str(e).split("\nException raised from")[0]
        result["seconds_to_error"] = time.monotonic() - last_ok
    start = time.monotonic()
    dist.destroy_process_group()
    result["destroy_seconds"] = time.monotonic() - start
    with open(os.path.join(os.environ["CNCCL_TEST_OUT"], f"rank{rank}.json"), "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()

"""One rank of test_faults.py: a stream of collectives during which the victim rank SIGKILLs itself.
Survivors record how the failure surfaced and how long destroy_process_group() took."""

import datetime
import json
import os
import signal
import sys
import time

import torch
import torch.distributed as dist

import cnccl  # noqa: F401
from harness import connect_store


def main():
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    victim, kill_at, timeout = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
    dist.init_process_group("cnccl", store=connect_store(), rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=timeout))
    result = {"rank": rank}
    last_ok = time.monotonic()
    try:
        for i in range(100_000):
            if rank == victim and i == kill_at:
                os.kill(os.getpid(), signal.SIGKILL)
            t = torch.full((1 << 16,), float(rank))
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

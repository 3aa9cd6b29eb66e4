"""`python -m cnccl`: what this build is, then a 2-process allreduce on this machine.

Prints the build (cnccl and the torch it was built for, the CPU codec, the CUDA path and its NCCL,
UCX), runs `dist.all_reduce` on a cnccl group of two local processes and says which path carried it,
whether it was compressed and whether the result is exact. Exits non-zero when the build does not
match the torch it runs beside, or the allreduce fails, hangs or is wrong.
"""

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
import time

WORLD = 2
ELEMENTS = 1 << 20  # 4 MiB of fp32: above any default min_bytes, so the wire is compressed
TIMEOUT_S = 120


def contribution(rank):
    """Multiples of 1/4 below 128 (11 significant bits): they and their sum over the two ranks are
    exact in fp16 and bf16 alike, so any correct path returns the exact fp32 sum, bit for bit."""
    import torch

    return (torch.arange(ELEMENTS, dtype=torch.float32) % 512) / 4 * (rank + 1)


def rank_main(rank, store_path, report):
    import torch
    import torch.distributed as dist

    import cnccl

    dist.init_process_group("cnccl", store=dist.FileStore(store_path, WORLD), rank=rank, world_size=WORLD,
                            timeout=datetime.timedelta(seconds=TIMEOUT_S / 2))
    x = contribution(rank)
    dist.all_reduce(x)
    expected = sum(contribution(r) for r in range(WORLD))
    wrong = int((x != expected).sum())
    stats, config = cnccl.stats(), cnccl.config()
    dist.destroy_process_group()
    if rank == 0:
        with open(report, "w") as f:
            json.dump({"wrong": wrong, "transport": config["cpu_transport"], "engine": config["cpu_engine"],
                       "wire": config["wire_dtype"], "compressed": stats["compressed_collectives"],
                       "bytes_sent": stats["bytes_sent"], "bytes_uncompressed": stats["bytes_uncompressed"]}, f)
    return 0 if wrong == 0 else 1


def describe_build():
    import torch

    import cnccl

    info = cnccl.build_info()
    print(f"cnccl {info['version']} built for torch {info['torch_version']}, running with torch {torch.__version__}")
    print(f"  package: {os.path.dirname(cnccl.__file__)}")
    if info["ucx_version"]:
        print(f"  CPU codec: {info['cpu_codec']}; UCX {info['ucx_version']} (host path: shared memory within a host, "
              "UCX across hosts)")
    else:
        print(f"  CPU codec: {info['cpu_codec']}; built without UCX (CNCCL_WITH_UCX=OFF): no host path, CPU tensors "
              "go through gloo, within a host and across hosts")
    if info["cuda_collectives"]:
        nccl = info["nccl_version"]
        from cnccl._C import Options

        try:
            engine = Options()._resolved_cuda_engine()
        except ValueError:  # a bad CNCCL_* setting: the allreduce below fails naming it
            engine = "unknown (the settings are invalid)"
        over = (f"NCCL {nccl // 10000}.{nccl // 100 % 100}.{nccl % 100}" if engine == "nccl" else
                "gloo, staged through host memory (CNCCL_CUDA_ENGINE=gloo: ranks may share a GPU)" if engine == "gloo"
                else engine)
        print(f"  CUDA path: built; CUDA tensors over {over}; "
              f"{torch.cuda.device_count()} GPU(s) visible (this check runs on CPU tensors)")
    else:
        print("  CUDA path: not built (torch or the toolkit lacks CUDA)")
    built, running = info["torch_version"].split(".")[:2], torch.__version__.split("+")[0].split(".")[:2]
    if built != running:
        print(f"FAIL: built for torch {'.'.join(built)}, running with {'.'.join(running)}: reinstall cnccl "
              "(pip install --no-build-isolation .) beside this torch")
        return False
    return True


def check_allreduce():
    with tempfile.TemporaryDirectory(prefix="cnccl-check-") as tmp:
        store, report = os.path.join(tmp, "store"), os.path.join(tmp, "report.json")
        procs = [subprocess.Popen([sys.executable, "-m", "cnccl", "--rank", str(r), "--store", store, "--report", report],
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in range(WORLD)]
        start, outputs, codes = time.monotonic(), [], []
        for p in procs:
            try:
                out, _ = p.communicate(timeout=max(1.0, TIMEOUT_S - (time.monotonic() - start)))
            except subprocess.TimeoutExpired:
                p.kill()
                out, _ = p.communicate()
            outputs.append(out)
            codes.append(p.returncode)
        if any(codes) or not os.path.exists(report):
            for r, (code, out) in enumerate(zip(codes, outputs)):
                print(f"--- rank {r} (exit {code}) ---\n{out.strip()[-3000:]}")
            print(f"FAIL: the {WORLD}-process allreduce did not complete (exit codes {codes})")
            return False
        with open(report) as f:
            result = json.load(f)
    saved = 1 - result["bytes_sent"] / max(1, result["bytes_uncompressed"])
    print(f"allreduce of {ELEMENTS} fp32 elements on {WORLD} processes: CPU engine {result['engine']}, "
          f"transport {result['transport']}, wire {result['wire']}, "
          f"{'compressed' if result['compressed'] else 'not compressed'} ({saved:.0%} of the bytes saved)")
    if result["wrong"]:
        print(f"FAIL: {result['wrong']} elements differ from the exact sum")
        return False
    print("OK: the result is the exact sum")
    return True


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m cnccl", description=__doc__.splitlines()[0])
    parser.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--store", help=argparse.SUPPRESS)
    parser.add_argument("--report", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.rank is not None:
        return rank_main(args.rank, args.store, args.report)
    ok = describe_build()
    return 0 if check_allreduce() and ok else 1


if __name__ == "__main__":
    sys.exit(main())

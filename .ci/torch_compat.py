"""Compiles cnccl's torch-facing sources against another torch's headers (default: 2.11.0, the GPU
machine's), without building or linking: the Backend/Work/ProcessGroupNCCL API moves between
minors, and the source must build against both the pinned torch and that one.

    python3 .ci/torch_compat.py [VERSION]     (after .ci/setup; reads build/compile_commands.json)
"""

import concurrent.futures
import json
import os
import shlex
import subprocess
import sys
import zipfile
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
VERSION = sys.argv[1] if len(sys.argv) > 1 else "2.11.0"
CACHE = Path(os.environ.get("CNCCL_COMPAT_CACHE", Path.home() / ".cache" / "cnccl-torch-compat")) / VERSION


def headers():
    include = CACHE / "torch" / "include"
    if include.is_dir():
        return include
    CACHE.mkdir(parents=True, exist_ok=True)
    subprocess.check_call([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--disable-pip-version-check",
                           "-d", str(CACHE), f"torch=={VERSION}"])
    wheel = next(CACHE.glob("torch-*.whl"))
    with zipfile.ZipFile(wheel) as z:
        z.extractall(CACHE, [n for n in z.namelist() if n.startswith("torch/include/")])
    wheel.unlink()
    return include


def main():
    ours = str(Path(torch.__file__).parent / "include")
    theirs = str(headers())
    build = Path(os.environ.get("CNCCL_BUILD_DIR", REPO / "build"))
    jobs = []
    for entry in json.load(open(build / "compile_commands.json")):
        src = entry["file"]
        if not (src.startswith(str(REPO / "backend")) or src.endswith("binding.cpp")):
            continue
        args = shlex.split(entry["command"])
        i = args.index("-o")
        del args[i:i + 2]
        jobs.append((src, [a.replace(ours, theirs) for a in args] + ["-fsyntax-only"], entry["directory"]))

    def compile_one(job):
        src, args, cwd = job
        r = subprocess.run(args, cwd=cwd, capture_output=True, text=True)
        return src, r.returncode, r.stderr

    failed = 0
    with concurrent.futures.ThreadPoolExecutor(os.cpu_count() or 2) as pool:
        for src, rc, err in pool.map(compile_one, jobs):
            print(f"{'ok  ' if rc == 0 else 'FAIL'} {os.path.relpath(src, REPO)}")
            if rc:
                failed += 1
                print("\n".join(line for line in err.splitlines() if "error" in line))
    print(f"torch {VERSION} headers: {len(jobs) - failed}/{len(jobs)} sources compile")
    return 1 if failed or not jobs else 0


if __name__ == "__main__":
    sys.exit(main())

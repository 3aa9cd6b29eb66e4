"""Compiles every C++ translation unit that bench/gpu_check.sh builds (backend, compress, python,
tests/cpp, bench, and the C++ example) against another torch's headers (default: 2.11.0, the GPU
machine's), without building or linking: the Backend/Work/ProcessGroupNCCL API moves between
minors, and the source must build against both the pinned torch and that one. Fails unless the
CUDA path's sources (backend/cuda/) were among them: a build without CUDA would check too little.
The CUDA kernels (.cu) include no torch header and are not compiled here.

    python3 .ci/torch_compat.py [VERSION]     (after .ci/setup; reads build/compile_commands.json)
"""

import concurrent.futures
import functools
import hashlib
import json
import os
import shlex
import subprocess
import sys
import tempfile
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


def sha256(data):
    return hashlib.sha256(data).hexdigest()


@functools.cache
def digest(path):
    try:
        return sha256(Path(path).read_bytes())
    except OSError:
        return None


def dependencies(make_rule):
    """The files a make rule written by the compiler's -MD names after its target."""
    return shlex.split(Path(make_rule).read_text().replace("\\\n", " ").split(":", 1)[1])


# Where gpu_check.sh's sources live; the example is built by its own CMake project against the
# installed package, so its command is a test's with the source swapped.
DIRS = ("backend/", "compress/", "python/", "tests/cpp/", "bench/")
EXAMPLE = REPO / "examples" / "cpp_allreduce" / "main.cpp"
CUDA_SOURCES = "backend/cuda/"


def without_pch(args):
    """A compile command without the build's precompiled header (CNCCL_PCH), which holds the pinned
    torch's headers: each unit is compiled from its own includes, as a build without it would."""
    out = []
    i = 0
    while i < len(args):
        if args[i] == "-include" and i + 1 < len(args) and args[i + 1].endswith("cmake_pch.hxx"):
            i += 2
            continue
        if args[i] != "-Winvalid-pch":
            out.append(args[i])
        i += 1
    return out


def main():
    ours = str(Path(torch.__file__).parent / "include")
    theirs = str(headers())
    build = Path(os.environ.get("CNCCL_BUILD_DIR", REPO / "build"))
    jobs = []
    template = None
    for entry in json.load(open(build / "compile_commands.json")):
        src = Path(entry["file"]).resolve()
        rel = str(src.relative_to(REPO)) if src.is_relative_to(REPO) else ""
        if not rel.startswith(DIRS) or src.suffix == ".cu":
            continue
        args = without_pch(shlex.split(entry["command"]))
        i = args.index("-o")
        del args[i:i + 2]
        args = [a.replace(ours, theirs) for a in args] + ["-fsyntax-only"]
        jobs.append((rel, args, entry["directory"]))
        if rel == "tests/cpp/test_composition.cpp":
            template = (args, entry["directory"], entry["file"])
    if template is None:
        print("FAIL: no compile command for tests/cpp/test_composition.cpp: configure with CNCCL_BUILD_TESTS=ON")
        return 1
    args, cwd, test_src = template
    jobs.append((str(EXAMPLE.relative_to(REPO)), [str(EXAMPLE) if a == test_src else a for a in args], cwd))

    passed = CACHE / "passed"
    passed.mkdir(exist_ok=True)
    compiler = subprocess.run([jobs[0][1][0], "--version"], capture_output=True).stdout

    def compile_one(job):
        """A unit checked before on this machine with the same flags and the same text in every file it
        read is not compiled again (a deterministic compiler gives the same verdict): ccache's direct
        mode. The compile itself lists the files it read (-MD), so a unit never seen costs no more
        than its compile. The checkout's folder is taken out of keys and paths, so every clone shares
        the verdicts."""
        rel, args, cwd = job
        key = sha256(compiler + b"\0" + " ".join(args).replace(str(REPO), "<repo>").encode())
        record = passed / key
        if record.exists() and all(digest(path.replace("<repo>", str(REPO))) == want
                                   for path, want in json.loads(record.read_text())):
            return rel, 0, "", True
        with tempfile.NamedTemporaryFile(suffix=".d") as deps:
            r = subprocess.run(args + ["-MD", "-MF", deps.name], cwd=cwd, capture_output=True, text=True)
            if r.returncode == 0:
                read = [str(Path(cwd, path).resolve()) for path in dependencies(deps.name)]
                record.write_text(json.dumps([[path.replace(str(REPO), "<repo>"), digest(path)] for path in read]))
        return rel, r.returncode, r.stderr, False

    failed = 0
    with concurrent.futures.ThreadPoolExecutor(os.cpu_count() or 2) as pool:
        for rel, rc, err, known in pool.map(compile_one, jobs):
            print(f"{'ok  ' if rc == 0 else 'FAIL'} {rel}{' (checked before)' if known else ''}")
            if rc:
                failed += 1
                print("\n".join(line for line in err.splitlines() if "error" in line))
    cuda = [rel for rel, _, _ in jobs if rel.startswith(CUDA_SOURCES)]
    print(f"torch {VERSION} headers: {len(jobs) - failed}/{len(jobs)} sources compile; CUDA path: "
          f"{', '.join(cuda) if cuda else 'NONE'}")
    if not cuda:
        print(f"FAIL: no {CUDA_SOURCES} source was compiled: this build has no CUDA path (CNCCL_WITH_CUDA off)")
    return 1 if failed or not cuda else 0

if __name__ == "__main__":
    sys.exit(main())

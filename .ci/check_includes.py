#!/usr/bin/env python3
"""Fails when an #include crosses a line between the source tree's rooms (docs/design.md, "Layout").

Each rule names the files it governs (a path prefix) and the project headers they must not include
(path prefixes, or a system header such as <ucp/...>). A file is governed by every rule whose prefix
it starts with. Usage: .ci/check_includes.py [ROOT]; prints each crossing and exits 1 when there is one.
"""
import pathlib
import re
import sys

HOST = "backend/host/"
# (files, forbidden includes, why): the why is printed with each crossing.
RULES = [
    ("compress/", ["backend/", "python/", "<torch/csrc/distributed"],
     "the codec is pure functions on buffers: it knows nothing of c10d or the backend"),
    (HOST + "transport/", [HOST + "algorithms/", HOST + "shm/", HOST + "host_path", HOST + "executor",
                           HOST + "staging", "backend/composed/", "backend/cuda/"],
     "the transport carries bytes between ranks: it never knows which algorithm sends them"),
    (HOST + "algorithms/", [HOST + "transport/ucx_transport", HOST + "transport/transport.h", HOST + "shm/",
                            HOST + "host_path", HOST + "executor", HOST + "staging", "<ucp/", "<ucs/",
                            "backend/composed/", "backend/cuda/"],
     "an algorithm sees its peers through Comm only, never UCX, shared memory or the funnel"),
    (HOST + "shm/", [HOST + "transport/ucx_transport", HOST + "host_path", HOST + "executor", HOST + "staging",
                     "<ucp/", "<ucs/", "backend/composed/", "backend/cuda/"],
     "shared memory is one host's channel and its collectives: no UCX, no funnel"),
    ("backend/composed/", [HOST, "backend/cuda/"],
     "the composition is engine-agnostic: it wraps an inner engine, never the host path or NCCL's"),
    ("backend/cuda/", [HOST],
     "the CUDA path composes NCCL; the host path is another engine"),
]
# Outside backend/host/, the host path is reached through its one entry header.
HOST_ENTRY = HOST + "host_path.h"
# UCX's own headers appear only in the UCX transport.
UCX_HEADERS = ("<ucp/", "<ucs/", "<uct/")
UCX_HOME = HOST + "transport/ucx_transport."

INCLUDE = re.compile(r'^\s*#\s*include\s+([<"][^>"]+[>"])', re.M)
SOURCES = ("backend", "compress", "python", "bench", "tests/cpp", "examples")


def crossings(root: pathlib.Path):
    for top in SOURCES:
        for path in sorted((root / top).rglob("*")):
            if path.suffix not in {".h", ".hpp", ".cpp", ".cu", ".cuh"}:
                continue
            rel = path.relative_to(root).as_posix()
            for spelled in INCLUDE.findall(path.read_text(errors="replace")):
                header = spelled[1:-1] if spelled[0] == '"' else spelled[:-1]
                for files, forbidden, why in RULES:
                    if not rel.startswith(files):
                        continue
                    for prefix in forbidden:
                        if header.startswith(prefix):
                            yield rel, spelled, why
                if rel.startswith(("backend/", "python/", "bench/", "examples/")) and not rel.startswith(HOST):
                    if header.startswith(HOST) and header != HOST_ENTRY:
                        yield rel, spelled, f"outside backend/host/ only {HOST_ENTRY} is included"
                if header.startswith(UCX_HEADERS) and not rel.startswith(UCX_HOME):
                    yield rel, spelled, f"UCX's headers belong to {UCX_HOME}*"


def main() -> int:
    root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else pathlib.Path(__file__).resolve().parent.parent)
    found = list(crossings(root))
    for rel, spelled, why in found:
        print(f"{rel}: #include {spelled}: {why}")
    print(f"include rules: {len(found)} crossing(s)")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())

"""The source tree's rooms (docs/design.md, "Rooms"): .ci/check_includes.py passes on the tree and fails,
naming the file, the include and the rule, on each kind of crossing."""

import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
CHECK = ROOT / ".ci" / "check_includes.py"


def check(root):
    r = subprocess.run([sys.executable, str(CHECK), str(root)], capture_output=True, text=True, timeout=60)
    return r.returncode, r.stdout + r.stderr


def test_the_tree_keeps_its_rooms():
    rc, out = check(ROOT)
    assert rc == 0, out
    assert "0 crossing(s)" in out, out


@pytest.mark.parametrize("source, include, rule", [
    ("backend/host/algorithms/allreduce_ring.cpp", '"backend/host/shm/shm_comm.h"', "through Comm only"),
    ("backend/host/algorithms/rooted.cpp", "<ucp/api/ucp.h>", "through Comm only"),
    ("backend/host/transport/comm.cpp", '"backend/host/algorithms/algorithms.h"', "never knows which algorithm"),
    ("backend/host/shm/reduce_shm.cpp", '"backend/host/transport/ucx_transport.h"', "no UCX, no funnel"),
    ("backend/host/shm/copy_shm.cpp", '"backend/host/staging.h"', "no UCX, no funnel"),
    ("compress/cpu/mx.cpp", '"backend/policy.h"', "knows nothing of c10d"),
    ("backend/composed/composition.cpp", '"backend/host/host_path.h"', "engine-agnostic"),
    ("backend/process_group.cpp", '"backend/host/transport/comm.h"', "only backend/host/host_path.h"),
])
def test_a_crossing_include_fails_naming_the_rule(tmp_path, source, include, rule):
    path = tmp_path / source
    path.parent.mkdir(parents=True)
    path.write_text(f"#include {include}\n")
    rc, out = check(tmp_path)
    assert rc == 1, out
    assert f"{source}: #include {include}" in out and rule in out, out


def test_includes_within_a_room_and_downward_pass(tmp_path):
    allowed = {
        "backend/host/algorithms/allreduce_ring.cpp": ['"backend/host/transport/comm.h"',
                                                       '"backend/host/transport/tags.h"'],
        "backend/host/shm/allreduce_hierarchical.cpp": ['"backend/host/algorithms/algorithms.h"',
                                                        '"backend/host/shm/shm_comm.h"'],
        "backend/host/host_path.cpp": ['"backend/host/transport/ucx_transport.h"', '"backend/host/shm/shm_comm.h"'],
        "backend/host/transport/ucx_transport.h": ["<ucp/api/ucp.h>"],
    }
    for source, includes in allowed.items():
        path = tmp_path / source
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(f"#include {i}\n" for i in includes))
    rc, out = check(tmp_path)
    assert rc == 0, out

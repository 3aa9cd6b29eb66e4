"""The installed package: registration and autoload, what the build contains, and how CUDA tensors
behave on a machine without a GPU. Each check runs in a fresh interpreter (import order matters)."""

import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys

import pytest
import torch

import cnccl

CNCCL_DIR = os.path.dirname(cnccl.__file__)


def python(code, env=None, timeout=120):
    e = dict(os.environ, **(env or {}))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=e, timeout=timeout)
    return r.returncode, r.stdout + r.stderr


def test_import_cnccl_before_torch():
    # `import cnccl` imports torch, whose autoload registers cnccl again on the same thread.
    rc, out = python("import cnccl, torch.distributed as d; print('CNCCL' in d.Backend._plugins)", timeout=60)
    assert rc == 0 and out.strip().endswith("True"), out


# torch 2.14 and later load a c10d backend's entry point when its name is asked for; older torch only
# autoloads device backends inside `import torch` (setup.py, backend_entry_points).
LAZY = any(ep.group == "torch.distributed.backends" for ep in importlib.metadata.distribution("torch").entry_points)
GROUP = "torch.distributed.backends" if LAZY else "torch.backends"


def test_the_install_declares_one_entry_point_for_this_torch():
    groups = {ep.group: ep.value for ep in importlib.metadata.distribution("cnccl").entry_points}
    assert groups == {GROUP: "cnccl._registration:register" if LAZY else "cnccl._autoload:autoload"}, groups


def test_the_name_works_without_import_and_stays_cheap():
    # Lazily: nothing at `import torch`, registered when the name is asked for; autoloaded: at import.
    rc, out = python("import sys, torch.distributed as d; before = 'CNCCL' in d.Backend._plugins; "
                     "print(before, d.is_backend_available('cnccl'), 'cnccl._C' in sys.modules)")
    assert rc == 0 and out.strip().endswith(f"{not LAZY} True False"), out


def test_autoload_can_be_turned_off():
    # TORCH_DEVICE_BACKEND_AUTOLOAD=0 turns off the autoload; the lazy entry point does not run at import.
    rc, out = python("import torch.distributed as d; print('CNCCL' in d.Backend._plugins, "
                     "d.is_backend_available('cnccl'))", env={"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"})
    assert rc == 0 and out.strip().endswith(f"False {LAZY}"), out


MAKE_GROUP = """
import torch, torch.distributed as dist
print("import torch: ok", flush=True)
try:
    dist.init_process_group("cnccl", store=dist.HashStore(), rank=0, world_size=1)
    print("made a group")
except Exception as e:
    print("refused:", type(e).__name__, e, "| cause:", repr(e.__cause__))
"""


def test_a_removed_package_whose_metadata_is_left_breaks_neither_import_torch_nor_hides_the_cause():
    # The package gone, its dist-info left (a half-finished uninstall): importing it fails.
    rc, out = python("import sys; sys.modules['cnccl'] = None\n" + MAKE_GROUP)
    if not LAZY:
        # torch before 2.14 turns the autoload's failure into one of `import torch`: nothing cnccl ships
        # can prevent that (README: TORCH_DEVICE_BACKEND_AUTOLOAD=0).
        assert rc != 0 and "Failed to load the backend extension: cnccl" in out, out
        return
    assert rc == 0 and "import torch: ok" in out, out
    assert "refused:" in out and "cnccl" in out and "ModuleNotFoundError" in out, out


def test_a_package_built_for_another_torch_refuses_to_make_a_group_naming_both(tmp_path):
    # The Python sources of a build for another torch minor, without the extension that build would load.
    package = tmp_path / "cnccl"
    package.mkdir()
    for name in os.listdir(CNCCL_DIR):
        if name.endswith(".py") and name != "_built_for.py":
            shutil.copy(os.path.join(CNCCL_DIR, name), package / name)
    major, minor = torch.__version__.split(".")[:2]
    other = f"{major}.{int(minor) - 1}.0"
    (package / "_built_for.py").write_text(f'TORCH_VERSION = "{other}"\n')
    rc, out = python(MAKE_GROUP, env={"PYTHONPATH": str(tmp_path)})
    assert rc == 0 and "import torch: ok" in out, out
    assert f"refused: RuntimeError cnccl: built for torch {major}.{int(minor) - 1}, running with torch " \
           f"{major}.{minor}" in out, out


def test_a_second_registration_of_the_name_is_refused():
    rc, out = python("import torch.distributed as d\n"
                     "d.Backend.register_backend('cnccl', lambda *a: None)\n"
                     "try:\n    import cnccl\nexcept RuntimeError as e:\n    print('refused:', e)",
                     env={"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"})
    assert rc == 0 and "refused: cnccl: the backend name 'cnccl' is already registered by __main__" in out, out
    # Registering again from cnccl itself is harmless.
    rc, out = python("import cnccl; cnccl.register(); cnccl.register(); print('ok')")
    assert rc == 0 and out.strip().endswith("ok"), out


def nccl_code(version):
    major, minor, patch = version
    return major * 10000 + minor * 100 + patch


@pytest.mark.skipif(torch.version.cuda is None, reason="torch is a CPU-only build: cnccl has no CUDA path")
def test_build_contains_the_cuda_path():
    info = cnccl.build_info()
    assert info["cuda_kernels"] and info["cuda_collectives"], info
    # The NCCL the CUDA path calls is the one torch loaded (linked by soname, not the toolkit's copy).
    assert info["nccl_version"] == nccl_code(torch.cuda.nccl.version()), (info, torch.cuda.nccl.version())
    lib = os.path.join(CNCCL_DIR, "libcnccl.so")
    needed = subprocess.run(["readelf", "-d", lib], capture_output=True, text=True, check=True).stdout
    for soname in ("libnccl.so.2", "libtorch_cuda.so", "libcudart.so"):
        assert soname in needed, f"{lib} does not link {soname}"
    symbols = subprocess.run(["nm", "-DC", "--defined-only", lib], capture_output=True, text=True, check=True).stdout
    for fn in ("make_nccl_engine(", "make_cuda_device(", "Composition::allreduce(", "ComposedWork::wait(",
               "compress::cuda::cast(", "compress::cuda::restore("):
        assert re.search(re.escape("cnccl::") + r"\S*" + re.escape(fn), symbols), f"{fn} is not in {lib}"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the behaviour on a machine without a GPU")
def test_cuda_tensors_without_a_gpu_get_torchs_error():
    code = """
import os, torch, torch.distributed as dist
dist.init_process_group("cnccl", store=dist.HashStore(), rank=0, world_size=1)
backend = dist.group.WORLD._get_backend(torch.device("cuda"))
print(type(backend).__name__)
for attempt in range(2):
    try:
        backend.eager_connect_single_device(torch.device("cuda:0"))
    except ValueError as e:
        print("eager:", e)
try:
    dist.all_reduce(torch.ones(4, device="cuda"))
except RuntimeError as e:
    print("tensor:", str(e).split(".")[0])
t = torch.ones(4)
dist.all_reduce(t)
print("cpu still works:", t.tolist())
dist.destroy_process_group()
"""
    here = os.path.dirname(os.path.abspath(__file__))
    rc, out = python(code, env={"PYTHONPATH": here, "MALLOC_CHECK_": "3"})
    assert rc == 0, f"exit code {rc}:\n{out}"
    assert "ProcessGroupCNCCL" in out, out
    assert out.count("eager: ProcessGroupNCCL is only supported with GPUs, no GPUs found!") == 2, out
    assert "tensor: Found no NVIDIA driver on your system" in out, out
    assert "cpu still works: [1.0, 1.0, 1.0, 1.0]" in out, out


def test_build_info_reports_the_codec_this_processor_runs():
    """The widest kernels the processor has: AVX-512 (F, BW, VL) with AVX2 and F16C, AVX2 and F16C,
    or the scalar ones (each is tested bit for bit by test_codec, forced one by one)."""
    with open("/proc/cpuinfo") as f:
        flags = set(next(line for line in f if line.startswith("flags")).split(":")[1].split())
    avx2 = {"avx2", "f16c"}
    avx512 = avx2 | {"avx512f", "avx512bw", "avx512vl"}
    expected = "avx512" if avx512 <= flags else "avx2+f16c" if avx2 <= flags else "scalar"
    assert cnccl.build_info()["cpu_codec"] == expected, (cnccl.build_info(), sorted(flags & avx512))


REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run(argv, timeout, **kwargs):
    r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, **kwargs)
    assert r.returncode == 0, f"{' '.join(argv)}: exit {r.returncode}\n{r.stdout[-4000:]}\n{r.stderr[-4000:]}"
    return r.stdout


def test_self_check_reports_a_correct_compressed_allreduce():
    out = run([sys.executable, "-m", "cnccl"], timeout=180, cwd="/")
    assert f"built for torch {torch.__version__.split('+')[0]}" in out, out
    # Without UCX (no host path) CPU tensors go through gloo.
    path = "CPU engine ucx, transport shm" if cnccl.build_info()["ucx_version"] else "CPU engine gloo, transport gloo"
    assert re.search(rf"on 2 processes: {path}, wire fp16, compressed \(50% of the bytes saved\)", out), out
    assert out.rstrip().endswith("OK: the result is the exact sum"), out


@pytest.mark.skipif(bool(cnccl.build_info()["ucx_version"]), reason="checks a build without UCX (CNCCL_WITH_UCX=OFF)")
def test_a_build_without_ucx_runs_cpu_tensors_on_gloo_and_refuses_ucx_by_name(monkeypatch):
    assert cnccl.Options()._resolved_cpu_engine() == "gloo"
    # Options are resolved (the environment read) at each call.
    with pytest.raises(ValueError, match=r"Options\.cpu_engine=ucx.*CNCCL_WITH_UCX=OFF"):
        cnccl.Options(cpu_engine="ucx")._resolved_cpu_engine()
    monkeypatch.setenv("CNCCL_CPU_ENGINE", "ucx")
    with pytest.raises(ValueError, match=r"CNCCL_CPU_ENGINE=ucx.*CNCCL_WITH_UCX=OFF"):
        cnccl.Options()._resolved_cpu_engine()
    monkeypatch.delenv("CNCCL_CPU_ENGINE")
    out = run([sys.executable, "-m", "cnccl"], timeout=180, cwd="/")
    assert "built without UCX (CNCCL_WITH_UCX=OFF)" in out and "CPU engine gloo" in out, out


def test_self_check_fails_with_the_ranks_error():
    r = subprocess.run([sys.executable, "-m", "cnccl"], capture_output=True, text=True, timeout=180, cwd="/",
                       env=dict(os.environ, CNCCL_WIRE_DTYPE="fp12"))
    assert r.returncode == 1, r.stdout + r.stderr
    assert "CNCCL_WIRE_DTYPE" in r.stdout and "FAIL: the 2-process allreduce did not complete" in r.stdout, r.stdout


def test_wheel_installs_into_a_fresh_environment_and_serves_python_and_cpp(tmp_path):
    """`pip wheel .` as a user would make it, installed into a new virtual environment that shares
    only torch (its system site-packages): the self-check there runs the wheel's copy, and the C++
    example builds against the wheel's CMake package (cnccl.cmake_prefix_path) and runs on 2 ranks."""
    dist_dir = tmp_path / "dist"
    run([sys.executable, "-m", "pip", "wheel", "-q", "--no-build-isolation", "--no-deps", "--disable-pip-version-check",
         "-w", str(dist_dir), REPO], timeout=900)
    wheels = list(dist_dir.glob("cnccl-*.whl"))
    assert len(wheels) == 1, wheels
    assert re.search(r"-cp3\d+-cp3\d+-linux_x86_64\.whl$", wheels[0].name), f"not a binary wheel: {wheels[0].name}"
    venv, _ = fresh_venv(tmp_path)
    py = str(venv / "bin" / "python")
    run([py, "-m", "pip", "install", "-q", "--no-deps", "--disable-pip-version-check", str(wheels[0])], timeout=300)
    where = run([py, "-c", "import cnccl; print(cnccl.__file__); print(cnccl.cmake_prefix_path)"], timeout=120,
                cwd="/").split()
    assert where[0].startswith(str(venv)), f"the environment imports {where[0]}, not the wheel's copy"
    prefix = where[1]
    for part in ("lib/libcnccl.so", "lib/cmake/cnccl/cnccl-config.cmake", "include/cnccl/cnccl.h"):
        assert os.path.exists(os.path.join(prefix, part)), f"the wheel has no {part}"
    assert run([py, "-m", "cnccl"], timeout=180, cwd="/").rstrip().endswith("OK: the result is the exact sum")
    build = tmp_path / "example"
    run(["cmake", "-S", os.path.join(REPO, "examples", "cpp_allreduce"), "-B", str(build),
         f"-DCMAKE_PREFIX_PATH={prefix}"], timeout=300)
    run(["cmake", "--build", str(build)], timeout=600)
    out = run([os.path.join(REPO, "tests", "cpp", "run_ranks.sh"), str(build / "cpp_allreduce"), "2",
               str(tmp_path / "store")], timeout=300)
    assert out.count(": allreduce ok") == 2, out


def readme_install_commands():
    """The pip and python lines of the README's install block, comments dropped, as a user pastes them."""
    with open(os.path.join(REPO, "README.md")) as f:
        section = f.read().split("\n## Install\n", 1)[1]
    block = section.split("```bash\n", 1)[1].split("```", 1)[0]
    return [line.split("#", 1)[0].strip() for line in block.splitlines() if line.startswith(("pip ", "python "))]


def fresh_venv(tmp_path):
    """A new virtual environment that sees the system's torch, and the environment to run its commands in."""
    venv = tmp_path / "venv"
    run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], timeout=120)
    env = dict(os.environ, VIRTUAL_ENV=str(venv), PATH=f"{venv / 'bin'}:{os.environ['PATH']}",
               PIP_DISABLE_PIP_VERSION_CHECK="1")
    env.pop("PYTHONPATH", None)
    return venv, env


def test_the_readme_install_block_works_as_pasted_in_a_fresh_venv(tmp_path):
    """A new venv of this Python brings its own old setuptools without `wheel`, where `pip install
    --no-build-isolation .` alone failed with "invalid command 'bdist_wheel'": the README's block installs
    what it needs. The build folder is the repository's, reused as setup.py reuses it."""
    commands = readme_install_commands()
    assert any(c.startswith("pip install --no-build-isolation .") for c in commands), commands
    assert commands[-1] == "python -m cnccl", commands
    venv, env = fresh_venv(tmp_path)
    out = ""
    for command in commands:
        out = run(["bash", "-c", command], timeout=900, cwd=REPO, env=env)
    assert out.rstrip().endswith("OK: the result is the exact sum"), out
    where = run(["python", "-c", "import cnccl; print(cnccl.__file__)"], timeout=120, cwd="/", env=env)
    assert where.startswith(str(venv)), f"the venv imports {where}, not its own install"


def test_an_old_setuptools_without_wheel_is_told_the_one_command_that_fixes_it(tmp_path):
    """The same venv without the README's first pip line: setup.py names the fix instead of setuptools'
    "invalid command 'bdist_wheel'"."""
    venv, env = fresh_venv(tmp_path)
    has = subprocess.run(["python", "-c", "import setuptools.command.bdist_wheel"], env=env, capture_output=True)
    if has.returncode == 0:
        pytest.skip("this Python's venv brings a setuptools that builds wheels itself")
    r = subprocess.run(["pip", "install", "--no-build-isolation", "."], cwd=REPO, env=env, capture_output=True,
                       text=True, timeout=600)
    assert r.returncode != 0
    assert "cnccl: building needs setuptools 70.1 or later" in r.stdout + r.stderr, r.stdout[-3000:] + r.stderr[-3000:]
    assert re.search(rf"Run: {re.escape(str(venv))}/bin/python3?(\.\d+)? -m pip install -U 'setuptools>=70\.1'",
                     r.stdout + r.stderr), r.stderr[-3000:]


@pytest.mark.skipif(not cnccl.build_info()["cuda_kernels"], reason="torch is a CPU-only build: cnccl has no CUDA path")
def test_the_cuda_kernels_compile_with_ieee_arithmetic_whatever_the_users_flags():
    """compress/CMakeLists.txt pins nvcc's -ftz=false -prec-div=true -prec-sqrt=true -fmad=false on the
    kernels (the CPU/GPU bit identity needs them) after CMAKE_CUDA_FLAGS, so that -use_fast_math there loses."""
    build = os.environ.get("CNCCL_BUILD_DIR", os.path.join(REPO, "build"))
    with open(os.path.join(build, "CMakeCache.txt")) as f:
        user = next((line.split("=", 1)[1].split() for line in f if line.startswith("CMAKE_CUDA_FLAGS:")), [])
    with open(os.path.join(build, "compile_commands.json")) as f:
        commands = {e["file"].split(os.sep + "compress" + os.sep, 1)[1]: e["command"].split() for e in json.load(f)
                    if e["file"].endswith(".cu") and os.sep + "compress" + os.sep in e["file"]}
    assert {"cuda/codec.cu", "cuda/frames.cu"} <= set(commands), sorted(commands)
    for name, argv in commands.items():
        last_user = max((i for i, a in enumerate(argv) if a in user), default=-1)
        for flag in ("-ftz=false", "-prec-div=true", "-prec-sqrt=true", "-fmad=false"):
            assert flag in argv[last_user + 1:], f"{name}: {flag} missing or before CMAKE_CUDA_FLAGS {user}: {argv}"


@pytest.mark.skipif(not cnccl.build_info()["cuda_kernels"], reason="torch is a CPU-only build: cnccl has no CUDA path")
@pytest.mark.parametrize("source", ["cuda/codec.cu", "cuda/frames.cu"])
def test_the_cuda_kernels_compile_for_a_t4(tmp_path, source):
    """sm_80's warp reductions have a shuffle fallback (compress/cuda/launch.h, warp_sum and warp_max): the
    kernels compile for compute capability 7.5 (a T4), the oldest nvcc 13 builds for. PTX only, to be quick."""
    nvcc = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    r = subprocess.run([nvcc, "-ptx", "-arch=compute_75", "-std=c++17", f"-I{REPO}", "--expt-relaxed-constexpr",
                        os.path.join(REPO, "compress", source), "-o", str(tmp_path / "out.ptx")],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr

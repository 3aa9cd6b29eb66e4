"""Builds the C++ parts with CMake before packaging them (pyproject.toml holds the metadata).

`pip install --no-build-isolation .` builds and installs the package: cnccl._C beside the Python
sources, and the C++ package under it (lib/libcnccl.so, include/, lib/cmake/cnccl:
`cnccl.cmake_prefix_path`). `pip wheel --no-build-isolation .` makes the same as a wheel, for machines
with the same torch. `pip install -e .` leaves CMake's outputs in python/cnccl instead, so that the
build folder (CNCCL_BUILD_DIR, default <repo>/build) and the package stay one. An existing build
folder is reused as configured; a new one is configured without the tests and benchmarks.
"""

import os
import shlex
import subprocess
import sys
from pathlib import Path

import setuptools
from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

REPO = Path(__file__).resolve().parent


def require_bdist_wheel():
    """pip builds every install through the bdist_wheel command: setuptools' own from 70.1, the `wheel`
    package's before. A new virtual environment of Python 3.11 has setuptools 65.5 and no `wheel`, where
    setuptools' own message is only "invalid command 'bdist_wheel'"."""
    for module in ("setuptools.command.bdist_wheel", "wheel.bdist_wheel"):
        try:
            __import__(module)
            return
        except ImportError:
            pass
    sys.exit(f"cnccl: building needs setuptools 70.1 or later (this environment has {setuptools.__version__}) "
             f"or the 'wheel' package. Run: {sys.executable} -m pip install -U 'setuptools>=70.1'")


require_bdist_wheel()


class BuildWithCMake(build_py):
    def run(self):
        build_dir = Path(os.environ.get("CNCCL_BUILD_DIR", REPO / "build"))
        if not (build_dir / "CMakeCache.txt").exists():
            subprocess.check_call(["cmake", "-S", str(REPO), "-B", str(build_dir), f"-DPython3_EXECUTABLE={sys.executable}",
                                   "-DCNCCL_BUILD_TESTS=OFF", "-DCNCCL_BUILD_BENCH=OFF",
                                   # Extra CMake options, as scikit-build reads them: -DCNCCL_WITH_UCX=OFF, say.
                                   *shlex.split(os.environ.get("CMAKE_ARGS", ""))])
        jobs = str(os.cpu_count() or 2)
        subprocess.check_call(["cmake", "--build", str(build_dir), "-j", jobs, "--target", "cnccl_python"])
        super().run()
        if not self.editable_mode:
            subprocess.check_call(["cmake", "--install", str(build_dir), "--prefix", str(Path(self.build_lib) / "cnccl")])


def backend_entry_points():
    """How torch finds the backend without `import cnccl`. torch 2.14 and later read the group
    torch.distributed.backends when a backend's name is asked for (distributed_c10d.py,
    Backend._ensure_backend_registered), and a failure there fails that call alone. Older torch has only
    the device-backend autoload (torch/__init__.py, _import_device_backends), which runs inside every
    `import torch` and turns any failure into one of `import torch` itself: a half-removed cnccl would
    break torch for every program, so the autoload is declared only where there is nothing else. The
    group is found in torch's own entry points (its builtin backends are declared there), read from its
    metadata: importing torch here would run the autoload of an installed cnccl."""
    from importlib.metadata import distribution

    if any(ep.group == "torch.distributed.backends" for ep in distribution("torch").entry_points):
        return {"torch.distributed.backends": ["cnccl = cnccl._registration:register"]}
    return {"torch.backends": ["cnccl = cnccl._autoload:autoload"]}


class BinaryDistribution(Distribution):
    """A wheel for this platform and Python (cnccl._C), not a pure-Python one."""

    def has_ext_modules(self):
        return True


# setuptools' own build folder, inside CMake's rather than beside it.
setup(cmdclass={"build_py": BuildWithCMake}, distclass=BinaryDistribution, entry_points=backend_entry_points(),
      options={"build": {"build_base": str(REPO / "build" / "setuptools")}})

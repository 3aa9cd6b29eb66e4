"""Builds the C++ parts with CMake (into python/cnccl/) before packaging them.

`pip install ./python` and `pip install -e ./python` both work; an existing build directory
(CNCCL_BUILD_DIR, default <repo>/build) is reused, so a configured tree rebuilds incrementally.
"""

import os
import subprocess
import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

REPO = Path(__file__).resolve().parent.parent


class BuildWithCMake(build_py):
    def run(self):
        build_dir = Path(os.environ.get("CNCCL_BUILD_DIR", REPO / "build"))
        if not (build_dir / "CMakeCache.txt").exists():
            subprocess.check_call(
                ["cmake", "-S", str(REPO), "-B", str(build_dir), f"-DPython3_EXECUTABLE={sys.executable}"]
            )
        jobs = str(os.cpu_count() or 2)
        subprocess.check_call(["cmake", "--build", str(build_dir), "-j", jobs, "--target", "cnccl_python"])
        super().run()


setup(cmdclass={"build_py": BuildWithCMake})

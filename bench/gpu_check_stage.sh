#!/usr/bin/env bash
# Run where a package registry is, before bench/gpu_check.sh goes to a GPU machine that has none:
# stages into .gpu-deps/ (git-ignored; the device call carries it: carry [".gpu-deps"])
#   wheels/py3.N/   pytest and what it needs, for each Python 3.9-3.14 (whichever the GPU machine has)
#   wheels/tools/   cmake and ninja (manylinux x86_64), for a machine whose own are missing or too old
#   root/           Debian's GoogleTest, unpacked, for a machine without it (the check builds with the
#                   machine's own UCX or none)
# Nothing is built here.
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf .gpu-deps && mkdir -p .gpu-deps/debs .gpu-deps/root .gpu-deps/wheels/tools
(cd .gpu-deps/debs && apt-get download libgtest-dev >/dev/null)
for deb in .gpu-deps/debs/*.deb; do dpkg -x "$deb" .gpu-deps/root; done
rm -rf .gpu-deps/debs .gpu-deps/root/usr/share
pip_download() { python3 -m pip download -q --disable-pip-version-check --only-binary=:all: "$@"; }
# pip evaluates a requirement's markers for the Python it runs on, not for --python-version: what
# pytest needs below 3.11 is named here.
for v in 3.9 3.10 3.11 3.12 3.13 3.14; do
  extra=(); [[ $v == 3.9 || $v == 3.10 ]] && extra=(exceptiongroup tomli)
  pip_download --python-version "$v" --implementation cp -d ".gpu-deps/wheels/py$v" pytest "${extra[@]}"
done
platforms=()
for p in manylinux_2_28_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64; do platforms+=(--platform "$p"); done
pip_download --no-deps "${platforms[@]}" --python-version 3.9 --implementation cp -d .gpu-deps/wheels/tools \
  "cmake>=3.25,<4" ninja
ls .gpu-deps/wheels/*
du -sh .gpu-deps

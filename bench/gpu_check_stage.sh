#!/usr/bin/env bash
# Run here, before bench/gpu_check.sh goes to a GPU machine that has no package registry: unpacks
# Debian's UCX, libnuma and GoogleTest packages into .gpu-deps/root, and downloads pytest and its
# dependencies as wheels into .gpu-deps/wheels (git-ignored), which the device call carries
# (carry: [".gpu-deps"]). Nothing is built here.
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf .gpu-deps && mkdir -p .gpu-deps/debs .gpu-deps/root
(cd .gpu-deps/debs && apt-get download libucx0 libucx-dev libnuma1 libgtest-dev >/dev/null)
for deb in .gpu-deps/debs/*.deb; do dpkg -x "$deb" .gpu-deps/root; done
rm -rf .gpu-deps/debs .gpu-deps/root/usr/share
python3 -m pip download -q --disable-pip-version-check --only-binary=:all: -d .gpu-deps/wheels pytest
du -sh .gpu-deps

#!/usr/bin/env bash
# Installs what cnccl needs on a bare Debian machine; quick when everything is already present.
set -euo pipefail

TORCH_VERSION="${CNCCL_TORCH_VERSION:-2.15.0}"
PY="${PYTHON:-python3}"

apt_pkgs=(libucx-dev ucx-utils iproute2 cmake g++ libgtest-dev pkg-config ccache)
missing=()
for p in "${apt_pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: apt-get install ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

have_torch=$(TORCH_DEVICE_BACKEND_AUTOLOAD=0 "$PY" -c 'import torch; print(torch.__version__.split("+")[0])' 2>/dev/null || true)
py_pkgs=()
[[ "$have_torch" == "$TORCH_VERSION" ]] || py_pkgs+=("torch==$TORCH_VERSION")
for m in pytest numpy matplotlib expecttest; do
  "$PY" -c "import $m" 2>/dev/null || py_pkgs+=("$m")
done
if ((${#py_pkgs[@]})); then
  echo "setup: pip install ${py_pkgs[*]}"
  "$PY" -m pip install -q --disable-pip-version-check --root-user-action=ignore "${py_pkgs[@]}"
fi

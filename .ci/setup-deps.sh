#!/usr/bin/env bash
# Installs what cnccl needs on a bare Debian machine; quick when everything is already present.
set -euo pipefail

TORCH_VERSION="${CNCCL_TORCH_VERSION:-2.15.0}"
PY="${PYTHON:-python3}"

# The build's own (third_party/system-packages.txt), then the tests' and CI's: ucx_info, ip netns, GoogleTest, ccache.
mapfile -t apt_pkgs < <(grep -v '^#' "$(dirname "$0")/../third_party/system-packages.txt")
apt_pkgs+=(ucx-utils iproute2 libgtest-dev ccache)
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
# Test dependencies: module, then its PyPI name. The frameworks test_frameworks.py trains under, and
# torchao, the MX oracle of test_mx.py.
for m in pytest:pytest numpy:numpy matplotlib:matplotlib expecttest:expecttest pytorch_lightning:pytorch-lightning \
    accelerate:accelerate transformers:transformers==5.25.0 torchao:torchao==0.18.0; do
  "$PY" -c "import ${m%%:*}" 2>/dev/null || py_pkgs+=("${m#*:}")
done
if ((${#py_pkgs[@]})); then
  echo "setup: pip install ${py_pkgs[*]}"
  "$PY" -m pip install -q --disable-pip-version-check --root-user-action=ignore "${py_pkgs[@]}"
fi

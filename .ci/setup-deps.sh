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
# Test dependencies (module, then its PyPI name), looked up, not imported (importing them took 13 s here, and
# CI sets up three times): the frameworks test_frameworks.py trains under, and torchao, the MX oracle of test_mx.py.
missing=$("$PY" - <<'EOF'
import importlib.util
for module, name in [("pytest", "pytest"), ("numpy", "numpy"), ("matplotlib", "matplotlib"),
                     ("expecttest", "expecttest"), ("pytorch_lightning", "pytorch-lightning"),
                     ("accelerate", "accelerate"), ("transformers", "transformers==5.25.0"),
                     ("torchao", "torchao==0.18.0")]:
    if importlib.util.find_spec(module) is None:
        print(name)
EOF
)
[[ -z $missing ]] || mapfile -t -O ${#py_pkgs[@]} py_pkgs <<<"$missing"
if ((${#py_pkgs[@]})); then
  # Through uv (from PyPI) where it installs: it unpacks torch and its CUDA libraries (5 GB) in parallel,
  # 16 s where pip took 57 s here. pip where uv cannot be had or refuses (uv reads none of pip's settings: an
  # index or a Debian Python that pip is allowed to install into). With the bytecode compiled at install, as
  # pip does: uv leaves it to the first import, and where PYTHONDONTWRITEBYTECODE is set (as on this
  # machine) every process compiled torch's modules again: `import torch, torchao, numpy` took 9-11 s
  # against 4-5 s, and a cold CI's Python tests 1615 s against 1120.
  installed=0
  if "$PY" -m uv --version >/dev/null 2>&1 ||
      "$PY" -m pip install -q --disable-pip-version-check --root-user-action=ignore uv >/dev/null 2>&1; then
    echo "setup: uv pip install ${py_pkgs[*]}"
    "$PY" -m uv pip install -q --compile-bytecode --system --python "$(command -v "$PY")" "${py_pkgs[@]}" && installed=1 \
      || echo "setup: uv failed; pip instead"
  fi
  if ((!installed)); then
    echo "setup: pip install ${py_pkgs[*]}"
    "$PY" -m pip install -q --disable-pip-version-check --root-user-action=ignore "${py_pkgs[@]}"
  fi
fi

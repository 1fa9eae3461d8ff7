#!/usr/bin/env bash
# Creates (or reuses) the Python environment the Python tests run in: a venv with numpy, pytest
# and PyTorch (PyPI's wheel, plus expecttest for PyTorch's own tests), then installs the oxccl
# package from python/ into it as the README says (`pip install ./python`: libccl.so built with
# cargo, the native torch backend compiled for the venv's torch). Prints the venv's path on
# stdout as its last line.
#
#   CCL_VENV   where the venv lives (default: ~/.cache/ccl/venv, kept between runs: torch is
#              several gigabytes)
#   CCL_TORCH  the torch requirement (default below); CCL_TORCH=none skips torch
set -euo pipefail
cd "$(dirname "$0")/.."
log() { echo "[python-setup] $*" >&2; }

venv=${CCL_VENV:-$HOME/.cache/ccl/venv}
torch_req=${CCL_TORCH:-torch==2.15.0}
py=${PYTHON:-python3}

if [ ! -x "$venv/bin/python" ]; then
  log "creating venv $venv"
  mkdir -p "$(dirname "$venv")"
  "$py" -m venv "$venv"
fi
vpy="$venv/bin/python"
export PIP_DISABLE_PIP_VERSION_CHECK=1

need=()
"$vpy" -c "import numpy" 2>/dev/null || need+=("numpy>=1.24")
"$vpy" -c "import pytest" 2>/dev/null || need+=("pytest>=7")
"$vpy" -c "import setuptools, wheel" 2>/dev/null || need+=(setuptools wheel)
if [ "$torch_req" != none ]; then
  # PyTorch's own distributed tests (torch.testing._internal) import expecttest.
  "$vpy" -c "import expecttest" 2>/dev/null || need+=("expecttest>=0.2")
  have=$("$vpy" -c "import torch; print(torch.__version__.split('+')[0])" 2>/dev/null || true)
  case "$torch_req" in
    torch==*) [ "$have" = "${torch_req#torch==}" ] || need+=("$torch_req") ;;
    *) [ -n "$have" ] || need+=("$torch_req") ;;
  esac
fi
if [ ${#need[@]} -gt 0 ]; then
  log "pip install ${need[*]} (torch is a multi-gigabyte download)"
  "$vpy" -m pip install -q --no-cache-dir "${need[@]}" >&2
fi

# The native torch backend is a C++ extension compiled against the installed torch: it needs a
# C++ compiler and the interpreter's headers (Debian packages, added when missing and root).
if [ "$torch_req" != none ]; then
  missing=()
  command -v g++ >/dev/null 2>&1 || missing+=(g++)
  "$vpy" -c 'import os, sysconfig, sys; sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))' ||
    missing+=(python3-dev)
  if [ ${#missing[@]} -gt 0 ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
      log "apt-get install ${missing[*]} (to build the native torch backend)"
      apt-get update -q >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}" >&2
    else
      log "missing ${missing[*]}: the native torch backend cannot be compiled (import oxccl.torch will say so)"
    fi
  fi
fi

log "pip install ./python (builds libccl.so and the native torch backend)"
# The README's own line, in pip's isolated build environment: what a user gets.
"$vpy" -m pip install -q --force-reinstall --no-deps ./python >&2
# pip leaves its build tree in the source directory; a later install must not pick it up.
rm -rf python/build python/oxccl.egg-info
echo "$venv"

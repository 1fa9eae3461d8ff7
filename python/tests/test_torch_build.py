"""The native torch backend is loaded only into the torch it was compiled for."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")


def _installed_copy(tmp_path, stamp_torch):
    """A copy of the installed package whose build claims to be for `stamp_torch`."""
    import oxccl

    src = Path(oxccl.__file__).parent
    stamp = json.loads((src / "_ctorch.json").read_text())
    dst = tmp_path / "site" / "oxccl"
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("__pycache__"))
    stamp["torch"] = stamp_torch
    (dst / "_ctorch.json").write_text(json.dumps(stamp))
    return dst.parent


def _import(site, **env):
    code = "import oxccl.torch as t, torch; print('LOADED', t._ctorch.__file__)"
    full = dict(os.environ, PYTHONPATH=str(site), **env)
    return subprocess.run([sys.executable, "-c", code], env=full, capture_output=True,
                          text=True, timeout=600)


def test_the_installed_build_matches_the_running_torch():
    import oxccl

    stamp = json.loads((Path(oxccl.__file__).parent / "_ctorch.json").read_text())
    assert stamp["torch"] == torch.__version__


def test_a_build_for_another_torch_is_refused_naming_both(tmp_path):
    site = _installed_copy(tmp_path, "2.14.0+other")
    p = _import(site, CCL_TORCH_BUILD="0")
    assert p.returncode != 0
    assert "built for torch 2.14.0+other" in p.stderr and torch.__version__ in p.stderr, p.stderr
    assert "CCL_TORCH_BUILD=0" in p.stderr, p.stderr


def test_a_build_for_another_torch_is_replaced_by_one_for_this_torch(tmp_path):
    site = _installed_copy(tmp_path, "2.14.0+other")
    cache = tmp_path / "cache"
    p = _import(site, CCL_TORCH_EXT_DIR=str(cache))
    assert p.returncode == 0, p.stderr[-3000:]
    assert f"LOADED {cache}" in p.stdout, p.stdout
    assert "built for torch 2.14.0+other" in p.stderr, p.stderr  # the one WARNING line
    assert json.loads((cache / "_ctorch.json").read_text())["torch"] == torch.__version__
    # The second import loads the cached build without compiling.
    p = _import(site, CCL_TORCH_EXT_DIR=str(cache), CCL_TORCH_BUILD="0")
    assert p.returncode == 0 and f"LOADED {cache}" in p.stdout, p.stderr[-3000:]

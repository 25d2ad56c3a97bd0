"""``aicf bundle LIB DIR``: a folder that runs a compiled library on a host with Python and
nothing installed (docs/deploy.md).

The folder holds the library, ``site/`` with what a runtime-only process imports (TVM's
Python package with ``libtvm_runtime*`` but without the compiler library, ``tvm_ffi``,
numpy, ``typing_extensions``, ``aicf_tvm``) copied from this installation, and ``run.sh``,
which runs ``aicf run`` on it with ``python -S`` (no site-packages) and
``TVM_USE_RUNTIME_LIB=1``. The target host needs the same Python version and CPU
architecture as this one (numpy and the libraries are binary), and for a CUDA model the
CUDA driver.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import stat
import sys
from pathlib import Path

import tvm

from aicf_tvm.core.errors import DeployError
from aicf_tvm.runtime.deploy import read_metadata

# What ``aicf_tvm.load`` and ``aicf run`` import on a runtime-only host, besides TVM itself.
RUNTIME_MODULES = ("tvm_ffi", "numpy", "typing_extensions", "aicf_tvm")

RUN_SH = """#!/bin/sh
# Runs {library} with TVM's runtime alone: `./run.sh --input NAME=FILE.npy ... [--output DIR]`.
# Needs Python {python} (set PYTHON to pick the interpreter), nothing installed.
here=$(cd "$(dirname "$0")" && pwd)
TVM_USE_RUNTIME_LIB=1 PYTHONPATH="$here/site" exec "${{PYTHON:-python3}}" -S -m aicf_tvm.driver.cli run \\
    "$here/{library}" "$@"
"""

_SKIP = shutil.ignore_patterns("__pycache__", "*.pyc", "libtvm_compiler*")


def _source(module: str) -> Path:
    """The installed top-level package folder (or single file) of ``module``."""
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        raise DeployError(f"aicf bundle: {module} is not installed here")
    origin = Path(spec.origin)
    return origin.parent if origin.name == "__init__.py" else origin


def _copy(source: Path, site: Path) -> None:
    if source.is_dir():
        shutil.copytree(source, site / source.name, ignore=_SKIP)
    else:
        shutil.copy2(source, site / source.name)


def write_runtime_site(site: Path) -> None:
    """Fill the folder ``site`` with what a runtime-only process imports (module docstring)."""
    site.mkdir(parents=True, exist_ok=True)
    _copy(Path(tvm.__file__).parent, site)
    if list((site / "tvm").rglob("libtvm_compiler*")) or not list((site / "tvm" / "lib").glob("libtvm_runtime*")):
        raise DeployError("aicf bundle: this TVM installation has no separate libtvm_runtime to bundle")
    for module in RUNTIME_MODULES:
        _copy(_source(module), site)
    numpy_libs = _source("numpy").parent / "numpy.libs"  # the wheel's vendored BLAS, where it has one
    if numpy_libs.is_dir():
        shutil.copytree(numpy_libs, site / "numpy.libs")


def bundle(library: str | os.PathLike, out_dir: str | os.PathLike) -> Path:
    """Write the folder ``out_dir`` (which must not exist, or be empty) that runs
    ``library`` with TVM's runtime alone; returns its ``run.sh``."""
    lib = Path(library)
    read_metadata(lib)  # refuses anything but an intact AICF library
    out = Path(out_dir)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise DeployError(f"aicf bundle: {out} exists and is not an empty folder; nothing was written")
    write_runtime_site(out / "site")
    shutil.copy2(lib, out / lib.name)
    run = out / "run.sh"
    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    run.write_text(RUN_SH.format(library=lib.name, python=python))
    run.chmod(run.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return run

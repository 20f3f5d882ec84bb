"""The interpreter the fake nodes run: a cached virtualenv the node user can read.

The controller's Python (pyenv under a mode-700 ``/root``) is invisible to the node user,
so nodes get their own venv built from Debian's ``/usr/bin/python3`` with the controller's
exact mlx version (every node runs the same mlx: docs/inventory.md, ``mlxops_mlx_version``)
and, when the controller has it, its exact mlx-lm: the nodes are then as ``mlxops
provision`` leaves Macs whose inventory sets ``mlxops_mlx_lm: true``, ready for
fine-tuning jobs (the ``mlx_lm`` task's own install is tested with a wheelhouse).
It is built once, under a lock, into a world-readable cache and reused by every sandbox;
``down`` leaves it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from mlxops import filelock
from mlxops.errors import MlxopsError
from mlxops.readiness import controller_mlx_lm_version, controller_mlx_version

SYSTEM_PYTHON = "/usr/bin/python3"
CACHE_DIR = Path(os.environ.get("MLXOPS_SANDBOX_CACHE", "/var/cache/mlxops-sandbox"))
# Written last: a venv without it is a half-finished build and is rebuilt.
_MARKER = ".mlxops-complete"


def _controller_mlx_version() -> str:
    version = controller_mlx_version()
    if version is None:
        raise MlxopsError(
            "mlx is not installed on the controller; the sandbox nodes need its version")
    return version


def _system_python_version(python: str) -> str:
    if not os.access(python, os.X_OK):
        raise MlxopsError(f"{python} not found: install python3 and python3-venv")
    out = subprocess.run(
        [python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
        capture_output=True, text=True, check=True,
    )
    return out.stdout.strip()


def venv_path(mlx_version: str, python: str = SYSTEM_PYTHON, cache: Path = CACHE_DIR,
              mlx_lm_version: str | None = None) -> Path:
    lm = f"-mlxlm{mlx_lm_version}" if mlx_lm_version else ""
    return cache / f"venv-py{_system_python_version(python)}-mlx{mlx_version}{lm}"


def node_python(
    mlx_version: str | None = None,
    python: str = SYSTEM_PYTHON,
    cache: Path = CACHE_DIR,
    log=None,
) -> str:
    """Path of the node interpreter, building the cached venv first if needed."""
    version = mlx_version or _controller_mlx_version()
    mlx_lm = controller_mlx_lm_version()
    venv = venv_path(version, python, cache, mlx_lm)
    interpreter = venv / "bin" / "python"
    if (venv / _MARKER).exists() and interpreter.exists():
        return str(interpreter)
    cache.mkdir(parents=True, exist_ok=True)
    cache.chmod(0o755)
    # One builder at a time: a test session and a CLI run may race for the same venv.
    with filelock.exclusive(cache / ".lock"):
        if (venv / _MARKER).exists() and interpreter.exists():
            return str(interpreter)
        if log:
            extra = f" mlx-lm=={mlx_lm}" if mlx_lm else ""
            log(f"building node interpreter {venv} (once; pip install mlx[cpu]=={version}"
                f"{extra})")
        _build(venv, python, version, mlx_lm)
    return str(interpreter)


def _build(venv: Path, python: str, version: str, mlx_lm: str | None = None) -> None:
    shutil.rmtree(venv, ignore_errors=True)
    old_umask = os.umask(0o022)  # world-readable: the node user runs it
    try:
        _run([python, "-m", "venv", str(venv)])
        pip = [str(venv / "bin" / "python"), "-m", "pip", "--disable-pip-version-check", "-q"]
        _run([*pip, "install", f"mlx[cpu]=={version}", "numpy",
              *([f"mlx-lm=={mlx_lm}"] if mlx_lm else [])])
        _run([str(venv / "bin" / "python"), "-c",
              "import mlx.core, numpy" + (", mlx_lm" if mlx_lm else "")])
        (venv / _MARKER).write_text(version + "\n")
    finally:
        os.umask(old_umask)


def _run(argv: list[str]) -> None:
    proc = subprocess.run(argv, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
        raise MlxopsError(
            f"building the node interpreter failed: {' '.join(argv)}: " + " | ".join(tail)
        )


def add_package(python: str, requirement: str, module: str, cache: Path = CACHE_DIR) -> None:
    """``requirement`` (e.g. ``mlx-lm==0.32.2``, for the serving tests and benchmark) into
    the node interpreter ``python`` unless ``module`` imports there already: under the
    build lock, world-readable, once for every sandbox of the machine. (Provisioning
    installs mlx-lm on real nodes; the sandbox's shared interpreter is the tests' own.)"""
    if subprocess.run([python, "-c", f"import {module}"], capture_output=True).returncode == 0:
        return
    with filelock.exclusive(cache / ".lock"):
        old_umask = os.umask(0o022)  # the node user reads it
        try:
            _run([python, "-m", "pip", "--disable-pip-version-check", "-q", "install",
                  requirement])
        finally:
            os.umask(old_umask)

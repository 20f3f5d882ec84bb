"""What a node says before a job starts there: the ``preflight`` command
(docs/node-protocol.md)."""

from __future__ import annotations

import ctypes.util
import os
import platform
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

from mlxops.node import host, protocol
from mlxops.node.blas import find_openblas, usable_cpus
from mlxops.node.ports import busy_ports
from mlxops.node.rundir import checkpoint_steps
from mlxops.node.status import leftovers

# Where Open MPI lives when a non-interactive SSH session's PATH lacks it (Homebrew on
# Apple Silicon and on Intel, MacPorts).
MPI_DIRS = ("/opt/homebrew/bin", "/usr/local/bin", "/opt/local/bin")


def preflight(run_dir: Path, *, ip: str, ports: list[int], mpi: bool
              ) -> protocol.PreflightAnswer:
    try:
        import mlx.core as mx

        mlx_version = mx.__version__
    except ImportError:
        mlx_version = None
    mpirun, libname = open_mpi() if mpi else (None, None)
    return protocol.PreflightAnswer(
        python=sys.executable,
        python_version=platform.python_version(),
        mlx=mlx_version,
        system=host.system(),
        ports_busy=busy_ports(ip, ports) if ip else [],
        leftovers=leftovers(run_dir),
        checkpoints=checkpoint_steps(run_dir),
        mpirun=mpirun,
        mpi_libname=libname,
        # Only an ELF interpreter can preload one: on macOS (Accelerate and Metal) there
        # is nothing to find, by what the node has rather than by its name.
        openblas=find_openblas(),
        cpus=usable_cpus(),
        mlx_lm=mlx_lm_version(),
    )


def mlx_lm_version() -> str | None:
    """The mlx-lm this interpreter has installed, by its metadata: importing mlx_lm would
    load transformers, seconds of every pre-flight."""
    try:
        return metadata.version("mlx-lm")
    except metadata.PackageNotFoundError:
        return None


def open_mpi() -> tuple[str | None, str | None]:
    """mpirun's absolute path, and the libmpi MLX should dlopen (as mlx.launch finds it:
    the libmpi that ``ompi_info`` links, by ldd or otool), else ``find_library``."""
    search = os.pathsep.join([os.environ.get("PATH", ""), *MPI_DIRS])
    mpirun = shutil.which("mpirun", path=search)
    libname = None
    if mpirun:
        ompi_info = Path(mpirun).with_name("ompi_info")
        tool = ["otool", "-L"] if host.has_tool("otool") else ["ldd"]
        try:
            out = subprocess.run([*tool, str(ompi_info)], capture_output=True, text=True,
                                 timeout=20, check=False).stdout
            line = next(x for x in out.splitlines() if "libmpi" in x)
            libname = line.strip().split()[0].removeprefix("@rpath/")
        except (OSError, StopIteration, subprocess.SubprocessError):
            libname = ctypes.util.find_library("mpi")
    return mpirun, libname

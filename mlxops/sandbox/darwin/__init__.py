"""The macOS node flavour: sandbox nodes that answer as a Mac where mlxops asks.

A node of this flavour differs from a plain one in three ways, all set up by ``up``:

- its SSH sessions find the Mac's tools first on their PATH (``DIR/darwin/bin``: the
  programs of :mod:`~mlxops.sandbox.darwin.shim`, and ``tar`` as Debian's bsdtar), which
  answer from output recorded on a real Mac (``recorded/README.md`` names each source);
- it has no ``/proc``: its mount namespace mounts an empty read-only tmpfs over it, after
  binding the real one to ``DIR/darwin/node/proc`` for the ``ps`` shim alone;
- ``DIR/darwin/node`` is, inside the node, its own directory ``DIR/nodes/<name>/darwin``:
  the state a Mac keeps in its kernel (``iogpu.wired_limit_mb``, the system ``sleep``).

What stays Linux: the kernel (Python's ``platform.system()`` says Linux; node code chooses
by what the node has, see :mod:`mlxops.node.host`), the binaries (ELF), ``/sys``.
"""

from __future__ import annotations

import os
import pwd
import shutil
from pathlib import Path

from mlxops.sandbox.darwin.shim import TOOLS

FLAVOURS = ("linux", "macos")
#: A Mac-like node's network interface, as a Mac names its wired one (and as its
#: ifconfig shows it: Open MPI's interface list, read from the kernel, must agree).
IFACE = "en0"
HERE = Path(__file__).resolve().parent
BSDTAR = "/usr/bin/bsdtar"
#: The recorded state a fresh Mac-like node starts with: macOS's own wired limit (0: the
#: system default) and the recorded `pmset -g` sleep value (recorded/README.md).
INITIAL_STATE = {"iogpu.wired_limit_mb": "0", "sleep": "1"}


def shim_dir(state_dir: Path) -> Path:
    return state_dir / "darwin"


def bin_dir(state_dir: Path) -> Path:
    """What comes first on a Mac-like node's PATH."""
    return shim_dir(state_dir) / "bin"


def mount_point(state_dir: Path) -> Path:
    """Where, inside each node, its own directory is mounted (the shims look there)."""
    return shim_dir(state_dir) / "node"


def node_dir(state_dir: Path, name: str) -> Path:
    """A node's own directory on this machine."""
    return state_dir / "nodes" / name / "darwin"


def prerequisite() -> str | None:
    """None when Mac-like nodes can be made here, else why not."""
    return None if os.access(BSDTAR, os.X_OK) else \
        f"{BSDTAR} missing (apt-get install libarchive-tools)"


def install(state_dir: Path, python: str) -> Path:
    """Put the shims (run by ``python``, the node interpreter) and the recorded outputs
    under ``DIR/darwin``; returns the bin directory."""
    why = prerequisite()
    if why:
        raise FileNotFoundError(why)
    top = shim_dir(state_dir)
    shutil.rmtree(top, ignore_errors=True)
    shutil.copytree(HERE / "recorded", top / "recorded")
    program = top / "shim.py"
    body = (HERE / "shim.py").read_text()
    program.write_text(f"#!{python}\n{body}")
    program.chmod(0o755)
    shutil.copy(HERE / "macrdma.py", top / "macrdma.py")
    (top / "macrdma.py").chmod(0o644)
    bins = bin_dir(state_dir)
    bins.mkdir()
    for tool in TOOLS:
        (bins / tool).symlink_to("../shim.py")
    (bins / "tar").symlink_to(BSDTAR)
    mount_point(state_dir).mkdir()
    for path in (top, top / "recorded", bins, mount_point(state_dir)):
        path.chmod(0o755)
    return bins


def prepare_node(state_dir: Path, name: str, user: pwd.struct_passwd) -> Path:
    """The node's own directory: its kept state (writable by the node user, whose ``sudo``
    is the shim's) and the mount point of its real ``/proc``."""
    own = node_dir(state_dir, name)
    shutil.rmtree(own, ignore_errors=True)
    (own / "proc").mkdir(parents=True)
    for key, value in INITIAL_STATE.items():
        (own / key).write_text(value + "\n")
        os.chown(own / key, user.pw_uid, user.pw_gid)
    os.chown(own, user.pw_uid, user.pw_gid)
    own.chmod(0o755)
    return own


def remove(state_dir: Path) -> None:
    shutil.rmtree(shim_dir(state_dir), ignore_errors=True)

"""The sandbox nodes' compiled-kernel cache: one per node user, shared by its nodes.

On a cluster each node keeps the MLX CPU kernels its ranks compiled in its user's
``<mlxops_root>/cache/mlx`` (:mod:`mlxops.node.tempdir`). A sandbox's nodes are one user
on one machine, each with a home of its own: left alone, every node of every sandbox would
compile every kernel again at its first job (the bundled trainer's take ~25 s of g++ on
this repository's 2-core machine, README "Nodes that other people use too"). So each
node's ``~/.mlxops/cache`` is a link to ``<sandbox cache>/kernels/<user>``, that user's
own directory, mode 0700, kept across sandboxes like the node interpreter: it passes the
nodes' rule for a kernel cache (the user's, no one else can write to it), as a cache on
another disk of a real node would.
"""

from __future__ import annotations

import os
import pwd
import shutil
from pathlib import Path

from mlxops.node import protocol
from mlxops.sandbox.python import CACHE_DIR

KERNELS = CACHE_DIR / "kernels"


def user_cache(user: pwd.struct_passwd, base: Path = KERNELS) -> Path:
    """``<base>/<user>``: made if missing, the user's, mode 0700 (its parent root's)."""
    base.mkdir(parents=True, exist_ok=True)
    base.chmod(0o755)
    own_cache = base / user.pw_name
    own_cache.mkdir(exist_ok=True)
    os.chown(own_cache, user.pw_uid, user.pw_gid)
    own_cache.chmod(0o700)
    for other in sorted(base.iterdir()):  # the kernels another node user compiled
        if other != own_cache and other.is_dir():
            seed(other / "mlx", own_cache / "mlx", user)
    return own_cache


def link_root_cache(root: Path, user: pwd.struct_passwd, base: Path = KERNELS) -> Path:
    """Make ``<root>/cache`` (an ``mlxops_root``'s, made the user's if missing) a link to the
    user's shared cache; returns the link. A real directory there is left as it is."""
    root.mkdir(exist_ok=True)
    os.chown(root, user.pw_uid, user.pw_gid)
    link = root / protocol.CACHE
    if link.is_symlink():
        link.unlink()
    elif link.exists():
        return link  # the node's own cache: left as it is
    link.symlink_to(user_cache(user, base), target_is_directory=True)
    os.lchown(link, user.pw_uid, user.pw_gid)
    return link


def link_node_cache(home: Path, user: pwd.struct_passwd, base: Path = KERNELS) -> Path:
    """:func:`link_root_cache` of the default ``mlxops_root``, ``home/.mlxops``."""
    return link_root_cache(home / ".mlxops", user, base)


def seed(source: Path, target: Path, user: pwd.struct_passwd) -> None:
    """Copy to ``target`` (as ``user``'s) the compiled kernels under ``source`` it lacks.

    Each node user (the bash sandbox's, the zsh one's) compiles every kernel once
    otherwise: on this 2-core machine while shared, the tmux monitor test on zsh nodes took
    86 s without them and 10 s with them, and a job's ranks, all in g++ at once, outlasted
    a 30 s stall timeout. g++ writes
    ``tmp_*`` files and MLX renames them when done: those are skipped, and each copy is
    renamed into place whole."""
    for src in sorted(source.rglob("*")) if source.is_dir() else []:
        dst = target / src.relative_to(source)
        if src.is_dir() or src.name.startswith("tmp_") or dst.exists():
            continue
        _mkdirs_as(dst.parent, user)
        part = dst.with_name(f".seed-{os.getpid()}")  # kernel names are near NAME_MAX
        shutil.copyfile(src, part)
        os.chown(part, user.pw_uid, user.pw_gid)
        os.chmod(part, src.stat().st_mode & 0o777)
        os.replace(part, dst)


def _mkdirs_as(folder: Path, user: pwd.struct_passwd) -> None:
    """``folder`` and its missing parents, ``user``'s and private (0700): a kernel cache
    open to others is refused by the nodes' rule (:mod:`mlxops.node.tempdir`), and its
    ranks would compile every kernel again."""
    if not folder.exists():
        _mkdirs_as(folder.parent, user)
        folder.mkdir()
        os.chown(folder, user.pw_uid, user.pw_gid)
        folder.chmod(0o700)

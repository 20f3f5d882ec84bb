"""The run's own temporary directory, and the node user's compiled-kernel cache in it.

Policy. Ranks never use the node's shared temporary directory. MLX's CPU backend writes
each kernel's source under ``$TMPDIR/mlx/<version>/cpu/`` and compiles it there with g++,
or loads the library it finds there already (MLX's ``compiled.cpp``: C++'s
``temp_directory_path()``, ``TMPDIR`` first; MLX has no setting of its own). Where another
user ran MLX first, that directory is theirs: our source file cannot be written and every
compiled step fails (``g++ ... No such file or directory``), or their library is loaded
into our process. So every attempt starts with ``<run_dir>/tmp/``
(:data:`protocol.TMP_DIR`) new, empty, the node user's and mode 0700, and its ranks get it
as ``TMPDIR`` (docs/job-file.md).

Compiling every kernel again at each job's first step costs tens of seconds to minutes
(README, "Nodes that other people use too"), so ``tmp/mlx`` is a link to the node user's
cache, ``<mlxops_root>/cache/mlx`` (:data:`protocol.KERNEL_CACHE`), kept across runs. The
link is made only when the cache is this user's and open to no one else, what MLX made in
it this user's, and its parent this user's or root's and writable by no one else (links
followed: ``cache`` may link elsewhere); otherwise the answer says why, and the ranks
compile into the run's own ``tmp/mlx``, slower but safe.
"""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

from mlxops.node import protocol


def not_private(path: Path, owners: tuple[int, ...], closed: int = 0o022) -> str | None:
    """Why ``path`` (followed through links) is not a directory owned by one of ``owners``
    without any of the ``closed`` mode bits; None when it is."""
    st = os.stat(path)
    if not stat.S_ISDIR(st.st_mode):
        return f"{path} is not a directory"
    if st.st_uid not in owners:
        return f"{path} belongs to uid {st.st_uid}, not {os.geteuid()}"
    if st.st_mode & closed:
        return f"{path} is open to others (mode {stat.S_IMODE(st.st_mode):o})"
    return None


def make_private(path: Path) -> None:
    """``path`` and its missing parents, each made mode 0700 whatever the umask (a umask of
    002 would leave them writable by the group)."""
    missing = [p for p in (path, *path.parents) if not p.exists()]
    for directory in reversed(missing):
        directory.mkdir(mode=0o700, exist_ok=True)
        directory.chmod(0o700)


def cache_problem(cache: Path) -> str | None:
    """Why ``cache`` is not safe to compile in and load from, or None when it is: its
    parent is this user's or root's and writable by no one else; the cache is this user's
    and open to no one else (so nothing in it can be changed by another user, whatever
    mode MLX gives what it makes there); and what MLX made in it (``<version>/``,
    ``<version>/cpu/``) is this user's, not another user's that found it open before."""
    me = os.geteuid()
    why = not_private(cache.parent, (me, 0)) or not_private(cache, (me,), closed=0o077)
    if why:
        return why
    for version in (d for d in cache.iterdir() if d.is_dir()):
        for path in (version, *(d for d in version.iterdir() if d.is_dir())):
            why = not_private(path, (me,), closed=0)
            if why:
                return why
    return None


def _empty(tmp: Path) -> None:
    """Remove ``tmp`` whatever it is: links are removed, never followed (``tmp/mlx`` is
    the kernel cache, which stays)."""
    if tmp.is_symlink() or (tmp.exists() and not tmp.is_dir()):
        tmp.unlink()
    elif tmp.exists():
        shutil.rmtree(tmp)


def link_kernel_cache(tmp: Path, cache: Path) -> str | None:
    """Link ``tmp/mlx`` to ``cache`` (made 0700, with its missing parents, when missing);
    why not, or None."""
    try:
        make_private(cache)
        why = cache_problem(cache)
        if why:
            return why
        (tmp / protocol.MLX_TMP).symlink_to(cache, target_is_directory=True)
    except OSError as exc:
        return f"{exc.filename or cache}: {exc.strerror or exc}"
    return None


def prepare(run_dir: Path) -> tuple[str | None, str | None]:
    """A new, empty ``<run_dir>/tmp/`` (mode 0700) for the attempt about to start, its
    ``mlx`` linked to the kernel cache: ``(cache, None)``, or ``(None, why not)``."""
    tmp = run_dir / protocol.TMP_DIR
    _empty(tmp)
    tmp.mkdir(mode=0o700)
    tmp.chmod(0o700)  # whatever the umask
    cache = protocol.kernel_cache_path(run_dir)
    refused = link_kernel_cache(tmp, cache)
    return (None, refused) if refused else (str(cache), None)

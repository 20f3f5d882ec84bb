"""The run's own temporary directory, and the node user's compiled-kernel cache in it.

Policy. Ranks never use the node's shared temporary directory. MLX's CPU backend writes
each kernel's source under ``$TMPDIR/mlx/<version>/cpu/`` and compiles it there with g++,
or loads the library it finds there already (read from MLX's ``compiled.cpp``; no variable
but ``TMPDIR`` moves it). Where another user ran MLX first, that directory is theirs: our
source file cannot be written and every compiled step fails (``g++ ... No such file or
directory``), or their library is loaded into our process. So every attempt starts with
``<run_dir>/tmp/`` (:data:`protocol.TMP_DIR`) new, empty, the node user's and mode 0700,
and its ranks get it as ``TMPDIR`` (docs/job-file.md).

Compiling every kernel again at each job's first step costs seconds to tens of seconds
(README, "Nodes that other people use too"), so ``tmp/mlx`` is a link to the node user's
cache, ``<mlxops_root>/cache/mlx`` (:data:`protocol.KERNEL_CACHE`), kept across runs. The
link is made only when the cache and what MLX made in it are this user's and its parent
this user's or root's, none writable by anyone else (links followed: ``cache`` may link
elsewhere); otherwise the answer says why, and the ranks compile into the run's own
``tmp/mlx``, slower but safe.
"""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

from mlxops.node import protocol


def not_private(path: Path, owners: tuple[int, ...]) -> str | None:
    """Why ``path`` (followed through links) is not a directory owned by one of ``owners``
    that no one else can write to; None when it is."""
    st = os.stat(path)
    if not stat.S_ISDIR(st.st_mode):
        return f"{path} is not a directory"
    if st.st_uid not in owners:
        return f"{path} belongs to uid {st.st_uid}, not {os.geteuid()}"
    if st.st_mode & 0o022:
        return f"{path} is writable by others (mode {stat.S_IMODE(st.st_mode):o})"
    return None


def cache_problem(cache: Path) -> str | None:
    """Why ``cache`` is not safe to compile in and load from: its parent must be this
    user's or root's, the cache and MLX's directories in it (``<version>/cpu``) this
    user's, none writable by anyone else. None when it is safe."""
    me = os.geteuid()
    why = not_private(cache.parent, (me, 0)) or not_private(cache, (me,))
    if why:
        return why
    for version in (d for d in cache.iterdir() if d.is_dir()):
        for path in (version, *(d for d in version.iterdir() if d.is_dir())):
            why = not_private(path, (me,))
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
    """Link ``tmp/mlx`` to ``cache`` (made 0700 when missing); why not, or None."""
    try:
        cache.mkdir(mode=0o700, parents=True, exist_ok=True)
        why = cache_problem(cache)
        if why:
            return why
        (tmp / protocol.MLX_TMP).symlink_to(cache, target_is_directory=True)
    except OSError as exc:
        return f"{cache}: {exc.strerror or exc}"
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

"""Copy a directory tree to a node, sending only what differs, in one stream.

Two commands per host and nothing else: (1) the node prints a manifest (relative path,
sha256, mode) of every file under the managed roots of ``dest`` — with the node's python
when we know it, else a POSIX pipeline of ``find`` + ``sha256sum``/``shasum -a 256`` +
``stat``; (2) one command deletes the stale files (paths passed quoted) and unpacks, from
stdin, a tar archive of just the new and changed files. Nothing differs: no step 2.

Excluded on both sides: ``.git``, ``__pycache__``, ``*.pyc``, ``.DS_Store`` and the
patterns of every ``.gitignore`` in the source (the rules of :mod:`mlxops.ignore`). Node
files that match an exclude are never reported nor deleted (the trainer's own
``__pycache__`` survives a sync), like rsync without ``--delete-excluded``.

What ``code/`` holds on every node (:func:`bundle`: the trainer, the node helpers,
fine-tuning, a job's workdir) is defined here too, once for provision's ``sync`` task and a
job's pre-flight: below the tasks, so that a job's start-up imports no task module.
"""

from __future__ import annotations

import functools
import hashlib
import io
import json
import os
import posixpath
import re
import stat
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from mlxops import archive as archive_files
from mlxops import paths, shell
from mlxops.errors import MlxopsError
from mlxops.ignore import Ignore
from mlxops.node.protocol.layout import job_code_path
from mlxops.transport.connection import Connection

DEFAULT_EXCLUDES = (".git/", "__pycache__/", "*.pyc", ".DS_Store")


class SyncError(MlxopsError):
    """A node could not list or receive files."""


@dataclass
class SyncReport:
    added: list[str] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    bytes_sent: int = 0

    @property
    def has_changes(self) -> bool:
        return bool(self.added or self.changed or self.deleted)

    def summary(self) -> str:
        return f"{len(self.added)} added, {len(self.changed)} changed, {len(self.deleted)} deleted"

    def diff(self) -> str:
        """``+ path`` / ``~ path`` / ``- path`` lines, for --diff."""
        return "".join(f"{sign} {p}\n" for sign, paths in
                       (("+", self.added), ("~", self.changed), ("-", self.deleted))
                       for p in paths)


# --- the local side ----------------------------------------------------------------------


def collect(src: Path, excludes: Sequence[str] = DEFAULT_EXCLUDES, prefix: str = ""
            ) -> tuple[dict[str, Path], Ignore]:
    """Files to send: ``{relative path (under prefix): local path}``, and the rules used."""
    src = Path(src)
    if not src.is_dir():
        raise SyncError(f"{src}: not a directory")
    ignore = Ignore(excludes)
    files: dict[str, Path] = {}
    for dirpath, dirnames, filenames in os.walk(src):
        rel_dir = Path(dirpath).relative_to(src).as_posix()
        rel_dir = "" if rel_dir == "." else rel_dir
        if ".gitignore" in filenames:
            ignore.add_file(Path(dirpath) / ".gitignore", rel_dir)
        kept = []
        for d in sorted(dirnames):
            rel = posixpath.join(rel_dir, d)
            if not ignore.matches(rel, True) and not os.path.islink(os.path.join(dirpath, d)):
                kept.append(d)
        dirnames[:] = kept
        for f in sorted(filenames):
            rel = posixpath.join(rel_dir, f)
            path = Path(dirpath) / f
            if ignore.matches(rel, False) or not path.is_file():
                continue
            files[posixpath.join(prefix, rel) if prefix else rel] = path
    return files, (ignore.under(prefix) if prefix else ignore)


#: A job's name as it may name its directory under ``code/jobs/``.
JOB_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


def bundle(workdir: Path | None = None, job: str | None = None
           ) -> tuple[dict[str, Path], list[str], Ignore]:
    """``(files, roots, ignore)`` of what ``code/`` holds: the trainer, and a job's workdir."""
    files, ignore = collect(paths.trainer_dir(), DEFAULT_EXCLUDES, prefix="mlxops/trainer")
    # The node-side helpers of jobs (spawn, status, stop, logs) travel with the trainer.
    node_files, node_ignore = collect(paths.node_dir(), DEFAULT_EXCLUDES, prefix="mlxops/node")
    files.update(node_files)
    ignore.extend(node_ignore)
    # Fine-tuning (python -m mlxops.finetune) runs beside the trainer, on its modules.
    ft_files, ft_ignore = collect(paths.trainer_dir().parent / "finetune", DEFAULT_EXCLUDES,
                                  prefix="mlxops/finetune")
    files.update(ft_files)
    ignore.extend(ft_ignore)
    files["mlxops/__init__.py"] = paths.trainer_dir().parent / "__init__.py"
    # The excludes above apply under mlxops/trainer/ and mlxops/node/ only; the
    # mlxops/__pycache__/ a node's Python writes beside __init__.py is no difference either
    # (else every provision after a job deletes it again, and never reports ok).
    ignore.extend(Ignore(DEFAULT_EXCLUDES))
    roots = sync_roots(workdir, job)
    if workdir is not None:
        job_files, job_ignore = collect(Path(workdir), DEFAULT_EXCLUDES, prefix=roots[-1])
        files.update(job_files)
        ignore.extend(job_ignore)
    return files, roots, ignore


def sync_roots(workdir: object, job: str | None) -> list[str]:
    """The directories under ``code/`` the task owns: ``mlxops``, and the job's with a
    workdir."""
    if workdir is None:
        return ["mlxops"]
    if not job or not JOB_NAME.match(job):
        raise ValueError(f"job name {job!r}: want letters, digits, '.', '_' or '-'")
    return ["mlxops", job_code_path(job)]


def file_digest(path: Path) -> tuple[str, int]:
    """(sha256, mode) of a local file; hashed once per version, not once per host."""
    st = os.stat(path)
    return _content_digest(str(path), st.st_mtime_ns, st.st_size), stat.S_IMODE(st.st_mode)


@functools.lru_cache(maxsize=4096)
def _content_digest(path: str, mtime_ns: int, size: int) -> str:
    # Keyed by mtime and size too: an edited file is hashed again.
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


# --- the node side -----------------------------------------------------------------------

PY_MANIFEST = r"""
import hashlib, json, os, stat, sys
base, out = sys.argv[1], {}
for root in sys.argv[2:]:
    for d, dirs, files in os.walk(os.path.join(base, root)):
        for f in files:
            p = os.path.join(d, f)
            st = os.lstat(p)
            h = ""
            if stat.S_ISREG(st.st_mode):
                sha = hashlib.sha256()
                with open(p, "rb") as fh:
                    for chunk in iter(lambda: fh.read(1 << 20), b""):
                        sha.update(chunk)
                h = sha.hexdigest()
            out[os.path.relpath(p, base)] = [h, stat.S_IMODE(st.st_mode)]
json.dump(out, sys.stdout)
"""

# Portable (macOS + Linux) when the node's python is unknown. Paths with newlines in them
# are not supported here; the python manifest has no such limit.
_SH_MANIFEST = (
    'if command -v sha256sum >/dev/null 2>&1; then h=sha256sum; else h="shasum -a 256"; fi; '
    'for r in "$@"; do [ -d "$r" ] || continue; '
    'find "$r" -type f -exec sh -c \'h=$1; shift; for f do '
    'm=$(stat -c %a "$f" 2>/dev/null || stat -f %Lp "$f"); '
    's=$($h < "$f" | cut -d" " -f1); printf "%s %s %s\\n" "$s" "$m" "$f"; done\' sh "$h" {} +; '
    "done"
)


def python_manifest_args(dest: str, roots: Sequence[str]) -> str:
    """What follows a node interpreter to print the manifest of ``dest``'s roots as JSON.

    Callers that already run a command on the node (jobs' pre-flight) append it to theirs
    and pass the parsed result to :func:`sync_files` as ``remote``.
    """
    return f"{shell.join(['-c', PY_MANIFEST])} {shell.path_word(dest)} {shell.join(roots)}"


def manifest_command(dest: str, roots: Sequence[str], python: str | None) -> str:
    d = shell.path_word(dest)
    if python:
        return f"{shell.quote(python)} {python_manifest_args(dest, roots)}"
    return (f"cd {d} 2>/dev/null || exit 0; "
            f"{shell.join(['sh', '-c', _SH_MANIFEST, 'sh', *roots])}")


def parse_manifest(stdout: str, python: bool) -> dict[str, tuple[str, int]]:
    if python:
        data = json.loads(stdout or "{}")
        return {posixpath.normpath(k): (v[0], int(v[1])) for k, v in data.items()}
    out = {}
    for line in stdout.splitlines():
        sha, mode, rel = line.split(" ", 2)
        out[posixpath.normpath(rel)] = (sha, int(mode, 8))
    return out


def remote_manifest(conn: Connection, dest: str, roots: Sequence[str], python: str | None
                    ) -> dict[str, tuple[str, int]]:
    result = conn.run(manifest_command(dest, roots, python))
    if not result.ok:
        raise SyncError(f"{conn.name}: cannot list {dest}: {result.error_line()}")
    try:
        return parse_manifest(result.stdout, bool(python))
    except (ValueError, IndexError, KeyError) as exc:
        raise SyncError(f"{conn.name}: unreadable manifest of {dest}: {exc}") from None


def apply_command(dest: str, deleted: Sequence[str], empty_dirs: Sequence[str],
                  unpack: bool) -> str:
    steps = ["umask 022", f"mkdir -p {shell.path_word(dest)}", f"cd {shell.path_word(dest)}"]
    if deleted:
        steps.append(f"rm -f -- {shell.join(deleted)}")
    if empty_dirs:
        # Best effort: a directory that still holds excluded files (__pycache__) stays.
        steps.append(f"{{ rmdir -- {shell.join(empty_dirs)} 2>/dev/null; true; }}")
    if unpack:
        # bsdtar (macOS) and GNU tar both take these; -p keeps the file modes we send.
        steps.append("tar -xpf - --no-same-owner")
    return shell.and_then(steps)


def _parents(rel: str) -> list[str]:
    parts = rel.split("/")[:-1]
    return ["/".join(parts[:i]) for i in range(len(parts), 0, -1)]


def sync_files(conn: Connection, files: Mapping[str, Path], dest: str, *,
               roots: Sequence[str] = (".",), ignore: Ignore | None = None,
               check: bool = False, python: str | None = None,
               remote: Mapping[str, tuple[str, int]] | None = None) -> SyncReport:
    """Make ``dest``'s ``roots`` hold exactly ``files`` (``{rel path: local file}``).

    Node files under ``roots`` that ``ignore`` excludes are left alone; files outside
    ``roots`` are never looked at. ``remote``: the node's manifest when the caller already
    fetched it (then nothing is sent unless something differs).
    """
    ignore = ignore or Ignore(DEFAULT_EXCLUDES)
    if remote is None:
        remote = remote_manifest(conn, dest, roots, python)
    remote = {k: v for k, v in remote.items() if not ignore.excluded(k)}
    report = SyncReport()
    for rel in sorted(files):
        want = file_digest(files[rel])
        have = remote.get(rel)
        if have is None:
            report.added.append(rel)
        elif have != want:
            report.changed.append(rel)
    report.deleted = sorted(set(remote) - set(files))
    if check or not report.has_changes:
        return report
    kept_dirs = {p for rel in files for p in _parents(rel)}
    empty = sorted({p for rel in report.deleted for p in _parents(rel)} - kept_dirs
                   - {posixpath.normpath(r) for r in roots},
                   key=lambda p: (-p.count("/"), p))
    send = report.added + report.changed
    archive = archive_files.write(archive_files.from_files((n, files[n]) for n in send)
                                  ) if send else None
    if archive is not None:
        archive.seek(0, io.SEEK_END)
        report.bytes_sent = archive.tell()
        archive.seek(0)
    try:
        result = conn.run(apply_command(dest, report.deleted, empty, bool(send)), stdin=archive)
    finally:
        if archive is not None:
            archive.close()
    if not result.ok:
        raise SyncError(f"{conn.name}: cannot update {dest}: {result.error_line()}")
    return report

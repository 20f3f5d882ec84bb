"""Managed files on a node: read once, compare, write atomically only on difference.

One round trip reads the file's mode and content (base64, so any bytes survive the text
channel): the play's facts command when the task declared the read (:func:`file_reads`,
the answer in ``ctx.reads`` by path), else one of its own; the write is a second one, only
when something differs and not under --check.
Everything runs under POSIX ``sh`` with tools macOS and Linux share: ``stat -c`` (GNU) is
tried before ``stat -f`` (BSD), ``base64``, ``mktemp DIR/.name.XXXXXX``, ``mv``.
"""

from __future__ import annotations

import base64
import binascii
import difflib
import posixpath
from collections.abc import Iterable

from mlxops import shell
from mlxops.tasks.base import Outcome, TaskContext
from mlxops.transport.connection import Connection

_ABSENT = "absent"
_PRESENT = "present"


def read_command(path: str) -> str:
    p = shell.path_word(path)
    return (
        f"p={p}; "
        'if [ -f "$p" ]; then '
        # GNU stat first: BSD stat has no -c and fails, GNU stat -f means something else.
        'm=$(stat -c %a "$p" 2>/dev/null || stat -f %Lp "$p") || exit 1; '
        f'echo "{_PRESENT} $m" && base64 < "$p"; '
        f"else echo {_ABSENT}; fi"
    )


def write_command(path: str, mode: int) -> str:
    """Write stdin to ``path`` atomically: temp file beside it, chmod, then rename."""
    p = shell.path_word(path)
    d = shell.path_word(posixpath.dirname(path) or ".")
    base = posixpath.basename(path)
    tmpl = shell.path_word(posixpath.join(posixpath.dirname(path) or ".", f".{base}.XXXXXX"))
    return (
        f"umask 077; d={d}; p={p}; "
        f'mkdir -p "$d" && t=$(mktemp {tmpl}) || exit 1; '
        f'if cat > "$t" && chmod {mode:o} "$t" && mv -f "$t" "$p"; then :; '
        'else rm -f "$t"; exit 1; fi'
    )


def file_reads(paths: Iterable[str]) -> dict[str, str]:
    """The reads of a task that manages these node files: ``{path: read_command(path)}``."""
    return {path: read_command(path) for path in paths}


def read_file(conn: Connection, path: str) -> tuple[bytes | None, int | None]:
    """``(content, mode)`` of a node file, ``(None, None)`` if it does not exist."""
    result = conn.run(read_command(path))
    if not result.ok:
        raise OSError(f"cannot read {path}: {result.error_line()}")
    return parse_read(path, result.stdout)


def parse_read(path: str, stdout: str) -> tuple[bytes | None, int | None]:
    """What :func:`read_command` printed, as ``(content, mode)``; OSError if it is not that."""
    head, _, body = stdout.partition("\n")
    if head.strip() == _ABSENT:
        return None, None
    word, _, mode = head.partition(" ")
    if word != _PRESENT:
        raise OSError(f"cannot read {path}: unexpected output {head!r}")
    try:
        return base64.b64decode(body), int(mode.strip(), 8)
    except (binascii.Error, ValueError) as exc:
        raise OSError(f"cannot read {path}: {exc}") from None


def unified_diff(path: str, old: bytes | None, new: bytes, old_mode: int | None,
                 new_mode: int) -> str:
    lines = []
    if old_mode is not None and old_mode != new_mode:
        lines.append(f"mode {path}: {old_mode:o} -> {new_mode:o}\n")
    if old != new:
        before = (old or b"").decode(errors="replace").splitlines(keepends=True)
        after = new.decode(errors="replace").splitlines(keepends=True)
        lines.extend(difflib.unified_diff(
            before, after, fromfile="/dev/null" if old is None else f"{path} (node)",
            tofile=f"{path} (mlxops)"))
    text = "".join(lines)
    return text if text.endswith("\n") or not text else text + "\n"


def ensure_file(ctx: TaskContext, path: str, content: bytes, mode: int = 0o600) -> Outcome:
    """Make the node file ``path`` hold ``content`` with ``mode``; changed only if it differed.

    ``path`` is a node path (``~/...`` is the node's home). Under ``ctx.check`` nothing is
    written; under ``ctx.diff`` the outcome carries a unified diff.
    """
    try:
        answer = ctx.prefetched(path)
        old, old_mode = (parse_read(path, answer) if answer is not None
                         else read_file(ctx.conn, path))
    except OSError as exc:
        return Outcome.failed(str(exc))
    if old == content and old_mode == mode:
        return Outcome.ok(f"{path} up to date")
    diff = unified_diff(path, old, content, old_mode, mode) if ctx.diff else ""
    what = "created" if old is None else ("updated" if old != content else "mode fixed")
    if ctx.check:
        return Outcome.changed(f"{path} would be {what}", diff=diff)
    result = ctx.conn.run(write_command(path, mode), stdin=content)
    if not result.ok:
        return Outcome.failed(f"cannot write {path}: {result.error_line()}")
    return Outcome.changed(f"{path} {what}", diff=diff)

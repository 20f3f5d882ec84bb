"""The one way the controller builds a tar archive to stream to a node's ``tar -xf -``.

Three things travel as tar: the synced code (files on disk, their modes), a job's run
files (bytes made in memory, mode 600: rank scripts hold the job's environment) and a
wheelhouse (gzip'd). One writer serves them so every archive has the same format: PAX,
which GNU tar and a Mac's bsdtar both read, with no owner names (the node's user owns what
it unpacks), never a size limit on names.
"""

from __future__ import annotations

import io
import os
import stat
import tarfile
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import IO

#: Archives up to this size stay in memory; larger ones spill to a temporary file.
IN_MEMORY = 64 << 20


@dataclass(frozen=True)
class Entry:
    """One regular file of an archive: its name, and its bytes or the file to read."""

    name: str
    data: bytes | Path
    mode: int | None = None  # None: the file's own mode (a Path), else 0o644


def from_files(files: Iterable[tuple[str, Path]]) -> list[Entry]:
    """Entries for files on disk, keeping their modes."""
    return [Entry(name, path) for name, path in files]


def from_bytes(files: dict[str, bytes], mode: int) -> list[Entry]:
    """Entries made in memory, all with ``mode``."""
    return [Entry(name, data, mode) for name, data in files.items()]


def write(entries: Iterable[Entry], *, gzip: bool = False) -> IO[bytes]:
    """The archive, rewound, as a file object to feed a command's stdin."""
    buf = tempfile.SpooledTemporaryFile(max_size=IN_MEMORY)
    now = int(time.time())
    with tarfile.open(fileobj=buf, mode="w:gz" if gzip else "w",
                      format=tarfile.PAX_FORMAT) as tar:
        for entry in entries:
            info = tarfile.TarInfo(entry.name)
            if isinstance(entry.data, Path):
                st = os.stat(entry.data)
                info.size, info.mtime = st.st_size, int(st.st_mtime)
                info.mode = stat.S_IMODE(st.st_mode) if entry.mode is None else entry.mode
                with open(entry.data, "rb") as fh:
                    tar.addfile(info, fh)
            else:
                info.size, info.mtime = len(entry.data), now
                info.mode = 0o644 if entry.mode is None else entry.mode
                tar.addfile(info, io.BytesIO(entry.data))
    buf.seek(0)
    return buf


def write_bytes(entries: Iterable[Entry], *, gzip: bool = False) -> bytes:
    """:func:`write`, read whole (small archives that are sent more than once)."""
    with write(entries, gzip=gzip) as handle:
        return handle.read()

"""The one way the controller builds a tar archive to stream to a node's ``tar -xf -``.

Four things travel as tar: the synced code (files on disk, their modes), a job's run
files (bytes made in memory, mode 600: rank scripts hold the job's environment), a
wheelhouse (gzip'd) and a job's large files (prepared shards, a base model:
:mod:`mlxops.jobs.content`). One writer serves them so every archive has the same format:
PAX, which GNU tar and a Mac's bsdtar both read, with no owner names (the node's user owns
what it unpacks), never a size limit on names.

Small archives are made whole (:func:`write`: in memory, spilled to a temporary file past
:data:`IN_MEMORY`); a job's large files are made **as they are sent** (:func:`stream`: a
thread writes the tar into a pipe that the connection reads), so placing 15 GB on eight
nodes at once costs the controller no temporary disk and a pipe's buffer of memory each.
"""

from __future__ import annotations

import io
import os
import stat
import tarfile
import tempfile
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

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


def _add(tar: tarfile.TarFile, entries: Iterable[Entry]) -> None:
    now = int(time.time())
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


def write(entries: Iterable[Entry], *, gzip: bool = False) -> IO[bytes]:
    """The archive, rewound, as a file object to feed a command's stdin."""
    buf = tempfile.SpooledTemporaryFile(max_size=IN_MEMORY)
    with tarfile.open(fileobj=buf, mode="w:gz" if gzip else "w",
                      format=tarfile.PAX_FORMAT) as tar:
        _add(tar, entries)
    buf.seek(0)
    return buf


class TarStream(io.RawIOBase):
    """An archive made while it is read: a thread writes it into a pipe, whose other end
    this is (``fileno()`` included, so a local command can read the pipe itself).

    ``sent`` counts the bytes read so far. A reader that stops early (the command it feeds
    exited) and closes this ends the writer (a broken pipe, not an error). A file that
    could not be read (gone since it was listed) ends the stream early and is raised by
    :meth:`check` (the command fed sees a cut archive and fails too).
    """

    def __init__(self, entries: Iterable[Entry]) -> None:
        read, write = os.pipe()
        self._in = os.fdopen(read, "rb", buffering=0)
        self.sent = 0
        self.error: BaseException | None = None
        self._writer = threading.Thread(target=self._write, args=(write, list(entries)),
                                        name="archive-stream", daemon=True)
        self._writer.start()

    def _write(self, fd: int, entries: list[Entry]) -> None:
        out = os.fdopen(fd, "wb")
        try:
            with tarfile.open(fileobj=out, mode="w|", format=tarfile.PAX_FORMAT) as tar:
                _add(tar, entries)
        except BrokenPipeError:
            pass  # the reader stopped: the command it fed says why
        except BaseException as exc:  # noqa: BLE001 - handed to the reader's thread
            self.error = exc
        finally:
            try:
                out.close()
            except BrokenPipeError:
                pass

    def readable(self) -> bool:
        return True

    def fileno(self) -> int:
        return self._in.fileno()

    def readinto(self, buffer: Any) -> int:
        n = self._in.readinto(buffer) or 0
        self.sent += n
        return n

    def check(self) -> None:
        """Raise what stopped the writer, if anything did (call once the reader is done)."""
        self._writer.join()
        if self.error is not None:
            raise self.error

    def close(self) -> None:
        if not self.closed:
            self._in.close()
            self._writer.join()
        super().close()


def stream(entries: Iterable[Entry]) -> TarStream:
    """The archive of ``entries``, made as it is read (never whole anywhere)."""
    return TarStream(entries)


def write_bytes(entries: Iterable[Entry], *, gzip: bool = False) -> bytes:
    """:func:`write`, read whole (small archives that are sent more than once)."""
    with write(entries, gzip=gzip) as handle:
        return handle.read()

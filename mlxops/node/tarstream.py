"""A tar of named files unpacked as it streams: the one reader of the tars the controller
and the nodes send each other (a node's ``send`` to the controller's download, the
controller's checkpoint parts to a node's ``receive``).

What is accepted: exactly the files named, each once, a regular file of the size named,
under a plain relative name (no ``..``, no absolute path); each is written a buffer at a
time, never held whole. Anything else raises :class:`NotNamed` or :class:`WrongSize`
(``tarfile.TarError`` for a damaged stream), for the caller to word with its own context;
what was written before stays in ``into``, the caller's temporary directory. Standard
library only: nodes run it.
"""

from __future__ import annotations

import os
import shutil
import tarfile
from pathlib import Path, PurePosixPath
from typing import IO

#: Bytes read from the stream and written to disk at a time.
CHUNK = 1 << 20


class NotNamed(ValueError):
    """The tar holds ``name``, which is not one of the files named (or is not a plain
    regular file, or came twice)."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.name = name


class WrongSize(ValueError):
    """``name`` came with ``sent`` bytes where ``named`` were named."""

    def __init__(self, name: str, sent: int, named: int) -> None:
        super().__init__(name)
        self.name, self.sent, self.named = name, sent, named


def plain_name(name: str) -> bool:
    """A relative name inside the directory: not empty, not absolute, no ``..``."""
    path = PurePosixPath(name)
    return bool(name) and not path.is_absolute() and ".." not in path.parts


def unpack_named(stream: IO[bytes], files: dict[str, int], into: Path, *,
                 durable: bool = False) -> dict[str, int]:
    """Unpack the tar on ``stream`` into ``into`` (an existing directory), holding it to
    ``files`` (name -> size); ``durable`` syncs each file to disk as it is written. Returns
    name -> bytes written, in the order they came (a stream that ended early lacks some:
    the caller names the first)."""
    got: dict[str, int] = {}
    with tarfile.open(fileobj=stream, mode="r|", bufsize=CHUNK) as tar:
        for member in tar:
            name = member.name
            if not member.isfile() or not plain_name(name) or name not in files \
                    or name in got:
                raise NotNamed(name)
            if member.size != files[name]:
                raise WrongSize(name, member.size, files[name])
            target = into / name
            target.parent.mkdir(parents=True, exist_ok=True)
            source = tar.extractfile(member)
            assert source is not None  # a regular file
            with open(target, "wb") as sink:
                shutil.copyfileobj(source, sink, CHUNK)
                if durable:
                    sink.flush()
                    os.fsync(sink.fileno())
            got[name] = target.stat().st_size
    return got

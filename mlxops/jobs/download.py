"""Files from a node to the controller, as a stream: the one download of ``mlxops fetch``
and ``mlxops export``.

The node runs ``python -m mlxops.node send`` (:mod:`mlxops.node.protocol.send`): one answer
line naming the directory, the files and their sizes (or why there is nothing), then the
files as a tar. Here both are read as they come off the connection
(:func:`mlxops.transport.output.read_output`): each file is written to disk a buffer at a
time, never held whole, never as text (a 15 GB model costs the controller a few MB).

What is accepted: exactly the files the answer named, each a regular file of the size it
named, with a plain relative name (:mod:`mlxops.node.tarstream`, the nodes' reader too):
anything else, or a stream that ends early, is :class:`DownloadError`, and the directory
written into is the caller's temporary one, renamed into place only when whole.
"""

from __future__ import annotations

import tarfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from mlxops.errors import MlxopsError
from mlxops.node import protocol
from mlxops.node.protocol.send import SEND, SendAnswer
from mlxops.node.tarstream import NotNamed, WrongSize, unpack_named
from mlxops.transport import CommandResult, Connection
from mlxops.transport.nodecmd import node_command
from mlxops.transport.output import read_output

#: Lines the node may print before the send answer (an exporter's own answer line).
MAX_LINES_BEFORE = 20
#: A line longer than this is no answer line (a binary stream gone wrong).
MAX_LINE = 1 << 20
#: Seconds without a byte after which a download is given up.
IDLE_TIMEOUT = 600.0


class DownloadError(MlxopsError):
    """What came back is not the whole set of files the node said it would send."""


@dataclass
class Downloaded:
    answer: SendAnswer | None  # None: the command ended before its answer (see its result)
    before: list[str] = field(default_factory=list)  # lines the command printed first
    written: dict[str, int] = field(default_factory=dict)  # name -> bytes written


def send_command(python: str, code_dir: str, args: Sequence[str]) -> str:
    """The node's ``send`` command line (``args`` from :mod:`mlxops.node.protocol.send`)."""
    return node_command(python, code_dir, args)


def receive(host: str, out: IO[bytes], into: Path) -> Downloaded:
    """Read the answer line (and any lines before it), then unpack the tar into ``into``
    (an existing directory) as it streams."""
    before: list[str] = []
    while True:
        raw = out.readline(MAX_LINE)
        if not raw:
            return Downloaded(None, before)  # it failed first: its exit code says why
        line = raw.decode(errors="replace").strip()
        try:
            answer = protocol.parse_answer(SEND, line)
            break
        except protocol.ProtocolError:
            before.append(line)
            if len(before) > MAX_LINES_BEFORE:
                raise DownloadError(f"{host}: no send answer in the node's output: "
                                    f"{line[:200]!r}") from None
    got = Downloaded(answer, before)
    if answer.missing:
        return got
    try:
        got.written = unpack_named(out, answer.files, into)
    except NotNamed as exc:
        raise DownloadError(f"{host}: the node sent {exc.name!r}, not one of the files it "
                            "named") from None
    except WrongSize as exc:
        raise DownloadError(f"{host}: {exc.name}: {exc.sent} bytes sent, {exc.named} "
                            "named") from None
    except tarfile.TarError as exc:
        raise DownloadError(f"{host}: the files came back damaged: {exc}") from None
    lacking = [name for name in answer.files if name not in got.written]
    if lacking:
        raise DownloadError(f"{host}: the stream ended before {lacking[0]}")
    return got


def download(conn: Connection, command: str, into: Path, *,
             timeout: float = IDLE_TIMEOUT) -> tuple[Downloaded, CommandResult]:
    """Run ``command`` (ending in a node ``send``) on ``conn`` and unpack what it sends into
    ``into``: what came, and the command's result (its exit code and stderr; a failure
    before the answer leaves ``answer`` None). A stream cut short or damaged, or silent for
    ``timeout`` seconds, is :class:`DownloadError`."""
    got, result = read_output(conn, command, lambda out: receive(conn.name, out, into),
                              timeout=timeout)
    if result.timed_out:
        raise DownloadError(f"{conn.name}: no byte for {timeout:g}s: download given up")
    if not result.ok and got.answer is not None and not got.answer.missing:
        raise DownloadError(f"{conn.name}: sending failed: {result.error_line()}")
    return got, result

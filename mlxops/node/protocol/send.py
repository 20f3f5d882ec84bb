"""Sending files to the controller: one node command whose answer line is followed by the
files themselves, as a tar stream on the same output.

Standard library only, synced with the rest of ``mlxops/node``. ``mlxops fetch`` (a
fine-tuning run's adapters) and ``mlxops export`` (a converted checkpoint) both read their
files this way (:mod:`mlxops.jobs.download`):

* ``send --dir DIR [--files NAME...]``: the regular files of ``DIR`` (only ``NAME...`` when
  given);
* ``send --run-dir RUN --where ckpt|best [--step N] --files NAME...``: the checkpoint
  chosen on the node by :func:`mlxops.node.protocol.layout.newest_checkpoint` (or step
  ``N``'s), the one rule for "the newest complete checkpoint";

The output is one JSON line, :class:`SendAnswer`, then, when it names no ``missing``, an
uncompressed POSIX tar (Python's ``tarfile``, the same on macOS and Linux: neither the
node's ``tar`` nor its login shell is involved) of the files, written as read from disk.
The controller reads both incrementally: no file is ever whole in its memory.

For people: docs/node-protocol.md, "Send".
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from mlxops.node.protocol.decode import Record

SEND = "send"
COMMANDS = (SEND,)


def send_args(directory: str, files: Sequence[str] = ()) -> list[str]:
    """Send the regular files of ``directory`` (only ``files``, when given)."""
    return [SEND, "--dir", directory, "--files", *files]


def send_checkpoint_args(run_dir: str, where: str, files: Sequence[str], *,
                         step: int | None = None) -> list[str]:
    """Send ``files`` of the newest complete checkpoint under ``run_dir/where`` (``ckpt`` or
    ``best``), or of step ``step``'s."""
    return [SEND, "--run-dir", run_dir, "--where", where, "--files", *files,
            *(["--step", str(step)] if step is not None else [])]


def add_parsers(sub: Any) -> None:
    send = sub.add_parser(SEND)
    send.add_argument("--dir", default="", help="a directory to send")
    send.add_argument("--run-dir", default="", help="a run directory to choose from")
    send.add_argument("--where", default="", help="ckpt or best, under --run-dir")
    send.add_argument("--step", type=int, default=None, help="that step's checkpoint")
    send.add_argument("--files", nargs="*", default=[], help="names inside the directory")


@dataclass
class SendAnswer(Record):
    directory: str                       # the directory sent (as given, or the chosen one)
    files: dict[str, int] = field(default_factory=dict)  # name -> bytes, as sent, in order
    step: int | None = None              # a checkpoint's (its state.json's), when it has one
    missing: str = ""                    # why nothing follows (no such checkpoint, file)


ANSWERS: dict[str, type[Record]] = {SEND: SendAnswer}

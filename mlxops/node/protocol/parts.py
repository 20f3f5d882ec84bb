"""Checkpoint parts' half of the controller-node protocol: the pieces of a run's checkpoint
that each node writes for itself, listed and received (:mod:`mlxops.jobs.ckptmove` brings
them together before a resume; docs/node-protocol.md, "Checkpoint parts").

Standard library only, synced with the rest of ``mlxops/node``. A *part* is what one rank
wrote that no other node has:

* ``stage``: a pipeline stage's checkpoint directory, ``ckpt/stage-<s>/step-<n>/``
  (``index`` the stage, ``world`` the run's number of stages, its ``state.json``'s
  ``world_size``; ``layers`` the blocks it held, from the ``train.stages`` it ran with);
* ``zero``: a ZeRO-1 rank's slice of the optimizer state, the file
  ``ckpt/step-<n>/zero-rank-<r>.safetensors`` (``index`` the rank, ``world`` the ranks
  that wrote the slices, the file's ``zero_world``).

Two commands:

* ``parts --run-dir RUN``: every part of a complete checkpoint under ``RUN/ckpt``, its
  files (relative to ``ckpt/``) and their sizes; it changes nothing;
* ``receive --run-dir RUN --parts PATH... --files NAME=BYTES...``: a tar of exactly those
  files on stdin, unpacked into a temporary directory in ``RUN/ckpt``, each checked for
  its size, then each part renamed into place (a stage's directory whole, a slice file
  into its step's directory): a part is there whole or not at all.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from mlxops.node.protocol.decode import Record

PARTS, RECEIVE = "parts", "receive"
COMMANDS = (PARTS, RECEIVE)
#: The two kinds of part (see the module).
STAGE, ZERO = "stage", "zero"
#: A pipeline stage's checkpoints: ``ckpt/stage-<s>/`` (the trainer's loop writes there).
STAGE_DIR = "stage-{index}"
#: A ZeRO-1 rank's slice, in its step's checkpoint (``trainer/zero_checkpoint.py``).
ZERO_FILE = "zero-rank-{index}.safetensors"


def parts_args(run_dir: str) -> list[str]:
    """List the checkpoint parts under ``run_dir/ckpt``."""
    return [PARTS, "--run-dir", run_dir]


def receive_args(run_dir: str, parts: Sequence[str], files: Mapping[str, int]) -> list[str]:
    """Receive ``parts`` (paths relative to ``ckpt/``) made of ``files`` (name -> bytes,
    relative to ``ckpt/``) as a tar on stdin."""
    return [RECEIVE, "--run-dir", run_dir, "--parts", *parts,
            "--files", *(f"{name}={size}" for name, size in files.items())]


def parse_files(words: Sequence[str]) -> dict[str, int]:
    """``["a/b=12"]`` -> ``{"a/b": 12}``."""
    pairs = (word.rsplit("=", 1) for word in words)
    return {name: int(size) for name, size in pairs}


def add_parsers(sub: Any) -> None:
    sub.add_parser(PARTS).add_argument("--run-dir", required=True)
    receive = sub.add_parser(RECEIVE)
    receive.add_argument("--run-dir", required=True)
    receive.add_argument("--parts", nargs="+", required=True,
                         help="paths relative to ckpt/, each renamed into place whole")
    receive.add_argument("--files", nargs="+", required=True,
                         help="NAME=BYTES: exactly the files the tar on stdin holds")


@dataclass
class CkptPart(Record):
    kind: str                # STAGE or ZERO
    index: int               # the stage, or the rank that wrote the slice
    world: int               # the stages, or the ranks, of the run that wrote it
    step: int
    path: str                # relative to ckpt/: a directory (stage) or a file (zero)
    files: dict[str, int] = field(default_factory=dict)  # relative to ckpt/ -> bytes
    # A stage's layers ``[first, end)`` (its state.json's ``config.train.stages``); empty:
    # not known (then every node of a run needs it) or a slice.
    layers: list[int] = field(default_factory=list)

    @property
    def key(self) -> tuple[str, int, int]:
        """What makes two nodes' parts the same part."""
        return self.kind, self.step, self.index


@dataclass
class PartsAnswer(Record):
    parts: list[CkptPart] = field(default_factory=list)


@dataclass
class ReceiveAnswer(Record):
    placed: list[str] = field(default_factory=list)   # the parts renamed into place
    bytes: int = 0


ANSWERS: dict[str, type[Record]] = {PARTS: PartsAnswer, RECEIVE: ReceiveAnswer}

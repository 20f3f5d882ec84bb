"""The metrics mirror's files on the controller, beside the job's record in
``~/.mlxops/jobs/<name>/`` (docs/formats.md, "The metrics mirror"):

* ``metrics.jsonl``: a copy of rank 0's ``metrics.jsonl``, tailed by byte offset;
* ``samples.jsonl``: one line per look at the cluster: every rank's state and heartbeat,
  every node's memory, load and GPU;
* ``mirror.json``: where the tail stands (host, offset, inode of the node's file) and which
  launch of the name it mirrors;
* ``mirror.lock``: one feeder at a time.

Appends write whole lines; replacements (a rewritten metrics file, thinned samples) are
atomic. Readers take complete lines only and start over when a file was replaced
(:class:`JsonlTail`).
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from mlxops.jobs.jobdirs import job_dir

METRICS, SAMPLES, STATE, LOCK = "metrics.jsonl", "samples.jsonl", "mirror.json", "mirror.lock"


def path(name: str, file: str) -> Path:
    return job_dir(name) / file


@dataclass
class MirrorState:
    """``mirror.json``."""

    created: float | None = None     # the record's ``created``: which launch is mirrored
    host: str | None = None          # where the tailed metrics.jsonl is (rank 0's host)
    offset: int = 0                  # bytes of it read so far
    inode: int | None = None         # its inode there (a new one: it was rewritten)
    generation: int = 0              # +1 whenever metrics.jsonl here is replaced, not appended
    updated: float | None = None     # the controller's clock at the last feed

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> MirrorState:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in doc.items() if k in known})


def read_state(name: str) -> MirrorState:
    try:
        return MirrorState.from_dict(json.loads(path(name, STATE).read_text()))
    except (OSError, ValueError, TypeError, AttributeError):
        return MirrorState()


def write_atomic(target: Path, text: str) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_state(name: str, state: MirrorState) -> None:
    write_atomic(path(name, STATE), json.dumps(asdict(state)) + "\n")


def append_lines(target: Path, text: str) -> None:
    if text:
        with open(target, "a") as handle:
            handle.write(text)


def parse_lines(text: str) -> list[dict[str, Any]]:
    """The JSON objects of complete lines; a line that does not parse is skipped."""
    out = []
    for line in text.splitlines():
        try:
            doc = json.loads(line)
        except ValueError:
            continue
        if isinstance(doc, dict):
            out.append(doc)
    return out


class JsonlTail:
    """The lines of a JSONL file, read incrementally: only what was appended since the last
    read is parsed; a file replaced (another inode) or shorter is read again from 0."""

    def __init__(self, target: Path,
                 parse: Callable[[str], list[Any]] = parse_lines) -> None:
        self.path = target
        self.parse = parse       # complete lines -> their records
        self.lines: list[Any] = []
        self._offset = 0
        self._inode: int | None = None

    def read(self) -> list[Any]:
        try:
            handle = open(self.path, "rb")
        except OSError:
            self.lines, self._offset, self._inode = [], 0, None
            return self.lines
        with handle:
            stat = os.fstat(handle.fileno())
            if stat.st_ino != self._inode or stat.st_size < self._offset:
                self.lines, self._offset, self._inode = [], 0, stat.st_ino
            handle.seek(self._offset)
            data = handle.read()
        end = data.rfind(b"\n") + 1
        if end:
            self.lines = self.lines + self.parse(data[:end].decode(errors="replace"))
            self._offset += end
        return self.lines

"""``calibration.json``: what ``train.balance: auto`` measured, and the node's answer that
carries it to the controller.

Written by the trainer's writer rank on every node (``trainer/loop.py``) into the run
directory; read on the node by the ``calibration`` command (``node/calibration.py``) and
carried to ``mlxops plan`` (``jobs/balance.py``) in a :class:`CalibrationAnswer`, so the
controller never reads the file itself. Both halves go through the one decoder
(:mod:`.decode`): a missing or mistyped field is named with its path.

Like :mod:`.bench`, the command's name, argument list, parser and answer live here;
:mod:`.commands` adds the parser and :mod:`.answers` reads the answer.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from mlxops.node.protocol.decode import Record, decode

#: The node command that reads a run directory's ``calibration.json``. Reads only.
READ_CALIBRATION = "calibration"


def calibration_args(run_dir: str) -> list[str]:
    return [READ_CALIBRATION, "--run-dir", run_dir]


def add_parsers(sub: Any) -> None:
    """The command on :func:`mlxops.node.protocol.parser`'s subparsers."""
    sub.add_parser(READ_CALIBRATION).add_argument("--run-dir", required=True)


@dataclass
class Calibration(Record):
    """What ``balance: auto`` measured after its calibration steps (docs/trainer.md)."""

    step: int                       # the step after which the ranks measured
    world_size: int
    hosts: list[str]                # the host of each rank
    samples_per_sec: list[float]    # each rank's measured speed
    batch_split: list[int]          # the split taken from then on
    time: float                     # when (seconds since the epoch)

    def to_json(self) -> str:
        """The file's text (one JSON object and a newline)."""
        return json.dumps(self.to_dict()) + "\n"

    @classmethod
    def from_json(cls, text: str, where: str = "calibration.json") -> Calibration:
        """The record in ``text``; ValueError naming ``where`` and, for a record of another
        shape, the field that is missing or of the wrong kind."""
        try:
            doc = json.loads(text)
        except ValueError as exc:
            raise ValueError(f"{where}: not JSON: {exc}") from None
        try:
            return decode(cls, doc)
        except ValueError as exc:
            raise ValueError(f"{where}: {exc}") from None


@dataclass
class CalibrationAnswer(Record):
    """The ``calibration`` command's answer: the run directory's record, if it has one."""

    calibration: Calibration | None      # None: no file (the run did not measure), or junk
    unreadable: str | None = None        # ... junk: why the file is not a record


ANSWERS: dict[str, type[Record]] = {READ_CALIBRATION: CalibrationAnswer}

"""The ``calibration`` command: a run directory's ``calibration.json``, read on the node
(docs/node-protocol.md)."""

from __future__ import annotations

from pathlib import Path

from mlxops.node.protocol.calibration import Calibration, CalibrationAnswer
from mlxops.node.protocol.layout import CALIBRATION


def read_calibration(run_dir: Path) -> CalibrationAnswer:
    """The record the trainer wrote there; none when the run did not measure (no
    ``balance: auto``, or not yet), and why not when the file is not a record."""
    try:
        text = (run_dir / CALIBRATION).read_text()
    except FileNotFoundError:
        return CalibrationAnswer(None)
    except OSError as exc:
        return CalibrationAnswer(None, f"{CALIBRATION}: cannot read: {exc.strerror}")
    try:
        return CalibrationAnswer(Calibration.from_json(text, CALIBRATION))
    except ValueError as exc:
        return CalibrationAnswer(None, str(exc))

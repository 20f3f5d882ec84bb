"""The selftest's command-line choices and defaults: light enough for the CLI to show them
in ``--help`` without importing the selftest (which imports every other part)."""

from __future__ import annotations

from mlxops.selftest import summary as S

#: What ``--skip`` may leave out (trust cannot: every other step stands on it).
SKIPPABLE = (S.PROVISION, S.CHECK, S.BENCH, S.JOB)
DEFAULT_TIMEOUT = 300.0
#: The selftest job's name (its record, run directories, logs).
NAME = "mlxops-selftest"

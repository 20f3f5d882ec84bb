"""The selftest's command-line choices and defaults: light enough for the CLI to show them
in ``--help`` without importing the selftest (which imports every other part)."""

from __future__ import annotations

#: The steps, in the order they run.
TRUST, PROVISION, CHECK, BENCH, JOB, STOP = "trust", "provision", "check", "bench", "job", "stop"
#: What ``--skip`` may leave out (trust cannot: every other step stands on it).
SKIPPABLE = (PROVISION, CHECK, BENCH, JOB)
DEFAULT_TIMEOUT = 300.0
#: The selftest job's name (its record, run directories, logs).
NAME = "mlxops-selftest"

"""The trainer's failure that deserves one line, not a traceback (exit code 1).

Its own module so that every part of the run (the loop, resume, the workloads, the
command line) raises it without importing the loop: imports run one way.
"""

from __future__ import annotations


class TrainerError(RuntimeError):
    """A failure during training that deserves one line, not a traceback. Exit code 1."""

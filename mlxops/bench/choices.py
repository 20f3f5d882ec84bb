"""The bench's choices a user makes on the command line, and their defaults: light enough
for the CLI to show them in ``--help`` without importing the bench itself."""

from __future__ import annotations

from pathlib import Path

from mlxops.jobs.spec import JobSpec
from mlxops.node.protocol.bench import BENCH_JOB

#: ``--pairs``: every pair (and the best ring's search), or only the inventory ring's links.
ALL, RING = "all", "ring"


def default_port() -> int:
    """Derived from the internal job's name by the job files' rule, as any job's port."""
    return JobSpec(path=Path("."), name=BENCH_JOB, inventory=Path(".")).base_port

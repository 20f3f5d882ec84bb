"""The bench's choices a user makes on the command line, and their defaults: light enough
for the CLI to show them in ``--help`` without importing the bench itself."""

from __future__ import annotations

from mlxops.jobs.spec import name_port
from mlxops.node.protocol.bench import BENCH_JOB

#: ``--pairs``: every pair (and the best ring's search), or only the inventory ring's links.
ALL, RING = "all", "ring"


def default_port() -> int:
    """Derived from the internal job's name by the job files' rule, as any job's port."""
    return name_port(BENCH_JOB)

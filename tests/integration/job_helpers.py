"""Helpers shared by the job integration tests: node-side run files, records, metrics."""

from __future__ import annotations

import json
import time
from pathlib import Path

from mlxops.errors import UserError
from mlxops.jobs.record import JobRecord, load_record


def run_dir(sandbox, node: str, name: str) -> Path:
    """The job's run directory on a node, as this machine sees it."""
    return Path(sandbox.node_home(node)) / ".mlxops" / "runs" / name


def losses(sandbox, name: str) -> dict[int, float]:
    """step -> loss from rank 0's metrics (node1); a re-done step keeps its last value."""
    out = {}
    for line in (run_dir(sandbox, "node1", name) / "metrics.jsonl").read_text().splitlines():
        rec = json.loads(line)
        out[rec["step"]] = rec["loss"]
    return out


def wait_for_record(name: str, timeout: float = 60) -> JobRecord:
    """The job's record, once a launch in another process has written it."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return load_record(name)
        except UserError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)

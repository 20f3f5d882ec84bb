"""A rank that exits with code 2 (bad input) is not restarted: on real sshd nodes, a
``command:`` job whose program refuses its input the way the bundled trainer does (its
one line on stderr, exit 2) fails at its first attempt, with that line, however many
restarts ``restart.max_restarts`` allows."""

from __future__ import annotations

import os
import subprocess
import sys

import yaml

from mlxops import events
from mlxops.jobs.record import load_record

#: What the bundled trainer prints for a config it refuses (tests/unit/data/jobs/
#: rank_failures.yml, trainer_config_error: recorded from python -m mlxops.trainer).
REFUSAL = "error: config: data.path: no data files at /nonexistent"


def test_a_rank_that_refuses_its_input_fails_the_job_at_once(sandbox, tmp_path):
    job = tmp_path / "job.yml"
    job.write_text(yaml.safe_dump({
        "name": "bad-input", "inventory": str(sandbox.inventory_path), "hosts": "node1",
        "command": ["python", "-c", f"import sys; print({REFUSAL!r}, file=sys.stderr); "
                                    "sys.exit(2)"],
        "restart": {"max_restarts": 3, "stall_timeout": 30}}))
    launched = subprocess.run([sys.executable, "-m", "mlxops", "launch", str(job)],
                              capture_output=True, text=True, timeout=300,
                              env={**os.environ, "COLUMNS": "200"})
    assert launched.returncode != 0, launched.stdout
    record = load_record("bad-input")
    want = f"rank 0 on node1 exited with code 2 (bad input, not restarted): {REFUSAL}"
    assert (record.state, record.message, record.restarts) == ("failed", want, [])
    assert record.attempt == 1
    assert [e.kind for e in events.read("bad-input")] == ["started", "failed"]

"""A job on inventory/local.yml through the real CLI: no SSH, no root needed.

This is `make demo`'s path: local connection, the controller's interpreter, 2 ranks on
127.0.0.1 over the ring backend, followed to the end.
"""

from __future__ import annotations

import json
import os
import pwd
import subprocess
import sys
from pathlib import Path

import yaml

from mlxops.sandbox.kernels import link_root_cache

ROOT = Path(__file__).resolve().parents[2]


def test_local_job_runs_to_finished_and_fresh_starts_over(tmp_path):
    home = tmp_path / "home"
    node_root = tmp_path / "node root"       # a space: every path must stay quoted
    inventory = tmp_path / "local.yml"
    inventory.write_text(yaml.safe_dump({"all": {"hosts": {"localhost": {
        "ansible_connection": "local", "mlxops_slots": 2, "mlxops_root": str(node_root)}}}}))
    job = tmp_path / "job.yml"
    job.write_text(yaml.safe_dump({
        "name": "local-e2e", "inventory": str(inventory), "backend": "ring",
        "trainer": {"model": {"dims": 32, "layers": 1, "heads": 2, "seq_len": 32},
                    "train": {"steps": 12, "global_batch": 4, "micro_batch": 2,
                              "checkpoint_every": 6, "log_every": 1}},
        "restart": {"max_restarts": 0, "stall_timeout": 120}}))
    env = {**os.environ, "MLXOPS_HOME": str(home)}
    if os.geteuid() == 0:
        # The kernels this user's ranks compiled before (one cache per user, as the sandbox
        # keeps it): a cold cache makes the first step a minute of g++ on a busy machine.
        link_root_cache(node_root, pwd.getpwuid(0))

    def mlxops(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "mlxops", *args], capture_output=True,
                              text=True, env=env, cwd=ROOT, timeout=300, stdin=subprocess.DEVNULL)

    first = mlxops("launch", str(job))
    assert first.returncode == 0, first.stderr[-2000:]
    assert "finished" in first.stdout and "mlxops logs local-e2e" in first.stdout

    status = json.loads(mlxops("status", "local-e2e", "--json").stdout)
    assert status["state"] == "finished"
    assert [(r["rank"], r["step"]) for r in status["ranks"]] == [(0, 12), (1, 12)]

    again = mlxops("launch", str(job), "--detach")
    assert again.returncode == 1 and "mlxops resume local-e2e" in again.stderr
    assert len(again.stderr.strip().splitlines()) == 1

    fresh = mlxops("launch", "--fresh", str(job))
    assert fresh.returncode == 0, fresh.stderr[-2000:]
    metrics = node_root / "runs" / "local-e2e" / "metrics.jsonl"
    assert [json.loads(line)["step"] for line in metrics.read_text().splitlines()] == \
        list(range(1, 13))

    logs = mlxops("logs", "local-e2e", "--rank", "0")
    assert logs.returncode == 0 and "[localhost r0]" in logs.stdout

"""``mlxops bench`` on inventory/local.yml through the real CLI: no SSH, no root needed.

One host, three slots: the loopback run and a real all-reduce and all_gather sweep over
three ranks started as a job, and nothing of it left behind (no rank, no server, no run
directory, no record).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]


def test_local_bench_measures_loopback_and_all_reduces_then_leaves_nothing(tmp_path):
    node_root = tmp_path / "node root"       # a space: every path must stay quoted
    inventory = tmp_path / "local.yml"
    inventory.write_text(yaml.safe_dump({"all": {"hosts": {"localhost": {
        "ansible_connection": "local", "mlxops_slots": 3, "mlxops_root": str(node_root)}}}}))
    env = {**os.environ, "MLXOPS_HOME": str(tmp_path / "home")}
    proc = subprocess.run(
        [sys.executable, "-m", "mlxops", "bench", str(inventory), "--json", "--seconds", "0.3",
         "--omit", "0.1", "--sizes", "4K,1M", "--port", "24510"],
        capture_output=True, text=True, env=env, cwd=ROOT, timeout=300,
        stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr[-2000:]
    doc = json.loads(proc.stdout)
    assert doc["pairs"] == [] and doc["ring"] is None
    (loop,) = doc["loopback"]
    assert loop["host"] == "localhost" and loop["bandwidth_gbps"] > 0
    assert [r["bytes"] for r in doc["allreduce"]] == [4096, 1 << 20]
    assert all(r["wrong"] == 0 and r["busbw_gbps"] > 0 for r in doc["allreduce"])
    assert doc["allreduce_info"]["ranks"] == 3 and doc["allreduce_info"]["fit"]
    # the all_gather beside it (what 'mlxops plan' predicts a sharded step's gather from):
    # each rank's block rounded up to a whole float per rank, its order checked
    assert [r["bytes"] for r in doc["all_gather"]] == [4104, 1048584]
    assert all(r["wrong"] == 0 and r["busbw_gbps"] > 0 for r in doc["all_gather"])
    assert doc["allreduce_info"]["all_gather_fit"]
    assert Path(doc["file"]).parent == tmp_path / "home" / "bench"
    assert json.loads(Path(doc["file"]).read_text())["allreduce"] == doc["allreduce"]
    assert not (node_root / "runs" / "mlxops-bench").exists()
    assert not (tmp_path / "home" / "jobs" / "mlxops-bench").exists()
    left = subprocess.run(["pgrep", "-af", str(node_root)], capture_output=True, text=True)
    assert not left.stdout.strip(), left.stdout

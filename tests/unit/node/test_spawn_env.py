"""A rank that ``spawn`` starts does not inherit the helper's own settings: the controller
runs every helper with ``PYTHONDONTWRITEBYTECODE=1`` (no bytecode beside the synced code),
and a rank that inherited it compiled the trainer's modules from source at every start.
The real ``spawn`` runs a real rank script here; the script writes what it was given."""

from __future__ import annotations

import os
import time
from pathlib import Path

from mlxops.node import protocol
from mlxops.node.spawn import spawn


def test_a_spawned_rank_writes_bytecode_unless_its_job_says_not_to(tmp_path: Path,
                                                                     monkeypatch):
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")   # as nodecmd runs the helper
    monkeypatch.setenv("MLXOPS_TEST_KEPT", "kept")
    seen = {}
    for rank, job_env in ((0, ""), (1, "export PYTHONDONTWRITEBYTECODE='1'\n")):
        out = tmp_path / f"env-{rank}.txt"
        script = tmp_path / protocol.process_file(rank, protocol.SCRIPT)
        script.write_text(f"{job_env}env > {out}\n")
        spawn(tmp_path, rank)
        deadline = time.monotonic() + 10
        while not out.is_file() or not out.read_text().endswith("\n"):
            assert time.monotonic() < deadline
            time.sleep(0.02)
        time.sleep(0.1)
        seen[rank] = dict(line.split("=", 1) for line in out.read_text().splitlines()
                          if "=" in line)
    assert "PYTHONDONTWRITEBYTECODE" not in seen[0]
    assert seen[0]["MLXOPS_TEST_KEPT"] == "kept"      # the rest of the helper's is kept
    assert seen[1]["PYTHONDONTWRITEBYTECODE"] == "1"   # the job's own env: its choice
    assert os.environ["PYTHONDONTWRITEBYTECODE"] == "1"  # the helper's own unchanged

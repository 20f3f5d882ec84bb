"""Helpers to run the trainer as real processes: one process, or local ring ranks
(started as mlx.launch starts them, without its launcher: mlxops/devtools/local_ranks.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from mlxops.devtools.local_ranks import run_ranks
from mlxops.node import protocol
from mlxops.node.protocol.metrics import MetricsLine, read_line
from mlxops.sandbox import nospin

PY = sys.executable
ROOT = Path(__file__).resolve().parents[2]

TINY = {
    "model": {"dims": 32, "layers": 2, "heads": 2, "vocab_size": 256, "seq_len": 32},
    "data": {"source": "synthetic", "seed": 1},
    "train": {"steps": 40, "global_batch": 8, "micro_batch": 2, "lr": 3e-3, "warmup": 5,
              "checkpoint_every": 10, "keep": 3, "log_every": 1},
}


def write_config(tmp: Path, out: Path, **sections: dict) -> Path:
    cfg = json.loads(json.dumps(TINY))
    for name, values in sections.items():
        cfg[name].update(values)
    cfg["out"] = str(out)
    path = tmp / f"trainer-{out.name}.json"
    path.write_text(json.dumps(cfg))
    return path


def trainer_cmd(config: Path, *args: str) -> list[str]:
    return [PY, "-m", "mlxops.trainer", "--config", str(config), *args]


def run_trainer(config: Path, *args: str, ranks: int = 1, env: dict | None = None,
                timeout: float = 120) -> subprocess.CompletedProcess:
    """Run to completion; ``ranks > 1`` runs that many ring ranks on localhost."""
    return run_script(trainer_cmd(config, *args), ranks, env, timeout)


def run_script(cmd: list[str], ranks: int = 1, env: dict | None = None,
               timeout: float = 120) -> subprocess.CompletedProcess:
    full_env = {**os.environ, **(env or {})}
    full_env["PYTHONPATH"] = str(ROOT)
    if ranks > 1:
        # Ranks that share the suite's cores wait for a late peer, as on sandbox nodes.
        return run_ranks(cmd, ranks, env=full_env, cwd=ROOT, timeout=timeout,
                         preload=nospin.library())
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=full_env,
                          cwd=ROOT, stdin=subprocess.DEVNULL)


def metrics(out: Path) -> list[MetricsLine]:
    """Rank 0's ``metrics.jsonl`` under ``out``, read by the protocol's reader; every line
    must be a record (a test's run has no torn line) and no step logged twice."""
    lines = (out / protocol.METRICS).read_text().splitlines()
    recs = [read_line(line) for line in lines]
    assert None not in recs, f"an unreadable metrics line: {lines[recs.index(None)]!r}"
    steps = [r.step for r in recs]
    assert len(steps) == len(set(steps)), "a step was logged twice"
    return recs


def losses(out: Path) -> dict[int, float]:
    return {r.step: r.loss for r in metrics(out)}


def ok(proc: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return proc

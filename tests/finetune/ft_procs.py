"""Helpers to run ``python -m mlxops.finetune`` as real processes: one, or local ring ranks
(started as mlx.launch starts them, without its launcher: mlxops/devtools/local_ranks.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from mlxops.devtools.local_ranks import run_ranks
from mlxops.node import protocol
from mlxops.node.protocol.metrics import read_line
from mlxops.sandbox import nospin

PY = sys.executable
ROOT = Path(__file__).resolve().parents[2]

#: A LoRA (with dropout) on every block of the tiny llama, 8 steps of 4 chat examples, a
#: validation and a checkpoint every 4 steps, every step logged. At lr 1e-3 training is
#: stable: another split of the batch (only another order of summation) stays within 3e-7
#: of the loss over 12 steps; at 2e-3 the same 1-ulp start grew to 4e-3 by step 12
#: (docs/finetune.md, "How it trains, and how it is tested").
TINY = {
    "method": {"type": "lora", "rank": 4, "num_layers": -1, "dropout": 0.1},
    "data": {"mask_prompt": True},
    "train": {"lr": 1e-3, "steps": 8, "global_batch": 4, "max_seq_len": 64, "eval_every": 4,
              "eval_batches": 1, "checkpoint_every": 4, "keep": 2, "log_every": 1},
}


def write_config(tmp: Path, out: Path, model_dir: Path, data_dir: Path, /,
                 **sections: dict) -> Path:
    cfg = json.loads(json.dumps(TINY))
    cfg["model"], cfg["data"]["path"] = {"path": str(model_dir)}, str(data_dir)
    for name, values in sections.items():
        cfg.setdefault(name, {}).update(values)
    cfg["out"] = str(out)
    path = tmp / f"finetune-{out.name}.json"
    path.write_text(json.dumps(cfg))
    return path


def finetune_cmd(config: Path, *args: str) -> list[str]:
    return [PY, "-m", "mlxops.finetune", "--config", str(config), *args]


def env_with(extra: dict | None = None) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), **(extra or {})}


def run_finetune(config: Path, *args: str, ranks: int = 1, env: dict | None = None,
                 timeout: float = 300) -> subprocess.CompletedProcess:
    """Run to completion; ``ranks > 1`` runs that many ring ranks on localhost."""
    cmd = finetune_cmd(config, *args)
    if ranks > 1:
        return run_ranks(cmd, ranks, env=env_with(env), cwd=ROOT, timeout=timeout,
                         preload=nospin.library())
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                          env=env_with(env), cwd=ROOT, stdin=subprocess.DEVNULL)


def curve(out: Path) -> dict[int, tuple[float, float | None]]:
    """Step -> (training loss, validation loss or None), from metrics.jsonl."""
    lines = (out / protocol.METRICS).read_text().splitlines()
    recs = [read_line(line) for line in lines]  # the protocol's reader, as the monitor's
    assert None not in recs, f"an unreadable metrics line: {lines[recs.index(None)]!r}"
    steps = [r.step for r in recs]
    assert len(steps) == len(set(steps)), "a step was logged twice"
    return {r.step: (r.loss, r.val_loss) for r in recs}


def ok(proc: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc

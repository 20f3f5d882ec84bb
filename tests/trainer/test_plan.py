"""The memory plan against the trainer's own measured peak, and the choices it makes.

The grid runs the bundled trainer for real (a few steps each, a checkpoint and, at 2 ranks,
a consistency check among them) and compares what it logs: ``planned_memory``, the plan of
mlxops/trainer/plan.py for the micro-batch it runs, and ``peak_memory``, MLX's allocator's
peak. Each config leans on one term of the plan. The larger grid is
``benchmarks/memory.py``.
"""

from __future__ import annotations

import json
import sys

import pytest
from trainer_procs import ok, run_trainer

from mlxops.devtools.local_ranks import openblas_env
from mlxops.node.blas import find_openblas
from mlxops.trainer.config import load_config
from mlxops.trainer.model import Transformer, count_params
from mlxops.trainer.plan import CPU_FRACTION, budget_bytes, estimate, plan_memory
from mlxops.trainer.plan import count_params as planned_params

GB = 1024**3
#: Within 15% of the measured peak and never more than 10% below it.
ABOVE, BELOW = 0.15, 0.10
OPENBLAS = find_openblas() if sys.platform.startswith("linux") else None


def config(dims: int, layers: int, heads: int, seq_len: int, vocab_size: int, micro: int, *,
           accumulation: int = 1, world: int = 1, **train: object) -> dict:
    return {"model": {"dims": dims, "layers": layers, "heads": heads, "seq_len": seq_len,
                      "vocab_size": vocab_size},
            "data": {"source": "synthetic", "seed": 1},
            "train": {"steps": 3, "log_every": 1, "checkpoint_every": 2, "keep": 1,
                      "consistency_every": 2, "micro_batch": micro,
                      "global_batch": micro * accumulation * world, **train}}


GRID = {
    "activations": (config(128, 2, 4, 128, 256, 8), 1),
    "update": (config(256, 1, 2, 32, 256, 1), 1),
    "logits": (config(64, 2, 2, 64, 4096, 4), 1),
    "attention scores": (config(64, 1, 8, 256, 256, 2), 1),
    "accumulation": (config(128, 2, 4, 64, 256, 4, accumulation=2), 1),
    "bfloat16": (config(128, 2, 4, 128, 256, 4, dtype="bfloat16"), 1),
    "checkpointing": (config(128, 4, 4, 64, 256, 8, grad_checkpoint=True), 1),
    "2 ranks": (config(128, 2, 4, 64, 256, 4, world=2), 2),
    "2 ranks, bfloat16 wire": (config(256, 1, 4, 32, 256, 2, world=2,
                                      grad_reduce_dtype="bfloat16"), 2),
}


@pytest.mark.parametrize("name", GRID)
def test_the_plan_holds_the_measured_peak(tmp_path, name):
    cfg, world = GRID[name]
    path = tmp_path / "trainer.json"
    path.write_text(json.dumps({**cfg, "out": str(tmp_path / "out")}))
    # OpenBLAS is faster; MLX's allocator counts the same either way.
    env = openblas_env(OPENBLAS, world) if OPENBLAS else None
    ok(run_trainer(path, ranks=world, env=env))
    last = json.loads((tmp_path / "out" / "metrics.jsonl").read_text().splitlines()[-1])
    planned, peak = last["planned_memory"], last["peak_memory"]
    parsed = load_config(cfg)
    assert planned == estimate(parsed, cfg["train"]["micro_batch"],
                               cfg["train"]["global_batch"] // cfg["train"]["micro_batch"]
                               // world, world).total
    assert (1 - BELOW) * peak <= planned <= (1 + ABOVE) * peak, (
        f"{name}: planned {planned / 1e6:.1f} MB, measured peak {peak / 1e6:.1f} MB "
        f"({planned / peak:.3f})")


def test_param_count_matches_model():
    for tie in (True, False):
        cfg = load_config({"model": {"dims": 64, "layers": 3, "heads": 4,
                                     "tie_embeddings": tie}})
        assert planned_params(cfg) == count_params(Transformer(cfg.model))


BIG = {"model": {"dims": 2048, "layers": 24, "heads": 16, "seq_len": 2048},
       "train": {"global_batch": 64, "micro_batch": 16}}


def test_the_largest_micro_batch_that_fits_is_chosen():
    cfg = load_config(BIG)
    peaks = {m: estimate(cfg, m, 16 // m, 4).total for m in (16, 8, 4, 2, 1)}
    assert peaks[16] > peaks[8] > peaks[4] > peaks[2] > peaks[1]
    budget = (peaks[4] + peaks[8]) // 2  # room for 4 sequences at once, not for 8
    plan = plan_memory(BIG, int(budget / CPU_FRACTION) + 1, 4)
    assert (plan.micro_batch, plan.accumulation, plan.grad_checkpoint) == (4, 4, False)
    assert plan.fits and plan.total_bytes == peaks[4] <= plan.budget_bytes


def test_checkpointing_when_no_micro_batch_fits_without_it():
    cfg = load_config(BIG)
    bare, ckpt = estimate(cfg, 1, 16, 4, False).total, estimate(cfg, 1, 16, 4, True).total
    assert ckpt < bare
    plan = plan_memory(BIG, int((bare + ckpt) / 2 / CPU_FRACTION), 4)
    assert plan.fits and plan.grad_checkpoint and plan.micro_batch >= 1
    assert not plan_memory(BIG, int(ckpt * 0.9 / CPU_FRACTION), 4).fits


def test_a_config_that_asks_for_checkpointing_keeps_it():
    asks = {**BIG, "train": {**BIG["train"], "grad_checkpoint": True}}
    assert plan_memory(asks, 512 * GB, 4).grad_checkpoint


def test_the_budget_is_the_working_set_on_a_mac_and_80_percent_of_memory_elsewhere():
    assert budget_bytes(64 * GB, None, 1) == (int(64 * GB * 0.8), "memory")
    assert budget_bytes(64 * GB, None, 4) == (int(64 * GB * 0.8) // 4, "memory")
    # mx.metal.device_info() on a Mac, recorded in ml-explore/mlx pull request #1060.
    recorded = 188743680000
    assert budget_bytes(192 * GB, recorded, 2) == (recorded // 2, "working set")
    plan = plan_memory(BIG, 192 * GB, 4, ranks_per_node=2, working_set=recorded)
    assert (plan.budget_bytes, plan.budget_from) == (recorded // 2, "working set")

"""The memory plan's sharded terms (ZeRO-1, trainer/plan.py) and the all_gather's cost
predicted from the bench (planning.py)."""

from __future__ import annotations

from trainer_procs import TINY

from mlxops.planning import all_gather_us
from mlxops.trainer import plan
from mlxops.trainer.config import load_config


def _cfg(**train) -> object:
    return load_config({**TINY, "train": {**TINY["train"], **train}})


def test_sharded_terms_divide_the_moments_and_bfloat16_master_over_the_ranks():
    cfg = _cfg(dtype="float32")
    p = plan.count_params(cfg)
    z = plan.sharded_terms(cfg, 3)
    assert (z.weights, z.master, z.optimizer, z.gathered) == (4 * p, 0, -(-8 * p // 3), 4 * p)
    assert z.saved == 12 * p - z.state
    zb = plan.sharded_terms(_cfg(dtype="bfloat16"), 4)
    assert (zb.weights, zb.master, zb.optimizer, zb.gathered) == (2 * p, p, 2 * p, 2 * p)


def test_the_peak_falls_by_at_least_the_state_saved_and_the_plan_says_sharded():
    for cfg in (_cfg(dtype="float32"), _cfg(dtype="bfloat16")):
        unsharded, sharded = plan.estimate(cfg, 2, 1, 4), plan.estimate(cfg, 2, 1, 4, shard=True)
        saved = plan.sharded_terms(cfg, 4).saved
        assert sharded.state == unsharded.state - saved
        assert sharded.compute <= unsharded.compute - saved
        assert sharded.update <= unsharded.update - saved
        mp = plan.plan_memory(cfg, 64 * 1024**3, 4, shard=True)
        assert mp.sharded and mp.optimizer_bytes == plan.sharded_terms(cfg, 4).optimizer
        assert not plan.plan_memory(cfg, 64 * 1024**3, 4).sharded


def test_a_job_that_fits_only_sharded_is_planned_to_fit_sharded():
    cfg = load_config({**TINY, "model": {**TINY["model"], "dims": 512, "layers": 8,
                                         "vocab_size": 32000},
                       "train": {**TINY["train"], "micro_batch": 1, "global_batch": 8}})
    sharded = plan.estimate(cfg, 1, 1, 8, grad_checkpoint=True, shard=True).total
    unsharded = plan.estimate(cfg, 1, 1, 8, grad_checkpoint=True).total
    memory = int((sharded + unsharded) / 2 / plan.CPU_FRACTION)  # a budget between the two
    assert not plan.plan_memory(cfg, memory, 8).fits
    assert plan.plan_memory(cfg, memory, 8, shard=True).fits


def test_the_all_gather_is_predicted_from_the_bench_at_half_the_all_reduce_bus_factor():
    info = {"fit": {"a_us": 100.0, "b_us_per_byte": 0.001}, "ranks": 2}
    # over 2 ranks an all_gather moves half the bytes a link that the all-reduce moves
    assert all_gather_us(info, 1_000_000, 2) == 100.0 + 1000 * 0.5
    assert all_gather_us(info, 1_000_000, 4) == 100.0 + 1000 * 0.75
    assert all_gather_us(info, 10, 1) == 0.0
    assert all_gather_us({"fit": None, "ranks": 2}, 10, 2) is None

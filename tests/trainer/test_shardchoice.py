"""The rule that decides ``train.shard_optimizer: auto`` (mlxops/trainer/shardchoice.py),
with peaks of the memory plan (trainer/plan.py) where the rule's docstring gives its math."""

from __future__ import annotations

from trainer_procs import TINY

from mlxops.trainer import plan
from mlxops.trainer.config import load_config
from mlxops.trainer.shardchoice import ShardChoice, choose

MB = 2**20


def test_a_run_that_fits_whole_is_not_sharded_though_sharded_is_smaller():
    assert choose(3, [100 * MB] * 3, [90 * MB] * 3, [60 * MB] * 3) == \
        ShardChoice(shard=False, fits=True, over=(), short=())


def test_one_place_over_its_budget_shards_every_rank_when_every_place_fits_sharded():
    found = choose(3, [100 * MB, 50 * MB, 100 * MB], [70 * MB] * 3, [45 * MB] * 3)
    assert found == ShardChoice(shard=True, fits=True, over=(1,), short=())


def test_fitting_neither_way_is_not_sharded_and_says_where():
    found = choose(3, [100 * MB, 40 * MB, 100 * MB], [70 * MB] * 3, [45 * MB] * 3)
    assert found == ShardChoice(shard=False, fits=False, over=(1,), short=(1,))
    # one rank has nothing to shard over
    assert choose(1, [40 * MB], [70 * MB], [45 * MB]) == \
        ShardChoice(shard=False, fits=False, over=(0,), short=(0,))


def test_the_update_peak_moves_as_the_docstring_says():
    """float32: the update's peak moves by -16 P + (16 + 4 SLICE_ARRAYS) P / n (nothing on
    2 ranks: sharding a run whose update is its peak does not make it fit there)."""
    cfg = load_config({**TINY, "model": {**TINY["model"], "dims": 256, "vocab_size": 8192},
                       "train": {**TINY["train"], "micro_batch": 1, "global_batch": 12}})
    p = plan.count_params(cfg)
    for n in (2, 3, 4):
        whole, sharded = plan.estimate(cfg, 1, 1, n), plan.estimate(cfg, 1, 1, n, shard=True)
        assert abs((sharded.update - whole.update)
                   - (-16 * p + (16 + 4 * plan.SLICE_ARRAYS) * p / n)) <= 2
        assert whole.compute - sharded.compute >= 8 * p * (n - 1) // n

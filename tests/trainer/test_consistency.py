"""train.consistency_every: ranks compare their state, and a diverged rank is repaired."""

from __future__ import annotations

import json

import mlx.core as mx
import numpy as np
import pytest
from trainer_procs import losses, ok, run_trainer, write_config

from mlxops.trainer import consistency
from mlxops.trainer.config import load_config
from mlxops.trainer.model import Transformer
from mlxops.trainer.train import make_optimizer


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """2 ranks, 20 steps: checked every 5 steps; the same with rank 1 made to drift after
    step 10; and drifting with the check off."""
    tmp = tmp_path_factory.mktemp("drift")  # not a word the log is searched for
    got = {}
    for name, every, hook in [("ref", 5, None), ("repaired", 5, "1:10"), ("off", 0, "1:10")]:
        cfg = write_config(tmp, tmp / name, train={"steps": 20, "checkpoint_every": 0,
                                                   "consistency_every": every})
        env = {"MLXOPS_TRAINER_FAKE_DIVERGE": hook} if hook else None
        proc = ok(run_trainer(cfg, ranks=2, env=env))
        recs = [json.loads(x) for x in (tmp / name / "metrics.jsonl").read_text().splitlines()]
        got[name] = (proc, losses(tmp / name), recs)
    return got


def test_a_diverged_rank_is_repaired_and_training_goes_on_as_if_nothing_happened(runs):
    proc, repaired, recs = runs["repaired"]
    _, ref, _ = runs["ref"]
    assert ("consistency: step 10: rank 1 differs from rank 0 in 1 array "
            "(model.embed.weight); rank 0's parameters and optimizer state sent to every "
            "rank (repair 1 of this run)") in proc.stdout
    # Rank 1 drifted after step 10 and was given rank 0's weights at once: every loss
    # after it is the undisturbed run's, bit for bit.
    assert repaired == ref
    assert [r["consistency_repairs"] for r in recs] == [0] * 9 + [1] * 11


def test_without_the_check_the_drift_stays(runs):
    proc, off, recs = runs["off"]
    _, ref, _ = runs["ref"]
    assert "consistency" not in proc.stdout
    assert all(off[s] == ref[s] for s in range(1, 11))
    assert all(off[s] != ref[s] for s in range(11, 21))
    assert {r["consistency_repairs"] for r in recs} == {0}


def test_equal_ranks_are_left_alone(runs):
    proc, _, recs = runs["ref"]
    assert "consistency" not in proc.stdout
    assert {r["consistency_repairs"] for r in recs} == {0}


def _state():
    cfg = load_config({"model": {"dims": 16, "layers": 1, "heads": 2},
                       "train": {"steps": 5}})
    model = Transformer(cfg.model)
    optimizer = make_optimizer(cfg)
    optimizer.init(model.trainable_parameters())
    mx.eval(model.parameters(), optimizer.state)
    return model, optimizer


def test_the_checksum_covers_every_bit_of_parameters_and_optimizer_state():
    model, optimizer = _state()
    items = consistency.state_items(model, optimizer)
    keys = [k for k, _ in items]
    assert "model.embed.weight" in keys and "optimizer.step" in keys
    assert "optimizer.blocks.0.mlp.up.weight.v" in keys
    before = np.array(consistency.checksums([a for _, a in items]))
    i = keys.index("optimizer.blocks.0.mlp.up.weight.v")
    moment = items[i][1]
    flipped = mx.view(mx.view(moment.reshape(-1), mx.uint32) ^ mx.array(1, mx.uint32),
                      mx.float32).reshape(moment.shape)  # the lowest bit of every element
    arrays = [a for _, a in items]
    arrays[i] = flipped
    after = np.array(consistency.checksums(arrays))
    assert [j for j in range(len(keys)) if before[j] != after[j]] == [i]


def test_rank_zeros_copy_arrives_bit_for_bit():
    """The repair's packing: every dtype's bits through uint32 words and back (one rank:
    the all-reduce is the identity, so what comes back is what the others would get)."""
    group = mx.distributed.init()
    arrays = [mx.array([1.5, -0.0, float("nan"), float("-inf")]),
              mx.array(7, dtype=mx.uint64),
              mx.array([[0.25, -3.0]], dtype=mx.bfloat16),
              mx.arange(3, dtype=mx.uint8)]
    back = consistency.from_rank_zero(arrays, group)
    for a, b in zip(arrays, back, strict=True):
        assert (a.dtype, a.shape) == (b.dtype, b.shape)
        assert np.array(consistency._bits(a)).tolist() == np.array(consistency._bits(b)).tolist()

"""A fine-tuning model's pipeline costs (mlxops/finetune/stageplan.py): one stage is the
fine-tuning plan, and stages hold shares of it by memory."""

from __future__ import annotations

import pytest

from mlxops.devtools.tinymodels import build_model
from mlxops.finetune import plan
from mlxops.finetune.config import load_config
from mlxops.finetune.stageplan import finetune_costs, read_ends
from mlxops.trainer import stages
from mlxops.trainer.stages import StageError


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("six")
    six = {"num_hidden_layers": 6}
    return {"plain": build_model(root / "plain", "llama", sizes=six),
            "4bit": build_model(root / "q", "llama", quantize=True, sizes=six)}


def cfg(path, **method):
    return load_config({"model": {"path": str(path)}, "data": {"path": "d"},
                        "method": {"num_layers": -1} | method,
                        "train": {"max_seq_len": 64}})


@pytest.mark.parametrize("model", ["plain", "4bit"])
@pytest.mark.parametrize("method", [{"type": "lora"}, {"type": "dora"}, {"type": "full"},
                                    {"type": "lora", "dropout": 0.1},
                                    {"type": "lora", "num_layers": 3},
                                    {"type": "full", "num_layers": 2}])
@pytest.mark.parametrize("ckpt", [False, True])
def test_one_stage_is_the_fine_tuning_plan(models, model, method, ckpt):
    c = cfg(models[model], **method)
    shape = plan.read_model(models[model])
    costs = finetune_costs(shape, read_ends(models[model]), c, micro=2, grad_checkpoint=ckpt)
    [only] = stages.split(costs, [1 << 40], micro=3)
    alive, compute, update = plan.estimate(shape, c, 2, 1, ckpt)
    assert only.peak == pytest.approx(max(compute, update), abs=4)


def test_the_tied_embedding_is_on_both_ends_and_counted_twice(models):
    path = models["plain"]
    ends = read_ends(path)
    assert ends.tied and ends.embed > 0 and ends.head > 0
    costs = finetune_costs(plan.read_model(path), ends, cfg(path), micro=1)
    [only] = stages.split(costs, [1 << 40], micro=1)
    two = stages.split(costs, [1 << 40] * 2, micro=1)
    assert two[0].peak + two[1].peak > only.peak + ends.embed * 0.99


def test_a_model_one_small_node_cannot_hold_splits_unequally_over_three(models):
    path = models["4bit"]
    costs = finetune_costs(plan.read_model(path), read_ends(path), cfg(path), micro=2)
    whole = stages.split(costs, [1 << 40], micro=4)[0].peak
    small, big = int(whole * 0.6), int(whole * 1.2)
    with pytest.raises(StageError, match="does not fit on 1 hosts"):
        stages.split(costs, [small], micro=4)
    plans = stages.split(costs, [small, big, small], micro=4)
    assert all(p.fits for p in plans)
    counts = [p.layers for p in plans]
    assert sum(counts) == 6 and counts[1] == max(counts) and counts[1] > counts[2]


def test_blocks_below_the_trained_ones_keep_no_activation(models):
    path = models["plain"]
    costs = finetune_costs(plan.read_model(path), read_ends(path),
                           cfg(path, num_layers=2), micro=1)
    assert [p.activation > 0 for p in costs.layers] == [False] * 4 + [True] * 2
    assert [p.grads > 0 for p in costs.layers] == [False] * 4 + [True] * 2

"""The split of a model into pipeline stages by memory (mlxops/trainer/stages.py)."""

from __future__ import annotations

import itertools
import random

import pytest

from mlxops.trainer import plan, stages
from mlxops.trainer.config import load_config
from mlxops.trainer.stages import ModelCosts, Part, StageError

GIB = 1024 ** 3


def config(**model):
    return load_config({"model": {"dims": 512, "layers": 12, "heads": 8, "vocab_size": 8192,
                                  "seq_len": 256, **model},
                        "train": {"global_batch": 8, "micro_batch": 2}})


@pytest.mark.parametrize("tied", [True, False])
@pytest.mark.parametrize("extra", [{}, {"window": 64}, {"train": {"dtype": "bfloat16"}},
                                   {"train": {"grad_checkpoint": True}}])
def test_one_stage_is_the_trainer_plan_of_one_rank_accumulating(tied, extra):
    raw = {"model": {"dims": 256, "layers": 6, "heads": 4, "vocab_size": 1024,
                     "seq_len": 128, "tie_embeddings": tied, "window": extra.get("window", 0)},
           "train": {"global_batch": 8, "micro_batch": 2, **extra.get("train", {})}}
    cfg = load_config(raw)
    costs = stages.trainer_costs(cfg, micro=2, accumulation=4)
    [only] = stages.split(costs, [64 * GIB], micro=4)
    assert (only.start, only.stop) == (0, 6)
    assert only.peak == pytest.approx(plan.estimate(cfg, 2, 4, 1).total, rel=1e-9, abs=2)


def test_equal_hosts_give_the_first_stage_fewer_layers_it_holds_more_micro_batches():
    costs = stages.trainer_costs(config(tie_embeddings=False), micro=2, accumulation=4)
    plans = stages.split(costs, [4 * GIB] * 3, micro=4)
    counts = [p.layers for p in plans]
    assert sum(counts) == 12 and counts[0] < counts[1]
    assert [p.in_flight for p in plans] == [3, 2, 1]
    assert all(p.fits for p in plans)


def test_unequal_hosts_get_layers_in_proportion_to_their_budget():
    costs = stages.trainer_costs(config(), micro=2, accumulation=4)
    big, small = 6 * GIB, 2 * GIB
    plans = stages.split(costs, [small, big, small], micro=4)
    counts = [p.layers for p in plans]
    assert counts[1] > counts[0] + counts[2]
    utils = [p.peak / p.budget for p in plans]
    assert max(utils) - min(utils) < 0.35       # near-equal shares of each budget
    # The same hosts in another ring order: the big one still takes the most.
    counts = [p.layers for p in stages.split(costs, [big, small, small], micro=4)]
    assert counts[0] == max(counts)


def test_a_model_one_host_cannot_hold_is_split_over_three_and_refused_on_one():
    costs = stages.trainer_costs(config(), micro=2, accumulation=4)
    whole = stages.split(costs, [64 * GIB], micro=4)[0].peak
    budget = int(whole * 0.6)
    with pytest.raises(StageError, match=r"does not fit on 1 hosts.*layers 0-11 .* GiB"):
        stages.split(costs, [budget], micro=4)
    plans = stages.split(costs, [budget] * 3, micro=4)
    assert all(p.fits for p in plans) and sum(p.layers for p in plans) == 12


def test_refused_with_each_hosts_numbers_when_even_the_best_split_does_not_fit():
    costs = stages.trainer_costs(config(), micro=2, accumulation=4)
    with pytest.raises(StageError) as err:
        stages.split(costs, [GIB // 8] * 3, micro=4, hosts=["m1", "m2", "m3"])
    msg = str(err.value)
    assert "m1: layers 0-" in msg and "m3: layers" in msg and "of 0.12 GiB" in msg
    assert "\n" not in msg


def test_an_explicit_split_overrides_and_is_refused_when_a_stage_does_not_fit():
    costs = stages.trainer_costs(config(), micro=2, accumulation=4)
    plans = stages.split(costs, [8 * GIB] * 3, micro=4, explicit=[2, 5, 5])
    assert [(p.start, p.stop) for p in plans] == [(0, 2), (2, 7), (7, 12)]
    tight = stages.split(costs, [8 * GIB] * 3, micro=4)[2].peak
    with pytest.raises(StageError, match=r"the split \[1, 1, 10\] does not fit: stage 0"):
        stages.split(costs, [tight] * 3, micro=4, explicit=[1, 1, 10])
    with pytest.raises(StageError, match=r"12 in all"):
        stages.split(costs, [8 * GIB] * 3, micro=4, explicit=[2, 5, 4])
    with pytest.raises(StageError, match="one layer"):
        stages.split(costs, [8 * GIB] * 3, micro=4, explicit=[0, 6, 6])


def test_speed_decides_between_splits_memory_leaves_equal():
    # 20 equal layers; the embedding makes 10/10 and 9/11 equal within TIE for memory.
    costs = ModelCosts(layers=(Part(alive=1, work=1),) * 20, embed=Part(alive=1),
                       head=Part(), transient=0, loss=0)
    assert [p.layers for p in stages.split(costs, [100, 100], micro=1)] == [10, 10]
    assert [p.layers for p in stages.split(costs, [100, 100], micro=1,
                                           speeds=[1.0, 2.0])] == [9, 11]
    # ... but never past the tie: a host 10x faster does not take what memory forbids.
    assert [p.layers for p in stages.split(costs, [100, 100], micro=1,
                                           speeds=[1.0, 10.0])] == [9, 11]


def test_fewer_layers_than_hosts_is_refused():
    costs = stages.trainer_costs(config(layers=2), micro=2, accumulation=4)
    with pytest.raises(StageError, match="2 layers cannot make 3 stages"):
        stages.split(costs, [8 * GIB] * 3, micro=4)


def brute(costs, budgets, micro, speeds):
    L, S = len(costs.layers), len(budgets)
    splits = []
    for cuts in itertools.combinations(range(1, L), S - 1):
        counts = [b - a for a, b in zip((0, *cuts), (*cuts, L), strict=True)]
        plans = stages.plan_split(costs, counts, budgets, micro)
        splits.append((counts, max(p.peak / p.budget for p in plans),
                       max(p.work / v for p, v in zip(plans, speeds, strict=True))))
    least = min(u for _, u, _ in splits)
    allowed = [(t, [-c for c in counts]) for counts, u, t in splits
               if all(p.peak <= (1 + stages.TIE) * least * p.budget
                      for p in stages.plan_split(costs, counts, budgets, micro))]
    return least, [-c for c in min(allowed)[1]]


def test_the_split_is_the_best_of_every_split_on_random_models():
    rng = random.Random(7)
    for _ in range(200):
        L, S = rng.randint(2, 9), rng.randint(1, 4)
        if L < S:
            continue
        layers = tuple(Part(alive=rng.randint(1, 50), grads=rng.randint(0, 20),
                            update=rng.randint(0, 60), activation=rng.randint(0, 30),
                            work=rng.randint(1, 9)) for _ in range(L))
        costs = ModelCosts(layers, Part(alive=rng.randint(0, 40)),
                           Part(alive=rng.randint(0, 40)), rng.randint(0, 30),
                           rng.randint(0, 50))
        budgets = [rng.randint(200, 900) for _ in range(S)]
        speeds = [rng.choice([1.0, 1.5, 3.0]) for _ in range(S)]
        micro = rng.randint(1, 5)
        least, counts = brute(costs, budgets, micro, speeds)
        if least > 1:
            with pytest.raises(StageError):
                stages.split(costs, budgets, micro, speeds)
            continue
        got = stages.split(costs, budgets, micro, speeds)
        assert [p.layers for p in got] == counts


def test_the_predicted_step_is_the_schedule_of_each_stages_share_at_its_hosts_speed():
    costs = ModelCosts(layers=(Part(alive=1, work=1),) * 6, embed=Part(), head=Part(),
                       transient=0, loss=0)
    plans = stages.split(costs, [100] * 3, micro=4, explicit=[2, 2, 2])
    # Each stage a third of the model; 4 sequences a micro-batch at 12 sequences/s:
    # 1/9 s a micro-batch a stage; 3 x 1/9 + 3 x 1/9 = 2/3 s; 4/9 of it computing.
    seconds, bubble = stages.predicted_step(plans, 4, 4, [12.0] * 3)
    assert seconds == pytest.approx(2 / 3)
    assert bubble == pytest.approx(1 - (4 / 9) / (2 / 3)) == pytest.approx(2 / 6)
    # A host twice as fast does its stage in half the time: the others set the pace.
    slow, _ = stages.predicted_step(plans, 4, 4, [12.0, 24.0, 12.0], link_seconds=0.01)
    assert slow == pytest.approx(1 / 9 + 1 / 18 + 1 / 9 + 3 / 9 + 4 * 0.01)

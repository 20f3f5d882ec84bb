"""trainer/validation.py as data: evaluations in, best / stop / alert out."""

from __future__ import annotations

import json
import math

import pytest

from mlxops.monitor import alerts
from mlxops.trainer.validation import (
    Validation,
    ValidationState,
    Verdict,
    overfitting,
    perplexity,
)


def run(losses: list[float], patience: int, min_delta: float = 0.0,
        state: ValidationState | None = None, every: int = 10) -> list[Verdict]:
    v = Validation(patience, min_delta, state)
    return [v.observe((i + 1) * every, loss) for i, loss in enumerate(losses)]


def test_the_first_evaluation_is_a_best():
    v = Validation(patience=2)
    assert v.observe(10, 5.0) == Verdict(improved=True, stop=False)
    assert v.state == ValidationState(best_loss=5.0, best_step=10, stale=0, evaluations=1)


def test_patience_counts_evaluations_without_a_new_best():
    verdicts = run([5.0, 4.0, 4.5, 4.2, 3.9, 4.0, 4.1], patience=2)
    assert [v.improved for v in verdicts] == [True, True, False, False, True, False, False]
    assert [v.stop for v in verdicts] == [False, False, False, True, False, False, True]


def test_patience_zero_never_stops():
    assert not any(v.stop for v in run([1.0, 2.0, 3.0, 4.0, 5.0], patience=0))


def test_an_equal_loss_is_no_best_and_min_delta_asks_for_more():
    assert [v.improved for v in run([4.0, 4.0], 0)] == [True, False]
    assert [v.improved for v in run([4.0, 3.95, 3.8], 0, min_delta=0.1)] == [True, False, True]


def test_the_state_survives_a_checkpoint_and_a_resume_ends_again():
    v = Validation(patience=2)
    for step, loss in [(10, 3.0), (20, 3.1), (30, 3.2)]:
        verdict = v.observe(step, loss)
    assert verdict.stop
    saved = json.loads(json.dumps(v.state.to_dict()))   # state.json's round trip
    again = Validation(patience=2, state=ValidationState.from_dict(saved))
    assert again.exhausted and again.state.best_step == 10
    longer = Validation(patience=4, state=ValidationState.from_dict(saved))
    assert not longer.exhausted
    assert longer.observe(40, 3.3) == Verdict(improved=False, stop=False)
    assert longer.observe(50, 2.9) == Verdict(improved=True, stop=False)


def test_perplexity_is_exp_and_does_not_overflow():
    assert perplexity(0.0) == 1.0
    assert perplexity(math.log(50.0)) == pytest.approx(50.0)
    assert math.isfinite(perplexity(1e6))


def test_negative_patience_is_refused():
    with pytest.raises(ValueError):
        Validation(patience=-1)


# The alert: training losses every 5 steps falling steadily, validation every 20 steps.
TRAIN = [(s, 5.0 - s / 100) for s in range(5, 205, 5)]


def test_validation_rising_while_training_falls_fires():
    evals = [(20, 4.0), (40, 3.6), (60, 3.5), (80, 3.7)]
    found = overfitting(evals, TRAIN, rise=0.02)
    assert found is not None
    assert (found.best_step, found.val_best, found.val_now) == (60, 3.5, 3.7)
    assert found.train_now < found.train_then
    assert "validation loss 3.7000, up from 3.5000 at step 60" in found.message()


def test_a_small_rise_or_a_falling_validation_is_no_alert():
    assert overfitting([(20, 4.0), (40, 3.5), (60, 3.55)], TRAIN, rise=0.02) is None
    assert overfitting([(20, 4.0), (40, 3.6), (60, 3.5)], TRAIN, rise=0.02) is None
    assert overfitting([(20, 4.0)], TRAIN, rise=0.02) is None
    assert overfitting([(20, 3.0), (40, 4.0)], TRAIN, rise=0.0) is None   # off


def test_both_rising_is_divergence_not_overfitting():
    rising = [(s, 3.0 + s / 100) for s in range(5, 105, 5)]
    assert overfitting([(20, 3.5), (40, 3.6), (60, 4.0)], rising, rise=0.02) is None


def test_the_monitor_reads_the_rule_from_the_metrics_columns():
    steps = [s for s, _ in TRAIN]
    val = {20: 4.0, 40: 3.6, 60: 3.5, 80: 3.8}
    cols = {"step": steps, "loss": [loss for _, loss in TRAIN],
            "val_loss": [val.get(s) for s in steps]}
    sample = {"state": "running", "ranks": [], "nodes": {}}
    limits = alerts.thresholds(None)
    found = alerts.evaluate(limits, sample, [], cols)
    assert [a["kind"] for a in found] == ["val_loss_rise"]
    assert "(alert at +2%)" in found[0]["message"]
    assert alerts.evaluate({**limits, "val_loss_rise": 0.0}, sample, [], cols) == []
    assert alerts.evaluate(limits, {**sample, "state": "finished"}, [], cols) == []

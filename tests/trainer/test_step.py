"""The compiled step: its collectives across real ranks, and one host wait per step."""

from __future__ import annotations

import json

import mlx.core as mx
import numpy as np
import pytest
from trainer_procs import PY, ROOT, TINY, run_script

from mlxops.trainer import train
from mlxops.trainer.config import load_config


@pytest.fixture(scope="module")
def reduced(tmp_path_factory):
    out = tmp_path_factory.mktemp("collectives")
    script = ROOT / "tests" / "trainer" / "collectives_rank.py"
    proc = run_script([PY, str(script), str(out)], ranks=3)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return [dict(np.load(out / f"rank-{r}.npz")) for r in range(3)]


def _keys(got: dict, prefix: str) -> list[str]:
    return sorted(k.split("/", 1)[1] for k in got if k.startswith(prefix + "/"))


def test_float32_mean_is_average_gradients(reduced):
    # Up to summation order: the ring sums each slice of a buffer starting at another
    # rank, and the slices move with the buffer's length (the stats ride along).
    for got in reduced:
        for variant in ("fp32", "fp32-groups"):
            assert _keys(got, variant) == _keys(got, "average_gradients") + ["stats"]
            for k in _keys(got, "average_gradients"):
                np.testing.assert_allclose(got[f"{variant}/{k}"], got[f"average_gradients/{k}"],
                                           rtol=1e-6, atol=1e-7, err_msg=k)
            assert np.allclose(got[f"{variant}/stats"], [2.5, 1.0])  # mean of 1.5, 2.5, 3.5


def test_every_rank_gets_the_same_mean(reduced):
    for k in reduced[0]:
        if not k.startswith("local/"):
            assert all(np.array_equal(r[k], reduced[0][k]) for r in reduced), k


def test_bfloat16_wire_is_within_its_precision_and_comes_back_float32(reduced):
    got = reduced[0]
    exact = {k: sum(r[f"local/{k}"].astype(np.float64) for r in reduced) / 3
             for k in _keys(got, "local")}
    for variant in ("bf16", "bf16-groups"):
        for k, want in exact.items():
            have = got[f"{variant}/{k}"]
            assert have.dtype == np.float32
            # three bf16 roundings (each rank's value) and two of the partial sums
            scale = sum(np.abs(r[f"local/{k}"]) for r in reduced) / 3
            assert np.all(np.abs(have - want) <= 6 * 2.0**-8 * scale + 1e-6), (variant, k)
            assert not np.array_equal(have, got[f"fp32/{k}"]), "bf16 changed nothing"
        # the stats stay float32 whatever the wire
        assert got[f"{variant}/stats"].tolist() == got["fp32/stats"].tolist()


def run_counting_waits(tmp_path, monkeypatch, **train_keys) -> tuple[train.Trainer, list]:
    """Train TINY with ``train_keys``; the step number at each mx.eval (a host wait)."""
    cfg = json.loads(json.dumps(TINY))
    cfg["train"].update({"log_every": 3, "checkpoint_every": 0, **train_keys})
    cfg["out"] = str(tmp_path / "out")
    trainer = train.Trainer(load_config(cfg), resume=False)
    calls = []
    real = mx.eval
    monkeypatch.setattr(mx, "eval", lambda *a: (calls.append(trainer.step), real(*a))[1])
    trainer.run()
    return trainer, calls


def test_a_fused_step_waits_on_the_host_once(tmp_path, monkeypatch):
    """Accumulation 1: one mx.eval a step; a logged step splits its wait in two."""
    trainer, calls = run_counting_waits(tmp_path, monkeypatch, steps=6, micro_batch=8)
    assert trainer.accum == 1
    per_step = [calls.count(s) for s in range(6)]  # trainer.step is the steps done before
    assert per_step == [1, 1, 2, 1, 1, 2], per_step
    recs = [json.loads(x) for x in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    for r in recs:
        assert 0 < r["compute_time"] < r["step_time"] and r["comm_time"] > 0
        assert abs(r["compute_time"] + r["comm_time"] - r["step_time"]) < 1e-9


def test_accumulation_waits_once_per_micro_batch_and_once_to_update(tmp_path, monkeypatch):
    trainer, calls = run_counting_waits(tmp_path, monkeypatch, steps=3, micro_batch=2)
    assert trainer.accum == 4
    assert [calls.count(s) for s in range(3)] == [5, 5, 5]

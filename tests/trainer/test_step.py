"""The compiled step: its collectives across real ranks, and one host wait per step."""

from __future__ import annotations

import json
from types import SimpleNamespace

import mlx.core as mx
import numpy as np
import pytest
from mlx.utils import tree_flatten
from trainer_procs import PY, ROOT, TINY, run_script

from mlxops.trainer import loop, step, train
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


def run_counting_waits(tmp_path, monkeypatch, **train_keys) -> tuple[loop.Loop, list]:
    """Train TINY with ``train_keys``; the step number at each mx.eval (a host wait)."""
    cfg = json.loads(json.dumps(TINY))
    cfg["train"].update({"log_every": 3, "checkpoint_every": 0, **train_keys})
    cfg["out"] = str(tmp_path / "out")
    trainer = train.trainer_loop(load_config(cfg), resume=False)
    calls = []
    real = mx.eval
    monkeypatch.setattr(mx, "eval", lambda *a: (calls.append(trainer.step), real(*a))[1])
    trainer.run()
    return trainer, calls


def test_a_fused_step_waits_on_the_host_once(tmp_path, monkeypatch):
    """Accumulation 1: one mx.eval a step; a logged step splits its wait in two."""
    trainer, calls = run_counting_waits(tmp_path, monkeypatch, steps=6, micro_batch=8)
    assert trainer.workload.accum == 1
    per_step = [calls.count(s) for s in range(6)]  # trainer.step is the steps done before
    assert per_step == [1, 1, 2, 1, 1, 2], per_step
    recs = [json.loads(x) for x in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    for r in recs:
        assert 0 < r["compute_time"] < r["step_time"] and r["comm_time"] > 0
        assert abs(r["compute_time"] + r["comm_time"] - r["step_time"]) < 1e-9


def test_accumulation_waits_once_per_micro_batch_and_once_to_update(tmp_path, monkeypatch):
    trainer, calls = run_counting_waits(tmp_path, monkeypatch, steps=3, micro_batch=2)
    assert trainer.workload.accum == 4
    assert [calls.count(s) for s in range(3)] == [5, 5, 5]


def test_every_all_reduced_gradient_buffer_is_padded_to_aligned_segments(monkeypatch):
    """MLX's ring runs slower on segments cut at unaligned addresses (step.ALIGN_ELEMENTS):
    every gradient buffer is a whole number of aligned segments, the padding dropped."""
    sizes: list[int] = []

    def all_sum(x, group=None, stream=None):  # two ranks that hold the same values
        sizes.append(x.size)
        return x * 2

    monkeypatch.setattr(mx.distributed, "all_sum", all_sum)
    two = SimpleNamespace(size=lambda: 2)
    grads = {"a": mx.arange(231, dtype=mx.float32).reshape(33, 7),
             "b": [mx.ones((5,)), {"c": mx.full((4, 4, 3), 3.0)}]}
    stats = mx.array([1.5, 1.0, 0.0])
    align, whole = step.ALIGN_ELEMENTS * 2, step.GROUP_BYTES
    for group_bytes, wire in ((whole, mx.float32), (64, mx.float32),
                              (whole, mx.bfloat16), (64, mx.bfloat16)):
        sizes.clear()
        monkeypatch.setattr(step, "GROUP_BYTES", group_bytes)
        mean, s = step.mean_over_ranks(grads, stats, two, wire)
        gradient_buffers = sizes if wire == mx.float32 else sizes[:-1]  # + the stats' own
        assert (len(gradient_buffers) == 1) == (group_bytes == whole), sizes
        assert all(n % align == 0 for n in gradient_buffers), sizes
        for (k, want), (_, got) in zip(tree_flatten(grads), tree_flatten(mean), strict=True):
            assert got.shape == want.shape and got.dtype == mx.float32, k
            assert mx.array_equal(got, want), k
        assert s.tolist() == [1.5, 1.0, 0.0]


def test_the_heartbeat_is_rewritten_at_most_every_half_second(tmp_path, monkeypatch):
    """After the first step, then at most every protocol.HEARTBEAT_EVERY, and at the end."""
    cfg = json.loads(json.dumps(TINY))
    cfg["train"].update({"steps": 12, "checkpoint_every": 0, "micro_batch": 8})
    cfg["out"] = str(tmp_path / "out")
    trainer = train.trainer_loop(load_config(cfg), resume=False)
    ticks = iter(range(100))
    trainer._clock = lambda: next(ticks) * 0.2  # each heartbeat chance is 0.2 s later
    beats = []
    real = loop.write_atomic

    def write(path, text, **kw):
        # The loop's own beats: the start beat's ("starting", its thread, until the first
        # step) are tests/trainer/test_start_beat.py's.
        if path.parent.name == "progress" and json.loads(text)["state"] != "starting":
            beats.append((json.loads(text)["step"], json.loads(text)["state"]))
        return real(path, text, **kw)

    monkeypatch.setattr(loop, "write_atomic", write)
    trainer.run()
    # 0.2 s a step: steps 1, 4 (0.6 s after 1), 7, 10; then the end.
    assert beats == [(1, "running"), (4, "running"), (7, "running"), (10, "running"),
                     (12, "finished")]

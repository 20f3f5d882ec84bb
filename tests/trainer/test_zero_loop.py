"""``train.shard_optimizer`` through the run loop (``python -m mlxops.trainer`` as local
ring ranks): a sharded run is bitwise the unsharded one, with a stop and resume between,
writes each rank's slice into its checkpoints, and continues on another number of ranks
within float tolerance."""

from __future__ import annotations

import shutil

import mlx.core as mx
import numpy as np
import pytest
from trainer_procs import TINY, losses, ok, run_trainer, write_config

from mlxops.trainer import plan
from mlxops.trainer.config import load_config

STEPS, STOP = 12, 6
TRAIN = {"steps": STEPS, "checkpoint_every": 3, "global_batch": 12, "micro_batch": 2,
         "grad_clip": 1.0, "weight_decay": 0.1, "consistency_every": 2}


def _final(out) -> dict[str, np.ndarray]:
    latest = (out / "ckpt" / "latest").read_text().strip()
    return {k: np.array(v) for k, v in mx.load(str(out / "ckpt" / latest /
                                                   "model.safetensors")).items()}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("zero-loop")
    got = {}
    for name, ranks, shard, dtype in (("plain2", 2, False, "float32"),
                                      ("zero2", 2, True, "float32"),
                                      ("plain3bf", 3, False, "bfloat16"),
                                      ("zero3bf", 3, True, "bfloat16")):
        out = tmp / name
        train = {**TRAIN, "shard_optimizer": shard, "dtype": dtype}
        if shard:  # stopped half way, then resumed
            stopped = write_config(tmp, out, train={**train, "stop_at": STOP})
            ok(run_trainer(stopped, ranks=ranks, timeout=300))
            shutil.copytree(out, tmp / f"{name}-at-stop")
            ok(run_trainer(write_config(tmp, out, train=train), "--resume", ranks=ranks,
                           timeout=300))
        else:
            ok(run_trainer(write_config(tmp, out, train=train), ranks=ranks, timeout=300))
        got[name] = out
    # the float32 sharded run's checkpoint at the stop, resumed on 3 ranks
    out = tmp / "zero2-at-stop"
    cfg = write_config(tmp, out, train={**TRAIN, "shard_optimizer": True})
    ok(run_trainer(cfg, "--resume", ranks=3, timeout=300))
    got["zero2on3"] = out
    return got


@pytest.mark.parametrize("plain,sharded", [("plain2", "zero2"), ("plain3bf", "zero3bf")])
def test_a_sharded_run_with_a_stop_and_resume_is_bitwise_the_unsharded_one(runs, plain,
                                                                           sharded):
    assert losses(runs[sharded]) == losses(runs[plain])
    a, b = _final(runs[plain]), _final(runs[sharded])
    assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
    assert all(v.dtype == np.float32 for v in b.values())  # the float32 master weights


def test_every_rank_writes_its_slice_into_the_checkpoint(runs):
    step = runs["zero3bf"] / "ckpt" / "step-00000012"
    assert sorted(p.name for p in step.glob("zero-rank-*")) == [
        f"zero-rank-{r}.safetensors" for r in range(3)]
    assert not list((runs["zero3bf"] / "ckpt").glob(".zero-*"))  # staging cleared
    assert not list((runs["plain3bf"] / "ckpt" / "step-00000012").glob("zero-rank-*"))


def test_a_resume_on_another_number_of_ranks_continues_within_tolerance(runs):
    seen, want = losses(runs["zero2on3"]), losses(runs["plain2"])
    assert sorted(seen) == sorted(want)
    for step in range(STOP + 1, STEPS + 1):
        assert abs(seen[step] - want[step]) < 1e-4, step
    a, b = _final(runs["plain2"]), _final(runs["zero2on3"])
    assert all(np.allclose(a[k], b[k], atol=1e-4) for k in a)


def test_a_checkpoint_resumes_only_with_the_sharding_it_was_written_with(runs, tmp_path):
    out = tmp_path / "plain2"
    shutil.copytree(runs["plain2"], out)
    cfg = write_config(tmp_path, out, train={**TRAIN, "steps": STEPS + 2,
                                             "shard_optimizer": True})
    proc = run_trainer(cfg, "--resume", ranks=2, timeout=300)
    assert proc.returncode != 0
    assert ("saved with the optimizer state whole; this run shards it: set "
            "train.shard_optimizer as it was") in proc.stdout + proc.stderr


def test_auto_does_not_shard_a_run_that_fits(tmp_path):
    out = tmp_path / "auto"
    cfg = write_config(tmp_path, out, train={**TRAIN, "steps": 3, "shard_optimizer": "auto"})
    proc = ok(run_trainer(cfg, ranks=2, timeout=300))
    assert "shard_optimizer: auto" not in proc.stdout
    assert not list((out / "ckpt").glob("step-*/zero-rank-*"))


def test_auto_shards_a_hand_started_run_whose_whole_plan_exceeds_the_budget(tmp_path):
    """The ranks decide by the controller's rule (trainer/shardchoice.py), from their
    node's memory (faked between the sharded and the whole plan of 3 ranks on it)."""
    train = {**TRAIN, "steps": 2, "checkpoint_every": 0, "shard_optimizer": "auto"}
    out = tmp_path / "auto3"
    cfg = write_config(tmp_path, out, train=train)
    config = load_config({**TINY, "train": {**TINY["train"], **train}})
    whole, sharded = (plan.estimate(config, 2, 2, 3, shard=s, backend="cpu").total
                      for s in (False, True))
    assert sharded < whole
    memory = int((whole + sharded) / 2 * 3 / plan.CPU_FRACTION)   # 3 ranks share it
    proc = ok(run_trainer(cfg, ranks=3, timeout=300,
                          env={"MLXOPS_TRAINER_FAKE_MEMORY": str(memory)}))
    assert ("shard_optimizer: auto: the unsharded plan exceeds the budget of rank(s) "
            "[0, 1, 2]: the optimizer state is sharded over the ranks (ZeRO-1)") in proc.stdout
    assert len(list((out / "ckpt").glob("step-*/zero-rank-*"))) == 3

"""The bundled trainer over pipeline stages through the one run loop (train.stages):
real ring ranks on this machine (mlxops/devtools/local_ranks.py), the trainer's own
command line, its metrics and checkpoints.

Tolerance: bit for bit. Untied embeddings in float32: the 1F1B step makes every gradient
with the same kernels on the same inputs as one stage holding every layer (the step
itself is compared with a plain one-process model in test_pipeline_trainer.py), and the
loss reaches rank 0's metrics line by an ``all_sum`` with zeros (exact).
"""

from __future__ import annotations

import json
from pathlib import Path

import mlx.core as mx
from trainer_procs import losses, ok, run_trainer, write_config

from mlxops.trainer.checkpoint import find_latest
from mlxops.trainer.config import load_config
from mlxops.trainer.configfile import ConfigError

PIPE = {"model": {"layers": 6, "dims": 32, "heads": 2, "tie_embeddings": False},
        "train": {"steps": 6, "checkpoint_every": 3, "log_every": 1, "lr": 1e-2}}


def config(tmp: Path, out: Path, stages: list[int], **train) -> Path:
    return write_config(tmp, out, model=PIPE["model"],
                        train={**PIPE["train"], "stages": stages, **train})


def test_three_stages_train_as_one_stage_holding_every_layer(tmp_path):
    one = tmp_path / "one"
    ok(run_trainer(config(tmp_path, one, [6]), timeout=300))
    three = tmp_path / "three"
    proc = ok(run_trainer(config(tmp_path, three, [1, 2, 3]), ranks=3, timeout=300))
    assert "pipeline stage 0 of 3: layers 0-0" in proc.stdout
    reference = losses(one)
    assert sorted(reference) == list(range(1, 7))
    assert losses(three) == reference
    # Every stage wrote its own checkpoint, its own layers under the whole model's names.
    for s, blocks in enumerate([{"0"}, {"1", "2"}, {"3", "4", "5"}]):
        latest = find_latest(three / "ckpt" / f"stage-{s}")
        assert latest is not None
        assert json.loads((latest / "state.json").read_text())["step"] == 6
        names = set(mx.load(str(latest / "model.safetensors")))
        assert {n.split(".")[1] for n in names if n.startswith("blocks.")} == blocks
        assert ("embed.weight" in names) == (s == 0)
        assert ("head.weight" in names) == (s == 2)
    # Every stage's heartbeat carries the last stage's loss.
    beats = [json.loads((three / "progress" / f"rank-{r}.json").read_text()) for r in range(3)]
    assert {b["loss"] for b in beats} == {reference[6]}


def test_a_stopped_pipeline_resumes_bit_for_bit(tmp_path):
    straight = tmp_path / "straight"
    ok(run_trainer(config(tmp_path, straight, [3, 3]), ranks=2, timeout=300))
    paused = tmp_path / "paused"
    ok(run_trainer(config(tmp_path, paused, [3, 3], stop_at=3), ranks=2, timeout=300))
    assert sorted(losses(paused)) == [1, 2, 3]
    proc = ok(run_trainer(config(tmp_path, paused, [3, 3]), "--resume", ranks=2,
                          timeout=300))
    assert "resume: step 3" in proc.stdout
    assert losses(paused) == losses(straight)


def test_three_stages_stopped_resume_on_two_bit_for_bit(tmp_path):
    straight = tmp_path / "straight"
    ok(run_trainer(config(tmp_path, straight, [2, 2, 2]), ranks=3, timeout=300))
    out = tmp_path / "run"
    ok(run_trainer(config(tmp_path, out, [1, 2, 3], stop_at=3), ranks=3, timeout=300))
    # Two stages now, holding layers other stages checkpointed: read by name from each
    # stage's checkpoint of step 3.
    proc = ok(run_trainer(config(tmp_path, out, [4, 2]), "--resume", ranks=2, timeout=300))
    assert "resume: step 3" in proc.stdout
    assert losses(out) == losses(straight)


def test_stages_whose_newest_checkpoints_differ_resume_from_the_newest_all_have(tmp_path):
    straight = tmp_path / "straight"
    ok(run_trainer(config(tmp_path, straight, [3, 3]), ranks=2, timeout=300))
    out = tmp_path / "run"
    ok(run_trainer(config(tmp_path, out, [3, 3], stop_at=4, checkpoint_every=2), ranks=2,
                   timeout=300))
    # As a kill between two stages' writes of step 4 leaves them: stage 1 has step 2 only.
    import shutil

    shutil.rmtree(out / "ckpt" / "stage-1" / "step-00000004")
    proc = ok(run_trainer(config(tmp_path, out, [3, 3]), "--resume", ranks=2, timeout=300))
    assert "resume: step 2" in proc.stdout
    assert losses(out) == losses(straight)


def test_a_layer_no_stage_checkpointed_is_refused_naming_it(tmp_path):
    out = tmp_path / "run"
    ok(run_trainer(config(tmp_path, out, [3, 3], stop_at=3), ranks=2, timeout=300))
    # As on a node that has only its own stage's checkpoints: stage 1's are elsewhere.
    import shutil

    shutil.rmtree(out / "ckpt" / "stage-1")
    proc = run_trainer(config(tmp_path, out, [6]), "--resume", timeout=300)
    assert proc.returncode == 1
    assert "no stage's checkpoint step-00000003 holds blocks.3." in proc.stderr


def test_stages_that_are_not_the_models_layers_are_refused_naming_the_key():
    cfg = {"model": {"layers": 6}, "train": {"stages": [2, 2]}}
    try:
        load_config(cfg, where="job.yml: trainer")
    except ConfigError as e:
        assert str(e) == ("job.yml: trainer: train.stages: [2, 2] sums to 4 layers; the "
                          "model has 6 (model.layers)")
    else:
        raise AssertionError("accepted")


def test_one_rank_per_stage():
    cfg = load_config({"model": {"layers": 6}, "train": {"stages": [3, 3],
                                                         "global_batch": 8}})
    from mlxops.trainer.config import check_world

    check_world(cfg, 2)
    try:
        check_world(cfg, 4)
    except ConfigError as e:
        assert "2 stages need as many ranks, not 4" in str(e)
    else:
        raise AssertionError("accepted")

"""Fine-tuning over pipeline stages through the one run loop (``train.stages``,
mlxops/finetune/pipelinerun.py): ``python -m mlxops.finetune`` on real ring ranks on this
machine, a LoRA with dropout on a 6-block tiny llama (mlxops/devtools/tinymodels.py).

Tolerance: bit for bit. Every stage runs the same kernels on the same inputs as one
stage holding every block (the embedding, tied, is frozen: nothing is summed in another
order; test_pipeline_finetune.py holds the step itself to a plain mlx-lm process), and the
loss reaches rank 0's metrics line by an ``all_sum`` with zeros. The reference is that one
process (``train.stages: [6]``): a data-parallel run draws its adapters otherwise
(docs/pipeline.md).
"""

from __future__ import annotations

import math

import mlx.core as mx
import numpy as np
import pytest
from ft_procs import curve, ok, run_finetune, write_config

from mlxops.devtools.tinymodels import build_model
from mlxops.finetune import pipeline as fp
from mlxops.finetune.config import ConfigError, load_config
from mlxops.trainer.checkpoint import find_latest

TRAIN = {"steps": 6, "global_batch": 4, "micro_batch": 2, "eval_every": 0,
         "checkpoint_every": 3, "lr": 1e-3}


@pytest.fixture(scope="module")
def llama6(tmp_path_factory):
    return build_model(tmp_path_factory.mktemp("llama6") / "llama6", "llama",
                       sizes={"num_hidden_layers": 6})


def run(tmp, out, model, data, stages, *args, **train):
    cfg = write_config(tmp, out, model, data, train={**TRAIN, "stages": stages, **train})
    return ok(run_finetune(cfg, *args, ranks=len(stages), timeout=600))


def adapters(ckpt) -> dict[str, np.ndarray]:
    return {k: np.array(v) for k, v in mx.load(str(ckpt / fp.ADAPTERS)).items()}


def test_three_stages_then_two_fine_tune_as_one_process_bit_for_bit(tiny, llama6, tmp_path):
    data = tiny.data["chat"]
    one = tmp_path / "one"
    run(tmp_path, one, llama6, data, [6])
    reference = {s: loss for s, (loss, _) in curve(one).items()}
    assert sorted(reference) == list(range(1, 7)) and reference[6] < reference[1]
    # The objective is data parallel's (the mean over the global batch's tokens): at step 1
    # every lora_b is zero, so whatever the adapters' draw the model is the base model and
    # the loss is a data-parallel run's but for the order of summation.
    dp = tmp_path / "dp"
    ok(run_finetune(write_config(tmp_path, dp, llama6, data, train={**TRAIN, "steps": 1})))
    assert math.isclose(curve(dp)[1][0], reference[1], rel_tol=1e-6)
    three = tmp_path / "three"
    proc = run(tmp_path, three, llama6, data, [2, 1, 3])
    assert "pipeline stage 0 of 3: blocks 0-1" in proc.stdout
    assert {s: loss for s, (loss, _) in curve(three).items()} == reference
    # Each stage's checkpoint holds its own blocks' adapters under the whole model's
    # names; assembled, they are the one process's adapters, bit for bit.
    files = []
    for s, blocks in enumerate([{"0", "1"}, {"2"}, {"3", "4", "5"}]):
        latest = find_latest(three / "ckpt" / f"stage-{s}")
        assert latest is not None and latest.name == "step-00000006"
        assert {k.split(".")[2] for k in adapters(latest)} == blocks
        files.append(latest / fp.ADAPTERS)
    whole = fp.assemble(files, tmp_path / "assembled", {"num_layers": 6})
    want = adapters(find_latest(one / "ckpt" / "stage-0"))
    got = adapters(whole)
    assert sorted(got) == sorted(want)
    assert all(np.array_equal(got[k], want[k]) for k in want)
    # Stopped at step 3 on three stages, resumed on two that hold other blocks: read by
    # name from every stage's checkpoint of step 3, the uninterrupted curve bit for bit.
    out = tmp_path / "run"
    run(tmp_path, out, llama6, data, [2, 1, 3], stop_at=3)
    assert sorted(curve(out)) == [1, 2, 3]
    proc = run(tmp_path, out, llama6, data, [4, 2], "--resume")
    assert "resume: step 3" in proc.stdout
    assert {s: loss for s, (loss, _) in curve(out).items()} == reference


def test_stages_with_validation_or_a_balance_are_refused_naming_the_key():
    base = {"model": {"path": "m"}, "data": {"path": "d"}}
    for train, key in [({"stages": [2, 2]}, "train.eval_every"),
                       ({"stages": [2, 2], "eval_every": 0, "balance": "auto"},
                        "train.balance")]:
        with pytest.raises(ConfigError, match=f"^job.yml: finetune: {key}: "):
            load_config({**base, "train": train}, where="job.yml: finetune")

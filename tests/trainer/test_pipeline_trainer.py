"""The pipeline step on the bundled trainer's model, real ring ranks on this machine
(mlxops/devtools/local_ranks.py): 2 and 3 stages train as one process does on the same
micro-batches.

Tolerance: untied embeddings are compared bit for bit (losses as float.hex, every weight
with ``array_equal``), in float32 and in bfloat16 compute (bfloat16 activations between
stages): every gradient is made by the same kernels on the same inputs as in
one process (MLX's CPU kernels here). Tied embeddings and clipping sum in another order
(mlxops/trainer/pipeline.py says which): losses within 1e-5 relative, weights after
three AdamW steps (lr 0.01, which divides by the gradients' own scale) within 1e-4
relative or 5e-5 absolute.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from mlxops.devtools.local_ranks import run_ranks
from mlxops.sandbox import nospin

RANK = str(Path(__file__).with_name("pipeline_rank.py"))
BASE = {"steps": 3, "micro": 4, "size": 2, "lr": 0.01, "seed": 0}


def run_one(out: Path, **opts) -> tuple[list[str], dict[str, np.ndarray]]:
    import subprocess

    out.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, RANK, str(out), "one", json.dumps({**BASE, **opts})],
                   check=True, timeout=300)
    return json.loads((out / "losses-0.json").read_text()), dict(np.load(out / "params-0.npz"))


def run_pipe(out: Path, ranks: int, **opts) -> tuple[list[str], dict[str, np.ndarray]]:
    out.mkdir(parents=True, exist_ok=True)
    proc = run_ranks([sys.executable, RANK, str(out), "pipe", json.dumps({**BASE, **opts})],
                     ranks, timeout=300, preload=nospin.library())
    assert proc.returncode == 0, proc.stderr[-3000:]
    params: dict[str, np.ndarray] = {}
    for r in range(ranks):
        for k, v in np.load(out / f"params-{r}.npz").items():
            if k in params:   # the tied embedding, on the first and the last stage
                assert np.array_equal(params[k], v), k
            params[k] = v
    return json.loads((out / f"losses-{ranks - 1}.json").read_text()), params


def floats(hexes: list[str]) -> np.ndarray:
    return np.array([float.fromhex(h) for h in hexes])


@pytest.mark.parametrize("split, dtype", [([3, 3], "float32"), ([1, 4, 1], "float32"),
                                          ([4, 2], "float32"), ([2, 2, 2], "bfloat16")])
def test_untied_stages_train_bit_for_bit_as_one_process(tmp_path, split, dtype):
    losses, params = run_one(tmp_path / "one", dtype=dtype)
    got_losses, got = run_pipe(tmp_path / "pipe", len(split), split=split, dtype=dtype)
    assert got_losses == losses
    assert sorted(got) == sorted(params)
    for k in params:
        assert np.array_equal(got[k], params[k]), k


@pytest.mark.parametrize("split", [[3, 3], [2, 2, 2]])
def test_tied_embeddings_are_summed_and_train_as_one_process(tmp_path, split):
    losses, params = run_one(tmp_path / "one", tied=True)
    got_losses, got = run_pipe(tmp_path / "pipe", len(split), split=split, tied=True)
    np.testing.assert_allclose(floats(got_losses), floats(losses), rtol=1e-5)
    assert sorted(got) == sorted(params) and "embed.weight" in got and "head.weight" not in got
    for k in params:
        np.testing.assert_allclose(got[k], params[k], rtol=1e-4, atol=5e-5, err_msg=k)


def test_clipping_takes_the_norm_over_every_stage(tmp_path):
    losses, params = run_one(tmp_path / "one", clip=0.05)
    got_losses, got = run_pipe(tmp_path / "pipe", 3, split=[2, 2, 2], clip=0.05)
    np.testing.assert_allclose(floats(got_losses), floats(losses), rtol=1e-5)
    unclipped, _ = run_one(tmp_path / "free")
    assert floats(unclipped)[-1] != pytest.approx(floats(losses)[-1], rel=1e-4)  # it bit
    for k in params:
        np.testing.assert_allclose(got[k], params[k], rtol=1e-4, atol=5e-5, err_msg=k)


def test_fewer_micro_batches_than_stages(tmp_path):
    losses, params = run_one(tmp_path / "one", micro=1)
    got_losses, got = run_pipe(tmp_path / "pipe", 3, split=[2, 2, 2], micro=1)
    assert got_losses == losses
    for k in params:
        assert np.array_equal(got[k], params[k]), k


def test_a_checkpoint_of_3_stages_resumes_on_2_and_continues_as_one_process(tmp_path):
    losses, params = run_one(tmp_path / "one", steps=4)
    ckpt = tmp_path / "ckpt"
    first, _ = run_pipe(tmp_path / "a", 3, split=[2, 2, 2], steps=4, save_at=2,
                        save=str(ckpt))
    assert sorted(p.name for p in ckpt.iterdir()) == [f"stage-{s}.safetensors"
                                                      for s in range(3)]
    rest, got = run_pipe(tmp_path / "b", 2, split=[4, 2], steps=4, resume=str(ckpt))
    assert first + rest == losses
    for k in params:
        assert np.array_equal(got[k], params[k]), k

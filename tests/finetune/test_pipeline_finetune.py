"""Fine-tuning across pipeline stages (mlxops/finetune/pipeline.py over
mlxops/trainer/pipeline.py), real ring ranks on this machine: each stage reads its own
blocks from disk, and 2 and 3 stages train as one process (``mlx_lm.load``, mlx-lm's LoRA
layers and ``default_loss``) does on the same micro-batches.

Tolerance: none. Losses (float.hex) and every trainable weight are compared bit for bit:
the stages run the same kernels on the same inputs as the one process (MLX's CPU kernels
here), and an mlx-lm model's tied embedding is frozen under LoRA, DoRA and full
fine-tuning of blocks, so nothing is summed in another order.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from mlx.utils import tree_flatten

from mlxops.devtools.local_ranks import run_ranks
from mlxops.devtools.tinymodels import build_model
from mlxops.finetune import pipeline as fp
from mlxops.finetune.plan import read_header
from mlxops.sandbox import nospin

RANK = str(Path(__file__).with_name("pipeline_rank.py"))
BASE = {"steps": 3, "micro": 4, "size": 2, "lr": 0.01, "seed": 0}


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("six")
    six = {"num_hidden_layers": 6}
    return {"plain": build_model(root / "llama6", "llama", sizes=six),
            "4bit": build_model(root / "llama6-4bit", "llama", quantize=True, sizes=six)}


def run_one(out: Path, **opts) -> tuple[list[str], dict[str, np.ndarray]]:
    out.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, RANK, str(out), "one", json.dumps({**BASE, **opts})],
                   check=True, timeout=300, capture_output=True)
    return (json.loads((out / "losses-0.json").read_text()),
            dict(np.load(out / "trainable-0.npz")))


def run_pipe(out: Path, **opts) -> tuple[list[str], dict[str, np.ndarray]]:
    out.mkdir(parents=True, exist_ok=True)
    ranks = len(opts["split"])
    proc = run_ranks([sys.executable, RANK, str(out), "pipe", json.dumps({**BASE, **opts})],
                     ranks, timeout=300, preload=nospin.library())
    assert proc.returncode == 0, proc.stderr[-3000:]
    got: dict[str, np.ndarray] = {}
    for r in range(ranks):
        part = dict(np.load(out / f"trainable-{r}.npz"))
        assert not set(part) & set(got)    # each adapter on one stage
        got.update(part)
    return json.loads((out / f"losses-{ranks - 1}.json").read_text()), got


@pytest.mark.parametrize("model, method, split, num_layers", [
    ("plain", "lora", [2, 2, 2], -1),
    ("plain", "lora", [4, 2], -1),
    ("plain", "lora", [2, 2, 2], 3),       # the first stage adapts nothing
    ("plain", "dora", [3, 3], -1),
    ("plain", "full", [1, 3, 2], 4),
    ("4bit", "lora", [2, 1, 3], -1),       # QLoRA
])
def test_stages_fine_tune_bit_for_bit_as_one_process(tmp_path, models, model, method,
                                                     split, num_layers):
    opts = {"model": str(models[model]), "method": method, "num_layers": num_layers}
    losses, want = run_one(tmp_path / "one", **opts)
    got_losses, got = run_pipe(tmp_path / "pipe", split=split, **opts)
    assert got_losses == losses
    assert sorted(got) == sorted(want)
    for k in want:
        assert np.array_equal(got[k], want[k]), k
    if num_layers == 3:
        assert not dict(np.load(tmp_path / "pipe" / "trainable-0.npz"))


@pytest.mark.parametrize("model", ["plain", "4bit"])
def test_each_stage_reads_only_its_own_tensors_from_disk(tmp_path, models, model):
    directory = models[model]
    header = {}
    for path in directory.glob("*.safetensors"):
        header.update(read_header(path))

    def nbytes(name: str) -> int:
        begin, end = header[name]["data_offsets"]
        return end - begin

    total = sum(nbytes(k) for k in header)
    embed = sum(nbytes(k) for k in header if k.startswith("model.embed_tokens."))
    split = [2, 2, 2]
    for s, (start, stop) in enumerate([(0, 2), (2, 4), (4, 6)]):
        first, last = s == 0, s == 2
        model_, _, read = fp.load_stage(directory, start, stop, first, last)
        mine = [k for k in header if fp.holds(k, start, stop, first, last, tied=True)]
        assert read == sum(nbytes(k) for k in mine)
        blocks = {int(k.split(".")[2]) for k in mine if k.startswith("model.layers.")}
        assert blocks == set(range(start, stop)) and len(model_.model.layers) == 2
        assert read < total * 0.6
    # Every tensor is read by exactly one stage, but the tied embedding by two (the head).
    reads = [fp.load_stage(directory, a, b, a == 0, b == 6)[2]
             for a, b in [(0, 2), (2, 4), (4, 6)]]
    assert sum(reads) == total + embed and sum(split) == 6


def test_a_stage_model_has_only_its_blocks_and_ends(models):
    model, _, _ = fp.load_stage(models["4bit"], 2, 4, False, False)
    names = [k for k, _ in tree_flatten(model.parameters())]
    assert names and all(k.startswith(("model.layers.0.", "model.layers.1.")) for k in names)
    assert any(k.endswith(".scales") for k in names)     # still quantized
    model, _, _ = fp.load_stage(models["plain"], 4, 6, False, True)
    names = [k for k, _ in tree_flatten(model.parameters())]
    assert "model.embed_tokens.weight" in names and "model.norm.weight" in names


def test_assembled_adapters_load_in_mlx_lm_and_generate(tmp_path, models):
    from mlx_lm import generate, load

    from mlxops.finetune.config import load_config
    from mlxops.finetune.model import adapter_config

    opts = {"model": str(models["plain"]), "method": "lora", "num_layers": -1}
    _, want = run_one(tmp_path / "one", **opts)
    stages_dir = tmp_path / "stages"
    run_pipe(tmp_path / "pipe", split=[2, 2, 2], adapters=str(stages_dir), **opts)
    files = sorted(stages_dir.glob("adapters-stage-*.safetensors"))
    assert len(files) == 3
    cfg = load_config({"model": {"path": str(models["plain"])}, "data": {"path": "d"},
                       "method": {"type": "lora", "num_layers": -1, "rank": 4}})
    out = fp.assemble(files, tmp_path / "adapters", adapter_config(cfg, 6))
    model, tok = load(str(models["plain"]), adapter_path=str(out))
    loaded = dict(tree_flatten(model.parameters()))
    assert set(want) <= set(loaded)
    assert {k for k in loaded if "lora" in k} == set(want)
    for k in want:
        assert np.array_equal(np.array(loaded[k]), want[k]), k
    assert isinstance(generate(model, tok, "What is the Python module json for?",
                               max_tokens=4), str)
    cli = subprocess.run([sys.executable, "-m", "mlx_lm", "generate", "--model",
                          str(models["plain"]), "--adapter-path", str(out), "--prompt",
                          "What is json?", "--max-tokens", "4"],
                         capture_output=True, text=True, timeout=120)
    assert cli.returncode == 0, cli.stderr[-2000:]


def test_a_checkpoint_of_3_stages_resumes_on_2_by_name_and_continues_as_one_process(
        tmp_path, models):
    opts = {"model": str(models["4bit"]), "method": "lora", "num_layers": 4, "steps": 4}
    losses, want = run_one(tmp_path / "one", **opts)
    ckpt = tmp_path / "ckpt"
    first, _ = run_pipe(tmp_path / "a", split=[2, 2, 2], save_at=2, save=str(ckpt), **opts)
    import mlx.core as mx

    saved = {k for s in range(3) for k in mx.load(str(ckpt / f"stage-{s}.safetensors"))}
    assert "model.layers.5.self_attn.q_proj.lora_a" in saved     # the whole model's names
    assert not any(".scales" in k or "embed_tokens" in k for k in saved)  # adapters only
    rest, got = run_pipe(tmp_path / "b", split=[3, 3], resume=str(ckpt), **opts)
    assert first + rest == losses
    for k in want:
        assert np.array_equal(got[k], want[k]), k


def test_two_stages_holding_one_adapter_are_refused_at_assembly(tmp_path):
    import mlx.core as mx

    for s in range(2):
        mx.save_safetensors(str(tmp_path / f"adapters-stage-{s}.safetensors"),
                            {"model.layers.0.self_attn.q_proj.lora_a": mx.zeros((2, 2))})
    with pytest.raises(fp.PipelineModelError, match="also in another stage"):
        fp.assemble(sorted(tmp_path.glob("*.safetensors")), tmp_path / "out", {})

"""The bundled trainer's checkpoint in mlx-lm's layout (mlxops/trainer/export.py): loaded by
mlx-lm itself, its logits equal the bundled model's within 1e-5, and mlx_lm.generate's
greedy text is the bundled model's argmax continuation."""

from __future__ import annotations

import json
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
from mlx.utils import tree_unflatten

from mlxops.trainer import export, train
from mlxops.trainer.checkpoint import find_latest
from mlxops.trainer.config import load_config
from mlxops.trainer.model import Transformer

mlx_lm = pytest.importorskip("mlx_lm")

TEXT = ("The quick brown fox jumps over the lazy dog. Grüße aus Köln! 0123456789\n" * 40)


def train_tiny(tmp_path: Path, *, tie: bool, steps: int = 3) -> Path:
    """A real bundled-trainer run of a few steps on byte text; its run directory."""
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(TEXT)
    cfg = {"model": {"dims": 32, "layers": 2, "heads": 4, "vocab_size": 256, "seq_len": 32,
                     "tie_embeddings": tie},
           "data": {"source": "text", "path": str(corpus)},
           "train": {"steps": steps, "global_batch": 4, "micro_batch": 4, "lr": 3e-3,
                     "log_every": 1, "checkpoint_every": steps, "consistency_every": 0},
           "out": str(tmp_path / "run")}
    train.train(load_config(cfg), resume=False)
    return tmp_path / "run"


def bundled_model(checkpoint: Path) -> Transformer:
    state = json.loads((checkpoint / "state.json").read_text())
    model = Transformer(load_config(state["config"]).model)
    model.update(tree_unflatten(list(mx.load(str(checkpoint / "model.safetensors")).items())))
    return model


@pytest.mark.parametrize("tie,arch", [(True, "llama"), (False, "llama"), (True, "qwen2")])
def test_mlx_lm_computes_the_same_logits(tmp_path, tie, arch):
    run = train_tiny(tmp_path, tie=tie)
    ckpt = find_latest(run / "ckpt")
    done = export.export_checkpoint(ckpt, tmp_path / "out", arch)
    assert done.step == 3 and "config.json" in done.files
    ours = bundled_model(ckpt)
    theirs, tokenizer = mlx_lm.load(str(tmp_path / "out"))
    assert type(theirs).__module__ == f"mlx_lm.models.{arch}"
    tokens = mx.array([list(b"The quick brown fox, Gr\xc3\xbc\xc3\x9fe")])
    want, got = np.array(ours(tokens)), np.array(theirs(tokens))
    assert got.shape == want.shape == (1, tokens.shape[1], 256)
    assert np.abs(got - want).max() <= 1e-5
    assert np.abs(want).max() > 0.1  # trained weights, not a model of zeros


def test_the_tokenizer_is_bytes_both_ways(tmp_path):
    run = train_tiny(tmp_path, tie=True, steps=1)
    export.export_checkpoint(find_latest(run / "ckpt"), tmp_path / "out")
    _, tokenizer = mlx_lm.load(str(tmp_path / "out"))
    text = "Grüße, 東京! tabs\tand\nnewlines  "
    ids = tokenizer.encode(text)
    assert ids == list(text.encode())
    assert tokenizer.decode(ids) == text


def test_generate_is_the_bundled_models_greedy_continuation(tmp_path):
    run = train_tiny(tmp_path, tie=True, steps=20)
    ckpt = find_latest(run / "ckpt")
    export.export_checkpoint(ckpt, tmp_path / "out")
    model, tokenizer = mlx_lm.load(str(tmp_path / "out"))
    prompt = "The quick brown"
    text = mlx_lm.generate(model, tokenizer, prompt=prompt, max_tokens=12)
    ours, ids = bundled_model(ckpt), list(prompt.encode())
    for _ in range(12):
        ids.append(int(mx.argmax(ours(mx.array([ids]))[0, -1]).item()))
    # mlx-lm's streaming detokenizer for every ByteLevel tokenizer (GPT-2's, Llama 3's,
    # Qwen's) drops one leading space of a generation (BPEStreamingDetokenizer
    # ._maybe_trim_space); the tokens are the bundled model's argmax all the same.
    want = bytes(ids[len(prompt):]).decode()
    assert text == (want[1:] if want.startswith(" ") else want) and len(want) == 12


def test_a_vocabulary_that_is_not_bytes_is_refused(tmp_path):
    with pytest.raises(export.ExportError, match="vocab_size is 64"):
        export.tokenizer_files(64)


def test_wider_vocabulary_gets_special_tokens_above_the_bytes():
    files = export.tokenizer_files(260)
    added = files["tokenizer.json"]["added_tokens"]
    assert [t["id"] for t in added] == [256, 257, 258, 259]
    assert len(files["tokenizer.json"]["model"]["vocab"]) == 256


def test_the_node_command_writes_the_layout_or_says_why_not(tmp_path, capsys):
    run = train_tiny(tmp_path, tie=True, steps=1)
    capsys.readouterr()  # the trainer's lines
    assert export.main(["--run-dir", str(run), "--out", str(tmp_path / "o")]) == 0
    done = json.loads(capsys.readouterr().out)
    assert done["step"] == 1 and (tmp_path / "o" / "model.safetensors.index.json").is_file()
    assert export.main(["--run-dir", str(run), "--step", "7", "--out", str(tmp_path / "x")]) == 2
    assert "no checkpoint of step 7" in capsys.readouterr().err


def test_the_controllers_command_streams_the_converted_directory_back(tmp_path):
    """``mlxops export``'s node command (convert, then ``send`` the directory) run by
    ``/bin/sh``, read back by the one download helper: the exporter's answer line first,
    then every file of the layout, byte for byte; a refusal is its exit code 2 and line."""
    import sys

    from mlxops.jobs.download import download
    from mlxops.jobs.export import export_command
    from mlxops.transport import LocalConnection

    run = train_tiny(tmp_path, tie=True, steps=1)
    root = str(Path(__file__).resolve().parents[2])
    local = tmp_path / "local"
    local.mkdir()
    got, result = download(LocalConnection("here"), export_command(
        sys.executable, root, str(run), step=None, best=False, arch="llama"), local)
    assert result.ok, result.stderr
    assert json.loads(got.before[-1])["step"] == 1
    direct = tmp_path / "direct"
    assert export.main(["--run-dir", str(run), "--out", str(direct)]) == 0
    want = {str(p.relative_to(direct)): p.read_bytes() for p in direct.rglob("*") if p.is_file()}
    assert {str(p.relative_to(local)): p.read_bytes() for p in local.rglob("*")
            if p.is_file()} == want
    assert got.written == {name: len(data) for name, data in want.items()}
    got, result = download(LocalConnection("here"), export_command(
        sys.executable, root, str(run), step=7, best=False, arch="llama"), tmp_path / "x")
    assert result.exit_code == 2 and "no checkpoint of step 7" in result.error_line()
    assert got.answer is None


def test_best_is_the_checkpoint_validation_kept(tmp_path, capsys):
    """best/ is written like ckpt/ (checkpoint.save, protocol.BEST_DIR): --best takes it."""
    from mlxops.trainer import checkpoint

    run = train_tiny(tmp_path, tie=True, steps=2)
    newest = find_latest(run / "ckpt")
    weights, optimizer, state = checkpoint.load(newest)
    state["step"] = 1  # as if step 1 had the lowest validation loss
    checkpoint.save(run / "best", 1, weights, optimizer, state, keep=1)
    capsys.readouterr()
    assert export.main(["--run-dir", str(run), "--best", "--out", str(tmp_path / "b")]) == 0
    assert json.loads(capsys.readouterr().out)["step"] == 1
    assert export.main(["--run-dir", str(tmp_path / "none"), "--best", "--out",
                        str(tmp_path / "n")]) == 2
    assert "no best checkpoint" in capsys.readouterr().err


def test_a_fine_tuning_checkpoint_is_fused_into_its_base_model(tmp_path, capsys):
    """A checkpoint holding mlx-lm adapters (as mlxops/finetune writes them) comes out
    fused by mlx_lm fuse: the same logits as the base model with the adapters loaded."""
    from mlx.utils import tree_flatten
    from mlx_lm.tuner.utils import linear_to_lora_layers

    from mlxops.devtools.tinymodels import build_model

    base = build_model(tmp_path / "base", "llama", seed=3)
    lora = {"rank": 4, "scale": 10.0, "dropout": 0.0}
    model, _ = mlx_lm.load(str(base))
    model.freeze()  # as mlx_lm lora does: only the adapters are trainable
    linear_to_lora_layers(model, 2, lora)
    # lora_b starts at zero (a fuse of it changes nothing): give it values.
    adapters = {k: (mx.random.normal(v.shape, key=mx.random.key(7)) * 0.05 if "lora_b" in k
                    else v) for k, v in tree_flatten(model.trainable_parameters())}
    ckpt = tmp_path / "run" / "ckpt" / "step-00000005"
    ckpt.mkdir(parents=True)
    for name in ("adapters.safetensors", "model.safetensors", "optimizer.safetensors"):
        mx.save_safetensors(str(ckpt / name), adapters)
    (ckpt / "adapter_config.json").write_text(json.dumps(
        {"fine_tune_type": "lora", "num_layers": 2, "lora_parameters": lora}))
    (ckpt / "state.json").write_text(json.dumps({"step": 5,
                                                 "config": {"model": {"path": str(base)}}}))
    assert export.main(["--run-dir", str(tmp_path / "run"), "--out",
                        str(tmp_path / "fused")]) == 0
    done = json.loads(capsys.readouterr().out)
    assert (done["step"], done["arch"]) == (5, "fused")
    tuned, _ = mlx_lm.load(str(base), adapter_path=str(ckpt))
    fused, _ = mlx_lm.load(str(tmp_path / "fused"))
    tokens = mx.array([[1, 2, 3, 4, 5, 6]])
    want, got = np.array(tuned(tokens)), np.array(fused(tokens))
    assert np.abs(got - want).max() <= 1e-4
    plain, _ = mlx_lm.load(str(base))
    assert np.abs(np.array(plain(tokens)) - want).max() > 1e-3  # the adapters did something


def test_a_pipeline_runs_stages_are_merged_by_name_or_refused_naming_the_missing_one(
        tmp_path):
    """A real checkpoint cut into two stages' directories as a 2-stage run writes them
    (each stage's names in the whole model): exported, the same files as the checkpoint
    whole; with stage 1's directory not on the node, one line naming it."""
    run = train_tiny(tmp_path, tie=False)
    whole = find_latest(run / "ckpt")
    weights = mx.load(str(whole / "model.safetensors"))
    state = json.loads((whole / "state.json").read_text())
    state["world_size"], state["config"]["train"]["stages"] = 2, [1, 1]
    stages = tmp_path / "stages"
    for s, names in enumerate([("embed.", "blocks.0."), ("blocks.1.", "norm.", "head.")]):
        d = stages / "ckpt" / f"stage-{s}" / whole.name
        d.mkdir(parents=True)
        mx.save_safetensors(str(d / "model.safetensors"),
                            {k: v for k, v in weights.items() if k.startswith(names)})
        (d / "optimizer.safetensors").write_bytes((whole / "optimizer.safetensors")
                                                  .read_bytes())
        (d / "state.json").write_text(json.dumps(state))
    export.export_checkpoint(whole, tmp_path / "one")
    done = export.export_checkpoint(export.find_checkpoint(stages), tmp_path / "two")
    assert done.step == 3
    a = mx.load(str(tmp_path / "one" / "model.safetensors"))
    b = mx.load(str(tmp_path / "two" / "model.safetensors"))
    assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)

    (stages / "ckpt" / "stage-1" / whole.name / "model.safetensors").unlink()
    with pytest.raises(export.ExportError) as err:
        export.find_checkpoint(stages)
    assert str(err.value) == (f"{stages / 'ckpt'}: no pipeline checkpoint with every stage's "
                              f"on this node ({whole.name}: stage 1's checkpoint (of 2) is "
                              "not here)")

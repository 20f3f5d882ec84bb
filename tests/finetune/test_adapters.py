"""The adapters are mlx-lm's: ``mlx_lm.generate --adapter-path`` and ``mlx_lm.fuse`` take a
checkpoint as it is, for LoRA on a quantized model, DoRA and full fine-tuning."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import mlx.core as mx
import pytest
from ft_procs import ok, run_finetune, write_config
from mlx.utils import tree_flatten

from mlxops.node import protocol

BIN = Path(sys.executable).parent
SHORT = {"steps": 2, "eval_every": 2, "checkpoint_every": 2}


def mlx_lm(command: str, *args: str) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(BIN / command), *args], capture_output=True, text=True,
                          timeout=300, stdin=subprocess.DEVNULL,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return proc


def test_qlora_adapters_work_with_mlx_lm_generate_and_fuse(tiny, tmp_path):
    out = tmp_path / "qlora"
    ok(run_finetune(write_config(tmp_path, out, tiny.qwen2_4bit, tiny.data["completions"],
                                 method={"keys": ["self_attn.q_proj", "self_attn.v_proj"]},
                                 train=SHORT)))
    ckpt = out / "ckpt" / "step-00000002"
    adapters = mx.load(str(ckpt / "adapters.safetensors"))
    assert set(adapters) == set(mx.load(str(ckpt / protocol.CKPT_MODEL)))
    assert {k.rsplit(".", 2)[-2] for k in adapters} == {"q_proj", "v_proj"}
    assert all(k.endswith((".lora_a", ".lora_b")) for k in adapters)
    best = out / protocol.BEST_DIR / "step-00000002"
    text = mlx_lm("mlx_lm.generate", "--model", str(tiny.qwen2_4bit), "--adapter-path",
                  str(best), "--prompt", "What is json for?", "--max-tokens", "4").stdout
    assert "Generation: " in text
    fused = tmp_path / "fused"
    mlx_lm("mlx_lm.fuse", "--model", str(tiny.qwen2_4bit), "--adapter-path", str(ckpt),
           "--save-path", str(fused))
    assert json.loads((fused / "config.json").read_text())["model_type"] == "qwen2"
    mlx_lm("mlx_lm.generate", "--model", str(fused), "--prompt", "hi", "--max-tokens", "2")


@pytest.mark.slow  # the LoRA test above covers what a job needs; these two methods more
@pytest.mark.parametrize("method", ["dora", "full"])
def test_dora_and_full_adapters_load_in_mlx_lm(tiny, tmp_path, method):
    from mlx_lm import load

    out = tmp_path / method
    config = write_config(tmp_path, out, tiny.llama, tiny.data["text"],
                          method={"type": method, "num_layers": 1}, data={"mask_prompt": False},
                          train={**SHORT, "grad_checkpoint": method == "full"})
    ok(run_finetune(config))
    ckpt = out / "ckpt" / "step-00000002"
    saved = mx.load(str(ckpt / "adapters.safetensors"))
    model, _ = load(str(tiny.llama), adapter_path=str(ckpt))
    params = dict(tree_flatten(model.parameters()))
    assert saved and all(mx.array_equal(params[k], v) for k, v in saved.items())
    if method == "dora":
        assert any(k.endswith(".m") for k in saved)
    else:  # the last block's own weights, trained
        assert all(k.startswith("model.layers.1.") for k in saved)
        base = mx.load(str(tiny.llama / "model.safetensors"))
        assert any(not mx.array_equal(base[k], v) for k, v in saved.items() if k in base)


def test_bad_config_is_one_line_and_exit_2(tiny, tmp_path):
    config = write_config(tmp_path, tmp_path / "bad", tiny.llama, tiny.data["chat"],
                          method={"rank": 0})
    proc = run_finetune(config)
    assert proc.returncode == 2
    assert proc.stderr.strip() == f"error: {config}: method.rank: must be positive, got 0"
    config = write_config(tmp_path, tmp_path / "nomodel", tmp_path, tiny.data["chat"])
    proc = run_finetune(config)
    assert proc.returncode == 2 and "model.path: no config.json" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1

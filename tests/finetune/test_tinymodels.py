"""The tiny models load, generate and tokenize through mlx-lm's own code."""

import json
import types

import mlx.core as mx
import pytest
from mlx.utils import tree_flatten

from mlxops.devtools import tinymodels


@pytest.mark.parametrize("name", ["llama", "qwen2_4bit"])
def test_mlx_lm_loads_and_generates(tiny, name):
    from mlx_lm import generate, load

    path = getattr(tiny, name)
    model, tokenizer = load(str(path))
    config = json.loads((path / "config.json").read_text())
    assert config["model_type"] == ("llama" if name == "llama" else "qwen2")
    quantized = [k for k, _ in tree_flatten(model.parameters()) if k.endswith(".scales")]
    assert bool(quantized) == (name == "qwen2_4bit")
    assert ("quantization" in config) == (name == "qwen2_4bit")
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is json for?"}], add_generation_prompt=True)
    assert tokenizer.decode(prompt).endswith("<|im_start|>assistant\n")
    text = generate(model, tokenizer, prompt=prompt, max_tokens=4)
    assert isinstance(text, str)
    assert mx.array(prompt).size == len(prompt)


def test_same_seed_same_weights(tmp_path):
    a = tinymodels.build_model(tmp_path / "a", "llama", seed=3)
    b = tinymodels.build_model(tmp_path / "b", "llama", seed=3)
    c = tinymodels.build_model(tmp_path / "c", "llama", seed=4)
    wa, wb, wc = (mx.load(str(p / "model.safetensors")) for p in (a, b, c))
    key = "model.layers.0.self_attn.q_proj.weight"
    assert mx.array_equal(wa[key], wb[key]) and not mx.array_equal(wa[key], wc[key])


def test_every_format_loads_as_mlx_lm_data(tiny):
    from mlx_lm import load
    from mlx_lm.tuner.datasets import (
        ChatDataset,
        CompletionsDataset,
        TextDataset,
        load_local_dataset,
    )

    _, tokenizer = load(str(tiny.llama))
    expected = {"chat": ChatDataset, "completions": CompletionsDataset, "text": TextDataset}
    for kind, cls in expected.items():
        config = types.SimpleNamespace(mask_prompt=kind != "text")
        train, valid, _ = load_local_dataset(tiny.data[kind], tokenizer, config)
        assert isinstance(train, cls) and len(train) > 60 and len(valid) > 5
        tokens, offset = train.process(train[0])
        assert 0 <= offset < len(tokens)
        assert (offset > 0) == (kind != "text")  # the prompt masked where there is one


def test_data_is_the_docstrings_word_for_word(tiny):
    import abc

    first = json.loads((tiny.data["text"] / "train.jsonl").read_text().splitlines()[0])
    assert first["text"] == "abc: " + " ".join(abc.__doc__.strip().split("\n\n")[0].split())
    with pytest.raises(ValueError, match="unknown data format"):
        tinymodels.examples("parquet")

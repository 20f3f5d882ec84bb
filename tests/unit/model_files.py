"""A model's files as fine-tuning reads them (``config.json`` and safetensors headers),
written by the tests: illustrative shapes, not a real model's (a llama-like block of D=64,
F=128, 4 heads, 2 kv heads, vocabulary 512, as mlxops/devtools/tinymodels.py builds), with
zero bytes for the data. Shared by tests/unit/finetune/test_finetune_plan.py and
tests/unit/checks/test_check_finetune.py (imported by bare name: tests/unit/conftest.py)."""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path

D, F, V, KV = 64, 128, 512, 32
LINEARS = {"self_attn.q_proj": (D, D), "self_attn.k_proj": (KV, D),
           "self_attn.v_proj": (KV, D), "self_attn.o_proj": (D, D),
           "mlp.gate_proj": (F, D), "mlp.up_proj": (F, D), "mlp.down_proj": (D, F)}


def write_model(directory: Path, layers: int = 2, bits: int | None = None,
                dtype: str = "F32") -> Path:
    directory.mkdir(parents=True)
    size = {"F32": 4, "BF16": 2, "U32": 4}
    tensors: dict[str, tuple[str, list[int]]] = {}

    def linear(name: str, out: int, inp: int) -> None:
        if bits:
            tensors[f"{name}.weight"] = ("U32", [out, inp * bits // 32])
            tensors[f"{name}.scales"] = (dtype, [out, inp // 32])
            tensors[f"{name}.biases"] = (dtype, [out, inp // 32])
        else:
            tensors[f"{name}.weight"] = (dtype, [out, inp])

    linear("model.embed_tokens", V, D)
    tensors["model.norm.weight"] = (dtype, [D])
    for i in range(layers):
        for norm in ("input_layernorm", "post_attention_layernorm"):
            tensors[f"model.layers.{i}.{norm}.weight"] = (dtype, [D])
        for path, (out, inp) in LINEARS.items():
            linear(f"model.layers.{i}.{path}", out, inp)
    header, offset = {}, 0
    for name, (dt, shape) in sorted(tensors.items()):
        n = math.prod(shape) * size[dt]
        header[name] = {"dtype": dt, "shape": shape, "data_offsets": [offset, offset + n]}
        offset += n
    raw = json.dumps(header).encode()
    (directory / "model.safetensors").write_bytes(struct.pack("<Q", len(raw)) + raw
                                                  + bytes(offset))
    config = {"model_type": "llama", "hidden_size": D, "num_hidden_layers": layers,
              "intermediate_size": F, "num_attention_heads": 4, "num_key_value_heads": 2,
              "vocab_size": V, "tie_word_embeddings": True}
    if bits:
        config["quantization"] = {"group_size": 32, "bits": bits}
    (directory / "config.json").write_text(json.dumps(config))
    return directory

"""The model to fine-tune, made by mlx-lm's own functions, and its adapters' files.

``mlx_lm.load`` reads the base model and its tokenizer (quantized models too); the method
is mlx-lm's: ``lora`` / ``dora`` convert the chosen linear layers of the last
``num_layers`` blocks with ``linear_to_lora_layers`` (everything else frozen), ``full``
unfreezes those blocks, as ``mlx_lm.lora`` does. The adapters are what mlx-lm writes and
reads (``mlx_lm.generate --adapter-path``, ``mlx_lm.fuse``): ``adapters.safetensors``, the
trainable parameters by their names in the model, and ``adapter_config.json`` with
``fine_tune_type``, ``num_layers`` and ``lora_parameters``, the keys
``mlx_lm.tuner.utils.load_adapters`` reads.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten

from .config import ConfigError, FinetuneConfig

ADAPTERS, ADAPTER_CONFIG = "adapters.safetensors", "adapter_config.json"


def load_base(cfg: FinetuneConfig) -> tuple[nn.Module, Any]:
    """The base model and its tokenizer (mlx-lm's ``TokenizerWrapper``)."""
    from mlx_lm import load

    path = Path(cfg.model.path or "")
    if not (path / "config.json").is_file():
        raise ConfigError(f"{path}: model.path: no config.json (a Hugging Face / mlx-lm "
                          "model directory)")
    return load(str(path))


def lora_parameters(cfg: FinetuneConfig) -> dict[str, Any]:
    """mlx-lm's ``lora_parameters``: what ``linear_to_lora_layers`` takes."""
    m = cfg.method
    params: dict[str, Any] = {"rank": m.rank, "scale": m.scale, "dropout": m.dropout}
    if m.keys is not None:
        params["keys"] = list(m.keys)
    return params


def apply_method(model: nn.Module, cfg: FinetuneConfig) -> None:
    """Freeze the model and make trainable what ``method`` trains, in place."""
    from mlx_lm.tuner.trainer import grad_checkpoint
    from mlx_lm.tuner.utils import linear_to_lora_layers

    m = cfg.method
    blocks = len(model.layers)
    if m.num_layers > blocks:
        raise ConfigError(f"{cfg.model.path}: method.num_layers: {m.num_layers} but the "
                          f"model has {blocks} blocks")
    num_layers = blocks if m.num_layers == -1 else m.num_layers
    model.freeze()
    if m.type == "full":
        for layer in model.layers[-num_layers:]:
            layer.unfreeze()
    else:
        linear_to_lora_layers(model, num_layers, lora_parameters(cfg),
                              use_dora=m.type == "dora")
    if not tree_flatten(model.trainable_parameters()):
        raise ConfigError(f"{cfg.model.path}: method.keys: {m.keys} matches no layer of the "
                          "model (nothing to train)")
    if cfg.train.grad_checkpoint:
        grad_checkpoint(model.layers[0])  # every block of that type recomputes in backward


def count_trainable(model: nn.Module) -> int:
    return sum(v.size for _, v in tree_flatten(model.trainable_parameters()))


def count_all(model: nn.Module) -> int:
    from mlx_lm.utils import get_total_parameters

    return int(get_total_parameters(model))


def adapter_config(cfg: FinetuneConfig, num_layers: int) -> dict[str, Any]:
    """``adapter_config.json`` as mlx-lm writes it for the same run (the keys its loaders
    read, and the run's main settings under mlx-lm's names)."""
    return {
        "fine_tune_type": cfg.method.type,
        "num_layers": num_layers,
        "lora_parameters": lora_parameters(cfg),
        "model": cfg.model.path,
        "data": cfg.data.path,
        "mask_prompt": cfg.data.mask_prompt,
        "batch_size": cfg.train.global_batch,
        "max_seq_length": cfg.train.max_seq_len,
        "learning_rate": cfg.train.lr,
        "optimizer": cfg.train.optimizer,
        "grad_checkpoint": cfg.train.grad_checkpoint,
        "seed": cfg.train.seed,
    }


def trainable_weights(model: nn.Module) -> dict[str, mx.array]:
    """The trainable parameters by name: a checkpoint's weights and the adapters' file."""
    return dict(tree_flatten(model.trainable_parameters()))


def write_adapters(directory: Path, weights_file: Path, config: dict[str, Any]) -> None:
    """``adapters.safetensors`` (a hard link to ``weights_file``, which holds the same
    trainable parameters, or a copy where links fail) and ``adapter_config.json``."""
    target = directory / ADAPTERS
    if target.exists():
        target.unlink()
    try:
        os.link(weights_file, target)
    except OSError:
        target.write_bytes(weights_file.read_bytes())
    with open(directory / ADAPTER_CONFIG, "w") as f:
        json.dump(config, f, indent=4)
        f.flush()
        os.fsync(f.fileno())

"""Fine-tuning across pipeline stages: a stage's part of an mlx-lm model, read from disk
alone, its adapters by name, and the one adapters file of the whole run.

**Stage-local loading** (:func:`load_stage`). A stage holding blocks ``[start, stop)``
reads only the tensors it holds: ``model.layers.<i>.*`` of its blocks,
``model.embed_tokens.*`` on the first stage (and on the last when the embeddings are tied,
its head), ``model.norm.*`` and ``lm_head.*`` on the last. Where each tensor lives is the
safetensors index (``model.safetensors.index.json``'s ``weight_map``) or, without one,
each file's header; each tensor is read by its byte range (:func:`read_tensors`), so the
stage's peak is its share of the model, quantized weights (packed, with their scales and
biases) too. The model is mlx-lm's own class, built with the stage's number of blocks
(``num_hidden_layers``); its block ``j`` is block ``start + j`` of the whole model, and
what the stage does not hold is dropped before anything of it is evaluated (MLX draws a
module's random weights lazily: they are never made). Quantized modules are those with
``.scales`` in the files, at the config's ``quantization`` (what ``mlx_lm.load`` does).

**Method.** ``lora`` / ``dora`` / ``full`` as :func:`mlxops.finetune.model.apply_method`:
of the model's last ``num_layers`` blocks, the stage's. Adapters start from the run's seed
by name (:func:`init_adapters`): ``lora_a`` uniform in ``+-1/sqrt(in)`` as mlx-lm draws
it, from a key of ``(seed, name)``, ``lora_b`` zero; so every split of a run starts from
the same adapters, and a one-process model given them (:func:`init_adapters` on it too)
is the reference the tests compare with.

**The stage's forward** is the Llama layout's (mlx-lm's ``llama``, ``qwen2``, ``mistral``
and kin: ``model.embed_tokens``, ``model.layers``, ``model.norm``, ``lm_head`` or the tied
embedding): embedding on the first stage, the blocks with the causal mask, the final norm
and head on the last, and mlx-lm's ``default_loss`` there. A model with sliding-window
blocks is refused (:class:`PipelineModelError`).

**Adapters** are saved per stage under the whole model's names
(``adapters-stage-<s>.safetensors``); :func:`assemble` writes the run's
``adapters.safetensors`` and ``adapter_config.json`` that ``mlx_lm.load(...,
adapter_path=)`` and ``mlx_lm.generate --adapter-path`` read.
"""

from __future__ import annotations

import json
import math
import os
import re
import struct
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx.utils import tree_flatten

from .config import FinetuneConfig
from .model import ADAPTER_CONFIG, ADAPTERS, lora_parameters

INDEX = "model.safetensors.index.json"
LAYER = re.compile(r"^model\.layers\.(\d+)\.")
#: safetensors dtypes as numpy reads their bytes, and the mlx dtype they are.
DTYPES = {"F32": (np.float32, mx.float32), "F16": (np.float16, mx.float16),
          "BF16": (np.uint16, mx.bfloat16), "U32": (np.uint32, mx.uint32),
          "I32": (np.int32, mx.int32), "U8": (np.uint8, mx.uint8),
          "I8": (np.int8, mx.int8), "I64": (np.int64, mx.int64)}
STAGE_ADAPTERS = "adapters-stage-{}.safetensors"


class PipelineModelError(ValueError):
    """A model this pipeline cannot cut (the message names the file or the module)."""


def tensor_files(model_dir: Path) -> dict[str, Path]:
    """Every tensor's file: from the index where there is one, else the files' headers."""
    index = model_dir / INDEX
    if index.is_file():
        weight_map = json.loads(index.read_text())["weight_map"]
        return {k: model_dir / v for k, v in weight_map.items()}
    out = {}
    for path in sorted(model_dir.glob("*.safetensors")):
        for name in _header(path)[0]:
            out[name] = path
    return out


def _header(path: Path) -> tuple[dict[str, Any], int]:
    """A safetensors file's header (``__metadata__`` left out) and where its data starts."""
    with open(path, "rb") as f:
        (size,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(size))
    header.pop("__metadata__", None)
    return header, 8 + size


def read_tensors(path: Path, names: Sequence[str]) -> dict[str, mx.array]:
    """The tensors ``names`` of one safetensors file, each read by its own byte range."""
    header, base = _header(path)
    out = {}
    with open(path, "rb") as f:
        for name in names:
            info = header[name]
            if info["dtype"] not in DTYPES:
                raise PipelineModelError(f"{path}: {name}: dtype {info['dtype']} not read")
            np_dtype, mx_dtype = DTYPES[info["dtype"]]
            begin, end = info["data_offsets"]
            f.seek(base + begin)
            raw = np.frombuffer(f.read(end - begin), dtype=np_dtype).reshape(info["shape"])
            a = mx.array(raw)
            out[name] = a.view(mx_dtype) if mx_dtype == mx.bfloat16 else a
    return out


def holds(name: str, start: int, stop: int, first: bool, last: bool, tied: bool) -> bool:
    """Whether a stage of blocks ``[start, stop)`` holds tensor ``name``."""
    found = LAYER.match(name)
    if found:
        return start <= int(found.group(1)) < stop
    if name.startswith("model.embed_tokens."):
        return first or (last and tied)
    if name.startswith(("model.norm.", "lm_head.")):
        return last
    return False


def to_local(name: str, start: int) -> str:
    """``model.layers.<start + j>.x`` -> ``model.layers.<j>.x`` (others unchanged)."""
    return LAYER.sub(lambda m: f"model.layers.{int(m.group(1)) - start}.", name, count=1)


def to_global(name: str, start: int) -> str:
    return LAYER.sub(lambda m: f"model.layers.{int(m.group(1)) + start}.", name, count=1)


def load_stage(model_dir: str | Path, start: int, stop: int, first: bool, last: bool
               ) -> tuple[nn.Module, dict[str, Any], int]:
    """``(model, config, bytes read)``: blocks ``[start, stop)`` of the mlx-lm model in
    ``model_dir`` and the ends this stage holds, read from disk alone (see the module)."""
    from mlx_lm.utils import _get_classes

    model_dir = Path(model_dir)
    config = json.loads((model_dir / "config.json").read_text())
    tied = bool(config.get("tie_word_embeddings", True))
    files = tensor_files(model_dir)
    wanted: dict[Path, list[str]] = {}
    for name, path in files.items():
        if holds(name, start, stop, first, last, tied):
            wanted.setdefault(path, []).append(name)
    weights: dict[str, mx.array] = {}
    for path, names in wanted.items():
        weights.update({to_local(k, start): v for k, v in read_tensors(path, names).items()})
    read = sum(v.nbytes for v in weights.values())
    model_class, args_class = _get_classes(config)
    model = model_class(args_class.from_dict({**config, "num_hidden_layers": stop - start}))
    if any(getattr(layer, "use_sliding", False) for layer in model.model.layers):
        raise PipelineModelError(f"{model_dir / 'config.json'}: sliding-window blocks: "
                                 "not cut into pipeline stages")
    if hasattr(model, "sanitize"):
        weights = model.sanitize(weights)
    quantization = config.get("quantization")
    if quantization:
        nn.quantize(model, group_size=quantization["group_size"], bits=quantization["bits"],
                    mode=quantization.get("mode", "affine"),
                    class_predicate=lambda p, m: hasattr(m, "to_quantized")
                    and f"{p}.scales" in weights)
    inner = model.model
    if not (first or (last and tied)):
        inner.embed_tokens = None
    if not last:
        inner.norm = None
        if "lm_head" in model:
            model.lm_head = None
    model.load_weights(list(weights.items()), strict=False)
    held = {k for k, _ in tree_flatten(model.parameters())}
    if held != set(weights):
        lacking = sorted(held - set(weights)) or sorted(set(weights) - held)
        raise PipelineModelError(f"{model_dir}: {to_global(lacking[0], start)}: in the "
                                 "stage's model but not in the files, or the reverse")
    model.eval()
    mx.eval(model.parameters())
    return model, config, read


def adapted_blocks(layers: int, num_layers: int, start: int, stop: int) -> int:
    """How many of a stage's blocks ``[start, stop)`` the method adapts: the last
    ``num_layers`` of the ``layers`` (``-1``: all) that are the stage's."""
    n = layers if num_layers == -1 else min(num_layers, layers)
    return max(0, stop - max(start, layers - n))


def apply_stage_method(model: nn.Module, cfg: FinetuneConfig, layers: int, start: int,
                       stop: int) -> int:
    """Freeze the stage's model and make trainable what ``cfg.method`` trains of its
    blocks (``layers``: the whole model's); returns how many of them it adapts."""
    from mlx_lm.tuner.utils import linear_to_lora_layers

    method = cfg.method
    k = adapted_blocks(layers, method.num_layers, start, stop)
    model.freeze()
    if k == 0:   # mlx-lm's layers[-0:] would be every block
        return 0
    if method.type == "full":
        for layer in model.model.layers[-k:]:
            layer.unfreeze()
    else:
        linear_to_lora_layers(model, k, lora_parameters(cfg),
                              use_dora=method.type == "dora")
    return k


def first_trained_stage(counts: Sequence[int], num_layers: int) -> int:
    """The first stage of a split (``counts[s]`` blocks to stage ``s``) holding a block the
    method trains (the last ``num_layers``, ``-1``: all): the stages before it run
    forwards only (:func:`mlxops.trainer.schedule.schedule`)."""
    layers = sum(counts)
    lowest = 0 if num_layers == -1 else max(0, layers - num_layers)
    start = 0
    for s, n in enumerate(counts):
        if start + n > lowest:
            return s
        start += n
    return len(counts) - 1


def init_adapters(model: nn.Module, seed: int, start: int = 0) -> None:
    """Every ``lora_a`` drawn from ``(seed, its name in the whole model)``, uniform in
    ``+-1/sqrt(in)`` as mlx-lm draws it; every ``lora_b`` zero."""
    new = []
    for name, value in tree_flatten(model.trainable_parameters()):
        whole = to_global(name, start)
        if name.endswith(".lora_a"):
            key = mx.random.key(zlib.crc32(f"{seed}:{whole}".encode()))
            bound = 1 / math.sqrt(value.shape[0])
            new.append((name, mx.random.uniform(-bound, bound, value.shape, key=key)))
        elif name.endswith(".lora_b"):
            new.append((name, mx.zeros_like(value)))
    model.load_weights(new, strict=False)
    mx.eval(model.parameters())


class FinetuneStage:
    """A stage of an mlx-lm model as the pipeline step drives it: batches are
    ``(tokens, lengths)``, mlx-lm's ``default_loss`` on the last stage; or, as the run
    loop gives them (:mod:`.pipelinerun`), ``(tokens, lengths, weight, row seeds)``: the
    loss is then the sum of the tokens' losses times ``weight`` (fine-tuning's objective,
    :mod:`.objective`) and the seeds drive the adapters' dropout (:mod:`.dropout`)."""

    def __init__(self, model: nn.Module, config: dict[str, Any], start: int, first: bool,
                 last: bool, seeds: Any = None):
        self.model, self.start, self.first, self.last = model, start, first, last
        self.seeds = seeds   # the model's dropout.RowSeeds, or None
        self.dims = int(config["hidden_size"])
        self.tied = bool(config.get("tie_word_embeddings", True))
        norm = next((v for k, v in tree_flatten(model.parameters())
                     if k.endswith("norm.weight")), None)
        self.dtype = norm.dtype if norm is not None else mx.float32

    def trainable(self) -> dict[str, mx.array]:
        return {to_global(k, self.start): v
                for k, v in tree_flatten(self.model.trainable_parameters())}

    def forward(self, params: dict[str, mx.array], x: mx.array | None,
                batch: Sequence[mx.array]) -> mx.array:
        from mlx_lm.models.base import create_attention_mask

        from mlxops.trainer.pipeline import shaped

        local = {to_local(k, self.start): v for k, v in params.items()}
        master = self.model.trainable_parameters()
        self.model.update(shaped(master, local))
        tokens, lengths = batch[0], batch[1]
        inner = self.model.model
        h = inner.embed_tokens(tokens[:, :-1]) if x is None else x
        mask = create_attention_mask(h, None)
        if self.seeds is not None and len(batch) > 3:
            self.seeds.value = batch[3]
        try:
            for layer in inner.layers:
                h = layer(h, mask, cache=None)
        finally:
            if self.seeds is not None:
                self.seeds.value = None
        if self.last:
            h = inner.norm(h)
            logits = inner.embed_tokens.as_linear(h) if self.tied else self.model.lm_head(h)
            targets = tokens[:, 1:]
            steps = mx.arange(1, targets.shape[1] + 1)
            keep = mx.logical_and(steps >= lengths[:, 0:1], steps <= lengths[:, 1:])
            ce = nn.losses.cross_entropy(logits, targets) * keep
            if len(batch) > 2:   # the sum of the tokens' losses, weighted
                h = ce.astype(mx.float32).sum() * batch[2]
            else:
                h = ce.astype(mx.float32).sum() / keep.sum()   # mlx-lm's default_loss
        self.model.update(master)
        return h

    def boundary(self, batch: Sequence[mx.array]) -> tuple[tuple[int, ...], mx.Dtype]:
        tokens = batch[0]
        return (tokens.shape[0], tokens.shape[1] - 1, self.dims), self.dtype


def save_adapters(directory: Path, stage: int, model: nn.Module, start: int) -> Path:
    """Stage ``stage``'s trainable weights under the whole model's names."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / STAGE_ADAPTERS.format(stage)
    tmp = directory / f".tmp-{stage}-{os.getpid()}.safetensors"
    mx.save_safetensors(str(tmp), {to_global(k, start): v for k, v in
                                   tree_flatten(model.trainable_parameters())})
    os.replace(tmp, path)
    return path


def assemble(stage_files: Sequence[Path], out: Path, adapter_config: dict[str, Any]) -> Path:
    """One ``adapters.safetensors`` of every stage's adapters and ``adapter_config.json``
    in ``out``, written as one set (a directory renamed into place)."""
    weights: dict[str, mx.array] = {}
    for path in stage_files:
        for k, v in mx.load(str(path)).items():
            if k in weights:
                raise PipelineModelError(f"{path}: {k}: also in another stage's adapters")
            weights[k] = v
    out = Path(out)
    tmp = out.with_name(f".tmp-{out.name}-{os.getpid()}")
    tmp.mkdir(parents=True)
    mx.save_safetensors(str(tmp / ADAPTERS), weights)
    (tmp / ADAPTER_CONFIG).write_text(json.dumps(adapter_config, indent=4) + "\n")
    if out.exists():
        for p in out.iterdir():
            p.unlink()
        out.rmdir()
    os.replace(tmp, out)
    return out

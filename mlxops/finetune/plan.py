"""Memory plan of fine-tuning: what one rank holds at its peak, and the accumulation /
checkpointing that keep it within its node's budget.

Standard library only: ``mlxops plan JOB`` and ``mlxops check --job`` run it on the
controller, from the base model's own files (no mlx): ``config.json`` and the safetensors
headers (8 bytes of length, then JSON: every tensor's dtype and shape), so the figures are
the model's, quantized or not, whatever its architecture's names.

**The model, read from its headers.** The base weights' bytes are the tensors' bytes (the
quantized ones packed, with their scales and biases). A *linear layer* of block ``i`` is a
2-D ``model.layers.<i>.<path>.weight``; its input width is the second dimension, times
``32 / bits`` when it is packed (``uint32``; ``bits`` from ``config.json``'s
``quantization``, per module where it says). Width D, blocks L, heads H and vocabulary V
come from ``config.json`` (``hidden_size``, ``num_hidden_layers``,
``num_attention_heads``, ``vocab_size``); the MLP width F is the widest linear output of a
block.

**What trains** (per rank, over the last ``n`` = ``method.num_layers`` blocks):
``lora``: each adapted linear (every linear of the block, or ``method.keys``) gets A (in x
r) and B (r x out) in float32, r(in + out) parameters; ``dora`` also its output norms (out);
``full``: every tensor of those blocks, in its own dtype. Gradients take the trainable
bytes again; the optimizer's state twice that (AdamW's and Adam's two moments; SGD's one).

**The peak** is the larger of two moments, in bytes (w = the model's activation bytes per
element: 2 in bfloat16 / float16, 4 in float32; N = micro-batch x ``max_seq_len`` tokens,
the longest a micro-batch can be; T = ``max_seq_len``)::

    base + trainable + state                     alive all along
  + G x trainable                                gradients already made (backward)
  + n x layer, layer = w N (A_D D + A_F F + A_S H T)   what each block the gradients pass
                                                 through keeps for its backward; the blocks
                                                 below the adapted ones keep nothing
    (grad_checkpoint: n x CHECKPOINT w N D + (1 + RECOMPUTED) x layer)
  + w N dropout_in                               (dropout > 0) the adapters' input masks
  + w N (X_D D + X_F F + X_S H T)                the block being differentiated
  + LOGITS N V                                   the float32 logits, softmax and gradient

where the blocks' two terms (``n x layer`` and the block being differentiated) are
weighted by :data:`BLOCK_ACTIVATIONS` of the method: an mlx-lm block with grouped-query
attention keeps less than the bundled trainer's block the weights were fitted to, and a
DoRA block more (its magnitude-normalised outputs are kept for the backward pass).

or, at the optimizer's update: base + trainable + state + (U / 4) x trainable bytes, plus
the all-reduce's buffers (R / 4 x trainable bytes) with two ranks or more.

The per-token weights (A_*, X_*, CHECKPOINT, RECOMPUTED, LOGITS, G, U, R) are the bundled
trainer's, fitted to its measured peaks (:mod:`mlxops.trainer.plan`): a block of an
mlx-lm model is the same computation (norms, q/k/v, RoPE, attention, SwiGLU).
:data:`BLOCK_ACTIVATIONS` was fitted to 12 runs of ``python -m mlxops.finetune`` (one
rank, 4 examples of 128, 256 and 512 tokens; LoRA, DoRA and full on a 4-block 256-wide
llama with 4 of 8 key-value heads, LoRA on its 4-bit qwen2 twin; built by
mlxops/devtools/tinymodels.py): the plan is then 0.97 to 1.06 times the measured peak
there. ``tests/finetune/test_plan_measured.py`` holds 4 of them (256 tokens) to the
trainer's bounds (within 15% of the peak, never more than 10% below), and a real
checkpoint's bytes to the disk plan; ``benchmarks/finetune_memory.py`` runs the grid
(micro-batches, checkpointing).
The budget is the trainer plan's (:func:`mlxops.trainer.plan.budget_bytes`).

**Disk** (:func:`plan_disk`, ``mlxops check --job``): a checkpoint holds the trainable
weights (``weights.safetensors``), the optimizer state (as above) and the adapters
(``adapters.safetensors``, a hard link to the weights where the file system allows one,
counted as a copy); ``ckpt/`` holds ``train.keep`` of them and the next, written before
the oldest is pruned; ``best/`` (when the run validates) one and the next. The base model
and the data are placed beside them by pre-flight (``mlxops check`` counts the bytes a
node still lacks).
"""

from __future__ import annotations

import json
import math
import re
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mlxops.trainer import plan as trainer_plan
from mlxops.trainer import plansearch
from mlxops.trainer.plansearch import PlanFields

from .config import FinetuneConfig

DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "U32": 4,
               "I16": 2, "U16": 2, "I8": 1, "U8": 1, "BOOL": 1}
#: Activation bytes per element by the dtype of the model's unpacked weights.
ACTIVATION_BYTES = {"F32": 4, "F16": 2, "BF16": 2}
BLOCK = re.compile(r"^model\.layers\.(\d+)\.(.+)\.weight$")
#: Bytes of optimizer state per trainable byte.
OPTIMIZER_STATE = {"adamw": 2, "adam": 2, "sgd": 1}
#: The weight of the blocks' activations by method (the module docstring), fitted to the
#: measured peaks there: LoRA and full 0.82 (their plan/peak went 1.16-1.27 without it),
#: DoRA 1.0 (1.00-1.02 without it).
BLOCK_ACTIVATIONS = {"lora": 0.82, "full": 0.82, "dora": 1.0}


class ModelError(ValueError):
    """A model directory this plan cannot read (its message names the file)."""


@dataclass(frozen=True)
class Linear:
    block: int
    path: str                      # e.g. "self_attn.q_proj"
    inputs: int
    outputs: int
    weight_bytes: int              # per element of its unpacked weight: its dtype's


@dataclass
class ModelShape:
    """What the plan needs of a base model, from its files."""

    base_bytes: int                # every tensor, as stored (packed when quantized)
    params: int                    # parameters, unpacked
    dims: int
    layers: int
    heads: int
    vocab: int
    mlp: int                       # the widest linear output of a block
    activation_bytes: int          # w: bytes per activation element
    quantized_bits: int | None
    linears: list[Linear] = field(default_factory=list)
    block_bytes: dict[int, int] = field(default_factory=dict)   # block -> its tensors' bytes
    block_params: dict[int, int] = field(default_factory=dict)


def read_header(path: Path) -> dict[str, Any]:
    """A safetensors file's header: ``{name: {"dtype", "shape", ...}}``."""
    with open(path, "rb") as f:
        raw = f.read(8)
        if len(raw) != 8:
            raise ModelError(f"{path}: not a safetensors file")
        (size,) = struct.unpack("<Q", raw)
        try:
            header = json.loads(f.read(size))
        except ValueError:
            raise ModelError(f"{path}: not a safetensors file") from None
    header.pop("__metadata__", None)
    return header


def _bits(quantization: dict[str, Any] | None, module: str) -> int | None:
    if not quantization:
        return None
    own = quantization.get(module)
    if isinstance(own, dict) and "bits" in own:
        return int(own["bits"])
    return int(quantization["bits"]) if "bits" in quantization else None


def read_model(directory: str | Path) -> ModelShape:
    """The shape of the model in ``directory`` (``config.json``, ``*.safetensors``)."""
    directory = Path(directory)
    try:
        config = json.loads((directory / "config.json").read_text())
    except (OSError, ValueError) as exc:
        raise ModelError(f"{directory / 'config.json'}: {exc}") from None
    config = {**config.get("text_config", {}), **config}
    quantization = config.get("quantization") or config.get("quantization_config")
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise ModelError(f"{directory}: no *.safetensors")
    tensors: dict[str, dict[str, Any]] = {}
    for path in files:
        tensors.update(read_header(path))
    base = params = 0
    act = None
    linears, block_bytes, block_params = [], {}, {}
    for name, info in tensors.items():
        shape, dtype = info["shape"], info["dtype"]
        count = math.prod(shape)
        nbytes = count * DTYPE_BYTES.get(dtype, 4)
        base += nbytes
        module = name.rsplit(".", 1)[0]
        bits = _bits(quantization, module) if dtype == "U32" else None
        unpacked = count * 32 // bits if bits else count
        if not name.endswith((".scales", ".biases")):
            params += unpacked
        if act is None and dtype in ACTIVATION_BYTES and len(shape) == 1:
            act = ACTIVATION_BYTES[dtype]   # a norm's weight: the model's own dtype
        found = re.match(r"^model\.layers\.(\d+)\.", name)
        if found:
            i = int(found.group(1))
            block_bytes[i] = block_bytes.get(i, 0) + nbytes
            if not name.endswith((".scales", ".biases")):
                block_params[i] = block_params.get(i, 0) + unpacked
        linear = BLOCK.match(name)
        if linear and len(shape) == 2:
            inputs = shape[1] * 32 // bits if bits else shape[1]
            element = 2 if bits else DTYPE_BYTES.get(dtype, 4)
            linears.append(Linear(int(linear.group(1)), linear.group(2), inputs, shape[0],
                                  element))
    try:
        dims, layers = int(config["hidden_size"]), int(config["num_hidden_layers"])
        heads, vocab = int(config["num_attention_heads"]), int(config["vocab_size"])
    except (KeyError, TypeError, ValueError) as exc:
        raise ModelError(f"{directory / 'config.json'}: missing {exc}") from None
    mlp = max((x.outputs for x in linears), default=4 * dims)
    return ModelShape(base, params, dims, layers, heads, vocab, mlp, act or 4,
                      _bits(quantization, "") if quantization else None, linears,
                      block_bytes, block_params)


def adapted(shape: ModelShape, cfg: FinetuneConfig) -> list[Linear]:
    """The linears ``method`` adapts: of the last ``num_layers`` blocks, ``keys`` or all."""
    n = shape.layers if cfg.method.num_layers == -1 else min(cfg.method.num_layers,
                                                              shape.layers)
    keys = cfg.method.keys
    return [x for x in shape.linears if x.block >= shape.layers - n
            and (keys is None or x.path in keys)]


@dataclass
class FinetunePlan(PlanFields):
    """One rank's plan, in bytes: the fields every plan has
    (:class:`~mlxops.trainer.plansearch.PlanFields`; ``params`` the base model's,
    unpacked) and fine-tuning's own."""

    base_bytes: int            # the base weights as stored (quantized: packed)
    quantized_bits: int | None
    trainable_params: int
    trainable_bytes: int       # adapters (float32), or the trained blocks
    seq_len: int


def _trainable(shape: ModelShape, cfg: FinetuneConfig) -> tuple[int, int]:
    """(parameters, bytes) that train."""
    m = cfg.method
    if m.type == "full":
        n = shape.layers if m.num_layers == -1 else min(m.num_layers, shape.layers)
        blocks = range(shape.layers - n, shape.layers)
        return (sum(shape.block_params.get(b, 0) for b in blocks),
                sum(shape.block_bytes.get(b, 0) for b in blocks))
    params = nbytes = 0
    for x in adapted(shape, cfg):
        lora = m.rank * (x.inputs + x.outputs)
        params += lora + (x.outputs if m.type == "dora" else 0)
        nbytes += 4 * lora + (x.weight_bytes * x.outputs if m.type == "dora" else 0)
    return params, nbytes


def estimate(shape: ModelShape, cfg: FinetuneConfig, micro: int, world: int = 1,
             grad_checkpoint: bool | None = None) -> tuple[int, int, int]:
    """``(alive, compute, update)`` bytes of one rank with ``micro`` examples a pass."""
    P = trainer_plan
    ckpt = cfg.train.grad_checkpoint if grad_checkpoint is None else grad_checkpoint
    _, trainable = _trainable(shape, cfg)
    state = OPTIMIZER_STATE.get(cfg.train.optimizer, 2) * trainable
    alive = shape.base_bytes + (0 if cfg.method.type == "full" else trainable) + state
    w, t = shape.activation_bytes, cfg.train.max_seq_len
    n_tok, d, f, ht = micro * t, shape.dims, shape.mlp, shape.heads * t
    n = shape.layers if cfg.method.num_layers == -1 else min(cfg.method.num_layers,
                                                              shape.layers)
    layer = w * n_tok * (P.A_D * d + P.A_F * f + P.A_S * ht)
    if ckpt:
        layers = (1 + P.RECOMPUTED * (n > 1)) * layer + n * w * n_tok * d * P.CHECKPOINT
    else:
        layers = n * layer
    dropout = 0
    if cfg.method.dropout > 0 and cfg.method.type != "full":
        dropout = w * n_tok * sum(x.inputs for x in adapted(shape, cfg))
    blocks = BLOCK_ACTIVATIONS.get(cfg.method.type, 1.0) * (
        layers + w * n_tok * (P.X_D * d + P.X_F * f + P.X_S * ht))
    compute = P.G / 4 * trainable + blocks + dropout + P.LOGITS * n_tok * shape.vocab
    update = P.U / 4 * trainable
    if world > 1:
        wire = P.R_BF16 if cfg.train.grad_reduce_dtype == "bfloat16" else P.R
        update += wire / 4 * trainable
    return int(alive), int(alive + compute), int(alive + update)


@dataclass(frozen=True)
class DiskPlan:
    """What a fine-tuning run writes under its node root at the most, in bytes."""

    checkpoint_bytes: int      # one checkpoint: weights, optimizer state, adapters
    checkpoints: int           # how many exist at once at the most (ckpt/ and best/)

    @property
    def total_bytes(self) -> int:
        return self.checkpoint_bytes * self.checkpoints


def plan_disk(shape: ModelShape, cfg: FinetuneConfig) -> DiskPlan:
    """The checkpoints of a run of ``cfg`` on ``shape`` (see the module's **Disk**)."""
    _, trainable = _trainable(shape, cfg)
    state = OPTIMIZER_STATE.get(cfg.train.optimizer, 2) * trainable
    kept = cfg.train.keep + 1 + (2 if cfg.train.eval_every else 0)
    return DiskPlan(checkpoint_bytes=2 * trainable + state, checkpoints=kept)


def plan_finetune(cfg: FinetuneConfig, shape: ModelShape, memory_bytes: int, world_size: int,
                  ranks_per_node: int = 1, per_rank: int | None = None,
                  working_set: int | None = None) -> FinetunePlan:
    """Plan one rank on a node (as :func:`mlxops.trainer.plan.plan_memory`): its
    ``per_rank`` examples a step (default ``global_batch / world_size``, rounded up) cut
    into micro-batches of at most ``train.micro_batch``, or smaller as the out-of-memory
    back-off makes them, by the shared search (:mod:`mlxops.trainer.plansearch`); ``fits``
    is False when one example a pass with checkpointing does not."""
    t = cfg.train
    budget, source = trainer_plan.budget_bytes(memory_bytes, working_set, ranks_per_node)
    per_rank = per_rank or max(1, -(-t.global_batch // world_size))
    trainable_params, trainable = _trainable(shape, cfg)
    state = OPTIMIZER_STATE.get(cfg.train.optimizer, 2) * trainable
    choice = plansearch.search(
        plansearch.finetune_micro_batches(per_rank, t.micro_batch), t.grad_checkpoint,
        lambda micro, ckpt: max(estimate(shape, cfg, micro, world_size, ckpt)[1:]), budget)
    micro, ckpt = choice.micro_batch, choice.grad_checkpoint
    alive, compute, update = estimate(shape, cfg, micro, world_size, ckpt)
    return FinetunePlan(
        params=shape.params, base_bytes=shape.base_bytes,
        quantized_bits=shape.quantized_bits, trainable_params=trainable_params,
        trainable_bytes=trainable, grad_bytes=trainable, optimizer_bytes=state,
        activation_bytes=compute - alive, update_bytes=update - alive,
        total_bytes=max(compute, update), budget_bytes=budget, budget_from=source,
        micro_batch=micro, accumulation=-(-per_rank // micro), grad_checkpoint=ckpt,
        fits=choice.fits, world_size=world_size, seq_len=t.max_seq_len)

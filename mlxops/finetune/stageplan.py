"""A fine-tuning model as pipeline stages see it: the memory plan's terms per block.

Standard library only (the controller splits a job's model by memory before any host is
touched): the parts of :class:`mlxops.trainer.stages.ModelCosts`, from the base model's
files as :mod:`mlxops.finetune.plan` reads them. A block ``b`` costs::

    alive      its tensors' bytes as stored (+ its adapters, float32) + optimizer state
    grads      G/4 x its trainable bytes
    update     U/4 x its trainable bytes
    activation w N (A_D D + A_F F + A_S H T) (+ w N x its adapted inputs with dropout)
               (grad_checkpoint: CHECKPOINT w N D; one block recomputed is transient)

the embedding (first stage) and the final norm and head (last stage; a tied embedding's
copy when there are two stages or more) their bytes as stored (frozen: nothing else),
``transient`` the block being differentiated and ``loss`` the logits, as the plan has them.
With one stage this is :func:`mlxops.finetune.plan.estimate`,
term for term (tests/finetune/test_pipeline_stageplan.py).

A block below the adapted ones keeps no activation (as in the one-process plan): the
stages before the first that trains run forwards only, and that stage differentiates its
own weights alone, not its input (``first_backward`` of :mod:`mlxops.trainer.pipeline`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from mlxops.trainer import plan as P
from mlxops.trainer.stages import ModelCosts, Part

from .config import FinetuneConfig
from .plan import (
    BLOCK_ACTIVATIONS,
    DTYPE_BYTES,
    OPTIMIZER_STATE,
    ModelShape,
    adapted,
    read_header,
)


@dataclass(frozen=True)
class Ends:
    """The bytes of what is not a block, as stored."""

    embed: int        # model.embed_tokens.*
    head: int         # model.norm.* and lm_head.*
    tied: bool        # the embedding is the head (tie_word_embeddings)


def read_ends(directory: str | Path) -> Ends:
    """:class:`Ends` of the model in ``directory`` (its safetensors headers, config.json)."""
    import json

    directory = Path(directory)
    config = json.loads((directory / "config.json").read_text())
    embed = head = 0
    for path in sorted(directory.glob("*.safetensors")):
        for name, info in read_header(path).items():
            n = 1
            for s in info["shape"]:
                n *= s
            nbytes = n * DTYPE_BYTES.get(info["dtype"], 4)
            if name.startswith("model.embed_tokens."):
                embed += nbytes
            elif name.startswith(("model.norm.", "lm_head.")):
                head += nbytes
    return Ends(embed, head, bool(config.get("tie_word_embeddings", True)))


def finetune_costs(shape: ModelShape, ends: Ends, cfg: FinetuneConfig, micro: int,
                   grad_checkpoint: bool | None = None) -> ModelCosts:
    """The model of ``shape`` as parts, ``micro`` examples a micro-batch of
    ``train.max_seq_len`` tokens (see the module)."""
    m = cfg.method
    ckpt = cfg.train.grad_checkpoint if grad_checkpoint is None else grad_checkpoint
    state_per = OPTIMIZER_STATE.get(cfg.train.optimizer, 2)
    w, t = shape.activation_bytes, cfg.train.max_seq_len
    n_tok, d, f, ht = micro * t, shape.dims, shape.mlp, shape.heads * t
    layer = w * n_tok * (P.A_D * d + P.A_F * f + P.A_S * ht)
    kept = w * n_tok * d * P.CHECKPOINT if ckpt else layer
    n = shape.layers if m.num_layers == -1 else min(m.num_layers, shape.layers)
    trained = {b: 0 for b in range(shape.layers)}
    dropout_in = {b: 0 for b in range(shape.layers)}
    if m.type == "full":
        for b in range(shape.layers - n, shape.layers):
            trained[b] = shape.block_bytes.get(b, 0)
    else:
        for x in adapted(shape, cfg):
            trained[x.block] += 4 * m.rank * (x.inputs + x.outputs) + (
                x.weight_bytes * x.outputs if m.type == "dora" else 0)
            dropout_in[x.block] += x.inputs
    # The blocks' activations weighted by method, as the one-process plan weights them.
    weight = BLOCK_ACTIVATIONS.get(m.type, 1.0)
    blocks = []
    for b in range(shape.layers):
        tb = trained[b]
        alive = shape.block_bytes.get(b, 0) + (0 if m.type == "full" else tb) + state_per * tb
        dropout = w * n_tok * dropout_in[b] if m.dropout > 0 and m.type != "full" else 0
        # A block below the trained ones keeps nothing: its stage's backward (if it has
        # one) does not reach it (mlxops/trainer/pipeline.py, ``first_backward``).
        below = b < shape.layers - n
        work = n_tok * (2 if below else 6) * shape.block_params.get(b, 0)
        blocks.append(Part(alive, P.G / 4 * tb, P.U / 4 * tb,
                           0 if below else weight * kept + dropout, work))
    transient = w * n_tok * (P.X_D * d + P.X_F * f + P.X_S * ht)
    if ckpt:
        transient += (1 + P.RECOMPUTED) * layer
    transient *= weight
    return ModelCosts(
        layers=tuple(blocks), embed=Part(alive=ends.embed),
        head=Part(alive=ends.head, work=n_tok * 6 * shape.vocab * d), transient=transient,
        loss=P.LOGITS * n_tok * shape.vocab,
        tied=Part(alive=ends.embed) if ends.tied else Part())

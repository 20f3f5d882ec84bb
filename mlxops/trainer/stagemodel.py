"""The bundled trainer's model cut into a pipeline stage: its block of layers and ends.

A stage holding layers ``[start, stop)`` is the :class:`~mlxops.trainer.model.Transformer`
restricted to them: the embedding on the first stage, the final norm and the head (or,
tied, a copy of the embedding) on the last, the blocks in between, every parameter under
its name in the whole model (``blocks.7.attn.qkv.weight``), so checkpoints and the
one-process model exchange weights by name. Its computation is the Transformer's, op for
op, on the stage's part.

**Initialisation by part.** A stage cannot draw its weights from one random stream the way
``Transformer(cfg)`` does without drawing every other stage's too. Each part (the
embedding, block ``i``, the final norm, the head) is drawn from its own seed,
``seed * PART_STRIDE + part``, so every split of a run starts from the same weights, and
:func:`whole_model` builds the one-process model with them. (A pipeline run therefore
starts from other weights than a data-parallel run with the same ``train.seed``.)
"""

from __future__ import annotations

from collections.abc import Sequence

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten

from .config import ModelConfig
from .model import Block, Transformer, _checkpointed, attention_mask
from .pipeline import shaped

#: Seeds of the parts of one run are ``seed * PART_STRIDE + part``: apart for any model
#: of fewer than this many layers.
PART_STRIDE = 1 << 20
EMBED, NORM, HEAD = 0, 1, 2   # the parts besides the blocks; block i is part 3 + i


def _seeded(seed: int, part: int, make):
    mx.random.seed(seed * PART_STRIDE + part)
    module = make()
    mx.eval(module.parameters())
    return module


class StageModel(nn.Module):
    """Layers ``[start, stop)`` of a model of ``cfg``, with the ends a stage holds."""

    def __init__(self, cfg: ModelConfig, start: int, stop: int, first: bool, last: bool,
                 seed: int = 0, grad_checkpoint: bool = False):
        super().__init__()
        self.first, self.last, self.start, self.stop = first, last, start, stop
        self.tied, self.window = cfg.tie_embeddings, cfg.window
        self.grad_checkpoint = grad_checkpoint
        if first or (last and cfg.tie_embeddings):
            self.embed = _seeded(seed, EMBED, lambda: nn.Embedding(cfg.vocab_size, cfg.dims))
        self.blocks = {str(i): _seeded(seed, 3 + i, lambda: Block(cfg))
                       for i in range(start, stop)}
        if last:
            self.norm = _seeded(seed, NORM, lambda: nn.RMSNorm(cfg.dims, eps=cfg.norm_eps))
            if not cfg.tie_embeddings:
                self.head = _seeded(seed, HEAD, lambda: nn.Linear(cfg.dims, cfg.vocab_size,
                                                                  bias=False))

    def __call__(self, x: mx.array, length: int) -> mx.array:
        """Tokens (first stage) or the previous stage's output through this stage: its
        output, logits on the last stage. ``length``: the sequence length (the mask)."""
        h = self.embed(x) if self.first else x
        mask = attention_mask(length, self.window)
        for i in range(self.start, self.stop):
            block = self.blocks[str(i)]
            h = _checkpointed(block, h, mask) if self.grad_checkpoint else block(h, mask)
        if not self.last:
            return h
        h = self.norm(h)
        return self.embed.as_linear(h) if self.tied else self.head(h)


class TrainerStage:
    """A :class:`StageModel` as the pipeline step drives it (:class:`.pipeline.Stage`):
    batches are ``(inputs, targets)``, the loss the trainer's mean cross-entropy."""

    def __init__(self, model: StageModel, dims: int, dtype: mx.Dtype = mx.float32):
        self.model, self.dims, self.dtype = model, dims, dtype
        self.first, self.last = model.first, model.last

    def trainable(self) -> dict[str, mx.array]:
        return dict(tree_flatten(self.model.trainable_parameters()))

    def forward(self, params: dict[str, mx.array], x: mx.array | None,
                batch: Sequence[mx.array]) -> mx.array:
        if self.dtype != mx.float32:
            params = {k: v.astype(self.dtype) for k, v in params.items()}
        master = self.model.trainable_parameters()
        self.model.update(shaped(master, params))
        inputs, targets = batch
        out = self.model(inputs if x is None else x, inputs.shape[1])
        self.model.update(master)   # the float32 weights, not the traced copy
        if not self.last:
            return out
        return nn.losses.cross_entropy(out.astype(mx.float32), targets, reduction="mean")

    def boundary(self, batch: Sequence[mx.array]) -> tuple[tuple[int, ...], mx.Dtype]:
        inputs = batch[0]
        return (inputs.shape[0], inputs.shape[1], self.dims), self.dtype


def whole_model(cfg: ModelConfig, seed: int = 0) -> Transformer:
    """The one-process :class:`Transformer` with the weights every split starts from."""
    model = Transformer(cfg)
    whole = StageModel(cfg, 0, cfg.layers, True, True, seed)
    model.load_weights(list(tree_flatten(whole.parameters())), strict=True)
    mx.eval(model.parameters())
    return model

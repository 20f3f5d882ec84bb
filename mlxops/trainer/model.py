"""Decoder-only transformer LM: RMSNorm, RoPE, SwiGLU, pre-norm residual blocks.

Attention is causal; with ``model.window = w > 0`` it is also local: query ``i`` attends
to keys ``j`` with ``i - w < j <= i`` (itself and the ``w - 1`` tokens before it), through
the same fused kernel (``mx.fast.scaled_dot_product_attention``) given a boolean mask
instead of ``"causal"``. A window at least the sequence's length is plain causal
attention, and takes the ``"causal"`` path.
"""

from __future__ import annotations

import math

import mlx.core as mx
import mlx.nn as nn

from .config import ModelConfig


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.heads = cfg.heads
        self.head_dim = cfg.dims // cfg.heads
        self.scale = 1.0 / math.sqrt(self.head_dim)
        self.qkv = nn.Linear(cfg.dims, 3 * cfg.dims, bias=False)
        self.out = nn.Linear(cfg.dims, cfg.dims, bias=False)
        self.rope = nn.RoPE(self.head_dim, traditional=False, base=cfg.rope_base)
        self.window = cfg.window

    def __call__(self, x: mx.array, mask: str | mx.array | None = None) -> mx.array:
        """``mask``: the model's, made once for every layer (:func:`attention_mask`);
        None makes this layer's own."""
        b, t, d = x.shape
        q, k, v = mx.split(self.qkv(x), 3, axis=-1)
        # (b, t, d) -> (b, heads, t, head_dim)
        q, k, v = (a.reshape(b, t, self.heads, self.head_dim).transpose(0, 2, 1, 3)
                   for a in (q, k, v))
        q, k = self.rope(q), self.rope(k)
        if mask is None:
            mask = attention_mask(t, self.window)
        o = mx.fast.scaled_dot_product_attention(q, k, v, scale=self.scale, mask=mask)
        return self.out(o.transpose(0, 2, 1, 3).reshape(b, t, d))


def attention_mask(length: int, window: int) -> str | mx.array:
    """What the fused attention takes: ``"causal"``, or the window's boolean mask."""
    return window_mask(length, window) if 0 < window < length else "causal"


def window_mask(length: int, window: int) -> mx.array:
    """``(length, length)`` booleans: True where query ``i`` may attend to key ``j``,
    ``i - window < j <= i``."""
    i = mx.arange(length)[:, None]
    j = mx.arange(length)[None, :]
    return (j <= i) & (j > i - window)


class SwiGLU(nn.Module):
    def __init__(self, dims: int, hidden: int):
        super().__init__()
        self.gate = nn.Linear(dims, hidden, bias=False)
        self.up = nn.Linear(dims, hidden, bias=False)
        self.down = nn.Linear(hidden, dims, bias=False)

    def __call__(self, x: mx.array) -> mx.array:
        return self.down(nn.silu(self.gate(x)) * self.up(x))


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.attn_norm = nn.RMSNorm(cfg.dims, eps=cfg.norm_eps)
        self.attn = Attention(cfg)
        self.mlp_norm = nn.RMSNorm(cfg.dims, eps=cfg.norm_eps)
        self.mlp = SwiGLU(cfg.dims, cfg.hidden())

    def __call__(self, x: mx.array, mask: str | mx.array | None = None) -> mx.array:
        x = x + self.attn(self.attn_norm(x), mask)
        return x + self.mlp(self.mlp_norm(x))


class Transformer(nn.Module):
    def __init__(self, cfg: ModelConfig, grad_checkpoint: bool = False):
        super().__init__()
        self.embed = nn.Embedding(cfg.vocab_size, cfg.dims)
        self.blocks = [Block(cfg) for _ in range(cfg.layers)]
        self.norm = nn.RMSNorm(cfg.dims, eps=cfg.norm_eps)
        if not cfg.tie_embeddings:
            self.head = nn.Linear(cfg.dims, cfg.vocab_size, bias=False)
        self.tied = cfg.tie_embeddings
        self.grad_checkpoint = grad_checkpoint
        self.window = cfg.window

    def __call__(self, tokens: mx.array) -> mx.array:
        h = self.embed(tokens)
        mask = attention_mask(tokens.shape[1], self.window)   # one for every layer
        for block in self.blocks:
            if self.grad_checkpoint:
                h = _checkpointed(block, h, mask)
            else:
                h = block(h, mask)
        h = self.norm(h)
        return self.embed.as_linear(h) if self.tied else self.head(h)


def _checkpointed(block: Block, h: mx.array, mask: str | mx.array) -> mx.array:
    """Run ``block`` so that backward recomputes its activations instead of storing them.

    The block's parameters are explicit inputs of the checkpointed function: gradients must
    flow to them, and mx.checkpoint only differentiates through its arguments.
    """

    def run(params: dict, x: mx.array) -> mx.array:
        block.update(params)
        return block(x, mask)

    return mx.checkpoint(run)(block.trainable_parameters(), h)


def loss_fn(model: Transformer, inputs: mx.array, targets: mx.array) -> mx.array:
    """Mean next-token cross-entropy, computed in float32 whatever the compute dtype."""
    logits = model(inputs).astype(mx.float32)
    return nn.losses.cross_entropy(logits, targets, reduction="mean")


def count_params(model: nn.Module) -> int:
    from mlx.utils import tree_flatten

    return sum(v.size for _, v in tree_flatten(model.parameters()))

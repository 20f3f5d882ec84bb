"""What a fine-tuning step optimizes: the loss over tokens, the optimizer and its
schedule, and the seed of an example's dropout.

The loss of a micro-batch is mlx-lm's ``default_loss`` turned back into a sum over its
tokens and weighted by ``world / T`` (``T``: the tokens of the whole global batch), so
that the mean over ranks of the ranks' sums is the mean over the global batch's tokens:

    sum_r (world / T) * sum_{tokens of r} loss / world  =  sum_{all tokens} loss / T

whatever the split of the global batch over ranks and micro-batches.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import numpy as np

from .config import FinetuneConfig


def token_loss(model: nn.Module, tokens: mx.array, lengths: mx.array, weight: mx.array
               ) -> mx.array:
    """mlx-lm's ``default_loss`` (the mean over the micro-batch's unmasked tokens) times
    their count, so the sum of their losses, times ``weight`` (``world / T``)."""
    from mlx_lm.tuner.trainer import default_loss

    mean, ntoks = default_loss(model, tokens, lengths)
    return mean * ntoks.astype(mx.float32) * weight


def make_optimizer(cfg: FinetuneConfig, steps: int) -> optim.Optimizer:
    o = cfg.optimizer
    if o.schedule == "cosine":
        lr: Any = optim.cosine_decay(o.lr, max(1, steps - o.warmup), end=o.min_lr)
    else:
        lr = o.lr
    if o.warmup:
        after = lr if callable(lr) else (lambda _: mx.array(o.lr))
        lr = optim.join_schedules([optim.linear_schedule(0.0, o.lr, o.warmup), after],
                                  [o.warmup])
    if o.name == "sgd":
        return optim.SGD(learning_rate=lr)
    if o.name == "adam":
        return optim.Adam(learning_rate=lr)
    return optim.AdamW(learning_rate=lr, weight_decay=o.weight_decay)


def seed_of(seed: int, step: int, place: int) -> int:
    """The dropout seed of the example at ``place`` in the global batch of ``step``
    (:mod:`.dropout`): the same whatever the world size and the split."""
    return int(np.random.SeedSequence([seed, step, place]).generate_state(1)[0])

"""What a fine-tuning step optimizes: the loss over tokens, the optimizer and its
schedule, and the seed of an example's dropout.

The loss of a micro-batch is mlx-lm's ``default_loss`` turned back into a sum over its
tokens and weighted by ``world / T`` (``T``: the tokens of the whole global batch), so
that the mean over ranks of the ranks' sums is the mean over the global batch's tokens:

    sum_r (world / T) * sum_{tokens of r} loss / world  =  sum_{all tokens} loss / T

whatever the split of the global batch over ranks and micro-batches.
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import numpy as np

from mlxops.trainer import optimizers

from .config import FinetuneConfig


def token_loss(model: nn.Module, tokens: mx.array, lengths: mx.array, weight: mx.array
               ) -> mx.array:
    """mlx-lm's ``default_loss`` (the mean over the micro-batch's unmasked tokens) times
    their count, so the sum of their losses, times ``weight`` (``world / T``)."""
    from mlx_lm.tuner.trainer import default_loss

    mean, ntoks = default_loss(model, tokens, lengths)
    return mean * ntoks.astype(mx.float32) * weight


def make_optimizer(cfg: FinetuneConfig, steps: int) -> optim.Optimizer:
    """``train:``'s optimizer and schedule (the trainer's rule,
    :func:`mlxops.trainer.optimizers.make_optimizer`)."""
    return optimizers.make_optimizer(cfg.train, steps)


def seed_of(seed: int, step: int, place: int) -> int:
    """The dropout seed of the example at ``place`` in the global batch of ``step``
    (:mod:`.dropout`): the same whatever the world size and the split."""
    return int(np.random.SeedSequence([seed, step, place]).generate_state(1)[0])

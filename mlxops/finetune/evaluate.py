"""The validation loss: the mean over every unmasked token of the validation batches.

The validation batches are the first ``train.eval_batches`` of ``valid.jsonl`` cut as the
training data is (sorted by length, batches of ``train.global_batch``), never shuffled,
so every validation reads the same examples. Each rank takes its slice of each batch (the
training split), sums its tokens' losses and counts them (mlx-lm's ``default_loss``), and
one all-reduce of the two sums gives every rank the same mean: the world size and the
split change only the order of summation.
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from .data import Examples, micro_batches


def validation_loss(model: nn.Module, valid: Examples, batches: list[np.ndarray],
                    counts: list[int], rank: int, pieces: int, max_seq_len: int,
                    group: mx.distributed.Group) -> float | None:
    """The mean validation loss on every rank, or None without a validation batch."""
    from mlx_lm.tuner.trainer import default_loss

    if not batches:
        return None
    model.eval()
    total, tokens = mx.array(0.0), mx.array(0.0)
    start = sum(counts[:rank])
    for rows in batches:
        for x, lengths in micro_batches(valid, rows[start:start + counts[rank]], pieces,
                                        max_seq_len):
            mean, n = default_loss(model, mx.array(x), mx.array(lengths))
            total = total + mean * n.astype(mx.float32)
            tokens = tokens + n.astype(mx.float32)
            mx.eval(total, tokens)
    model.train()
    sums = mx.stack([total, tokens])
    if group.size() > 1:
        sums = mx.distributed.all_sum(sums, group=group, stream=mx.cpu)
    loss, count = sums.tolist()
    return loss / max(count, 1.0)

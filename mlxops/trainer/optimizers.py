"""The optimizer and its learning-rate schedule from ``train:``'s shared keys.

One rule for every program (:mod:`.vocabulary`): ``train.optimizer`` (adamw, adam, sgd)
at ``train.lr``; after ``train.warmup`` linear steps from 0, either a cosine decay to
``train.min_lr`` over the remaining ``steps - warmup`` steps, or a constant ``lr``
(``train.schedule``). ``weight_decay`` applies to AdamW. Node side: mlx only.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import mlx.optimizers as optim

from .vocabulary import TrainKeys


def make_optimizer(t: TrainKeys, steps: int) -> optim.Optimizer:
    """The optimizer of ``t`` whose schedule spans ``steps`` optimizer steps."""
    if t.schedule == "cosine":
        lr: Any = optim.cosine_decay(t.lr, max(1, steps - t.warmup), end=t.min_lr)
    else:
        lr = t.lr
    if t.warmup:
        after = lr if callable(lr) else (lambda _: mx.array(t.lr))
        lr = optim.join_schedules([optim.linear_schedule(0.0, t.lr, t.warmup), after],
                                  [t.warmup])
    if t.optimizer == "sgd":
        return optim.SGD(learning_rate=lr)
    if t.optimizer == "adam":
        return optim.Adam(learning_rate=lr)
    return optim.AdamW(learning_rate=lr, weight_decay=t.weight_decay)

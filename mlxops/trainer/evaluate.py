"""The validation loss: the mean next-token loss over ``train.eval_batches`` global batches.

Evaluation ``e`` reads validation samples ``[b*G, (b+1)*G)`` for ``b < eval_batches``
(data.py's :meth:`Source.validation`; the same samples every time), each rank its own
slice of each batch, as it takes its slice of a training batch (``Batches``), micro-batch
by micro-batch. Every rank sums ``loss * tokens`` over its rows and counts its tokens; one
all-sum gives the mean over every token of the evaluation, whatever the number of ranks
(equal up to summation order). The weights are the float32 master weights, whatever
``train.dtype`` is: validation measures the model a checkpoint holds.
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn

from .data import Batches
from .model import loss_fn


class Evaluator:
    """The compiled forward of one model: summed loss and token count of a micro-batch."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self._sum = mx.compile(self._loss_sum, inputs=[model.state])

    def _loss_sum(self, x: mx.array, y: mx.array) -> mx.array:
        return loss_fn(self.model, x, y) * y.size

    def loss(self, batches: Batches, micro: int, eval_batches: int,
             group: mx.distributed.Group) -> float:
        """The validation loss over every rank's rows (a collective: every rank calls it)."""
        total = mx.array(0.0)
        tokens = 0
        for b in range(eval_batches):
            start = b * batches.global_batch + batches.offset
            rows = batches.source.validation(start, batches.per_rank)
            for a in range(0, len(rows), micro):
                chunk = rows[a:a + micro]
                total = total + self._sum(mx.array(chunk[:, :-1]), mx.array(chunk[:, 1:]))
                tokens += chunk[:, 1:].size
            mx.eval(total)
        both = mx.stack([total, mx.array(float(tokens))])
        if group.size() > 1:
            both = mx.distributed.all_sum(both, group=group, stream=mx.cpu)
        loss_sum, count = both.tolist()
        return loss_sum / count

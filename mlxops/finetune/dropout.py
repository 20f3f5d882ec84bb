"""The adapters' dropout, drawn per example so that no split of the batch changes it.

mlx-lm's LoRA and DoRA layers hold an ``nn.Dropout``, whose mask is one draw of MLX's RNG
over the whole micro-batch ``[b, L, d]``. That mask depends on which examples share the
micro-batch and on its padded width ``L``: the same global batch on 2 ranks (two
micro-batches of 2 rows) and on 1 rank (one of 4) drops different elements, so 1 rank
and 2 ran 4e-3 apart in loss at step 2 (the first whose adapters are not zero) and 1e-1
by step 11 (dropout 0.1, the tiny llama, lr 1e-3), where float reordering alone stays
within 3e-7.

:class:`ExampleDropout` replaces it. Row ``j`` of a micro-batch carries a seed ``s_j`` (a
function of ``(train.seed, step, the example's place in the global batch)``:
:func:`mlxops.finetune.objective.seed_of`), and element ``(t, i)`` of that row is kept when

    h = fmix32(fmix32(t * d + i) ^ s_j)  >=  p * 2**32

(``fmix32``: MurmurHash3's finaliser, a bijection of uint32 with full avalanche). The
decision for one element depends on nothing but its example, its position and its
feature, never on the micro-batch's other rows or width; MLX's own ``bernoulli`` cannot
give that (its bits for a prefix of a shape differ from those of a longer shape). Kept
elements are scaled by ``1 / (1 - p)``, as ``nn.Dropout`` does.
"""

from __future__ import annotations

from collections.abc import Callable

import mlx.core as mx
import mlx.nn as nn

_M1, _M2 = 0x85EBCA6B, 0xC2B2AE35  # MurmurHash3 fmix32's multipliers


def fmix32(h: mx.array) -> mx.array:
    """MurmurHash3's 32-bit finaliser, elementwise over a uint32 array."""
    h = h ^ mx.right_shift(h, 16)
    h = h * mx.array(_M1, mx.uint32)
    h = h ^ mx.right_shift(h, 13)
    h = h * mx.array(_M2, mx.uint32)
    return h ^ mx.right_shift(h, 16)


class RowSeeds:
    """The seeds of the micro-batch being computed, shared by every dropout of a model
    (a plain holder, not an array attribute, so it is no part of the model's state)."""

    def __init__(self) -> None:
        self.value: mx.array | None = None


class ExampleDropout(nn.Module):
    """``nn.Dropout(p)`` whose mask of each row follows from that row's seed alone."""

    def __init__(self, p: float, seeds: RowSeeds):
        super().__init__()
        self._p, self._seeds = p, seeds

    def __call__(self, x: mx.array) -> mx.array:
        if not self.training or self._p == 0:
            return x
        seeds = self._seeds.value
        if seeds is None or x.ndim != 3 or seeds.shape != (x.shape[0],):
            got = None if seeds is None else seeds.shape
            raise ValueError("ExampleDropout: a [batch, length, features] input with one "
                             f"seed per row, got {x.shape} and seeds {got}")
        _, length, features = x.shape
        index = mx.arange(length * features, dtype=mx.uint32).reshape(length, features)
        bits = fmix32(fmix32(index)[None] ^ seeds.astype(mx.uint32)[:, None, None])
        keep = bits >= mx.array(min(int(self._p * 2**32), 2**32 - 1), mx.uint32)
        return mx.where(keep, x * (1 / (1 - self._p)), mx.zeros_like(x))


def install(model: nn.Module, p: float) -> RowSeeds:
    """Every ``nn.Dropout`` of ``model`` (the adapters') replaced by an
    :class:`ExampleDropout` of the same ``p``; returns the holder the loss fills."""
    seeds = RowSeeds()
    for _, module in model.named_modules():
        if isinstance(getattr(module, "dropout", None), nn.Dropout):
            module.dropout = ExampleDropout(p, seeds)
    return seeds


def seeded(loss: Callable[..., mx.array], seeds: RowSeeds) -> Callable[..., mx.array]:
    """``loss(model, *batch)`` that takes the micro-batch's row seeds as its last argument
    and hands them to the model's :class:`ExampleDropout` layers while it runs."""

    def with_seeds(model: nn.Module, *batch_then_seeds: mx.array) -> mx.array:
        *batch, row_seeds = batch_then_seeds
        seeds.value = row_seeds
        try:
            return loss(model, *batch)
        finally:
            seeds.value = None

    return with_seeds

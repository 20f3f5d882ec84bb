"""Weights that stay equal: compare every rank's state, and repair it from rank 0.

Data-parallel ranks apply the same all-reduced gradients to the same weights, so their
parameters and optimizer state are equal bit for bit, until something breaks that: a bit
flip in memory, a bug, a rank restarted from another node's checkpoint. Then each rank
trains its own model, the loss on rank 0 hides it, and the checkpoints of the nodes
differ. Every ``train.consistency_every`` steps the ranks compare a checksum of each
array (the sum of its bits as unsigned integers, so any changed bit shows and the sum
does not depend on summation order) through one small all-gather; on a mismatch rank 0's
copy of every array is sent to all (an integer all-reduce to which the other ranks add
zeros: the bits arrive exactly), and the trainer logs it and counts it in its metrics.
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx
from mlx.utils import tree_flatten, tree_unflatten

from .step import GROUP_BYTES, assign

_UNSIGNED = {1: mx.uint8, 2: mx.uint16, 4: mx.uint32, 8: mx.uint64}


@dataclass
class Mismatch:
    """What a check found: the ranks whose state differs from rank 0's, and where."""

    ranks: list[int]
    keys: list[str]

    def describe(self) -> str:
        where = ", ".join(self.keys[:3]) + (f" and {len(self.keys) - 3} more"
                                            if len(self.keys) > 3 else "")
        who = (f"ranks {', '.join(map(str, self.ranks))} differ" if len(self.ranks) > 1
               else f"rank {self.ranks[0]} differs")
        return (f"{who} from rank 0 in {len(self.keys)} "
                f"array{'s' if len(self.keys) > 1 else ''} ({where})")


def state_items(model: object, optimizer: object, trainable_only: bool = False
                ) -> list[tuple[str, mx.array]]:
    """Every array a rank trains with, named: the model's and the optimizer's.
    ``trainable_only``: the model's trainable parameters alone (fine-tuning: the frozen
    base weights are read from the same file on every node, and checking them would
    read the whole model every time)."""
    params = model.trainable_parameters() if trainable_only else model.parameters()
    return ([(f"model.{k}", v) for k, v in tree_flatten(params)]
            + [(f"optimizer.{k}", v) for k, v in tree_flatten(optimizer.state)])


def _bits(a: mx.array) -> mx.array:
    """The array's bits as a flat vector of unsigned integers of its item size."""
    return mx.view(a.reshape(-1), _UNSIGNED[a.dtype.size])


def checksums(arrays: list[mx.array]) -> mx.array:
    """One uint64 per array: the sum of its bits (modulo 2**64)."""
    return mx.stack([mx.sum(_bits(a).astype(mx.uint64)) for a in arrays])


def compare(items: list[tuple[str, mx.array]], group: mx.distributed.Group
            ) -> Mismatch | None:
    """Every rank's checksums side by side (one all-gather); the same answer on all."""
    local_sums = checksums([a for _, a in items])
    rows = mx.distributed.all_gather(local_sums[None], group=group).tolist()
    ranks = [r for r, row in enumerate(rows) if row != rows[0]]
    if not ranks:
        return None
    keys = [k for i, (k, _) in enumerate(items) if any(row[i] != rows[0][i] for row in rows)]
    return Mismatch(ranks, keys)


def from_rank_zero(arrays: list[mx.array], group: mx.distributed.Group) -> list[mx.array]:
    """Rank 0's copy of each array, on every rank, bit for bit.

    The bits travel as uint32 (wider items as several, narrower ones widened), in
    buffers of about :data:`GROUP_BYTES`: an integer sum to which every other rank adds
    zeros changes no bit (a float sum would turn -0.0 into 0.0, NaNs into others).
    """
    zero = group.rank() == 0
    words = []
    for a in arrays:
        b = _bits(a)
        w = mx.view(b, mx.uint32) if a.dtype.size >= 4 else b.astype(mx.uint32)
        words.append(w if zero else mx.zeros_like(w))
    out: list[mx.array] = []
    start = 0
    while start < len(words):
        end, size = start, 0
        while end < len(words) and (end == start or size < GROUP_BYTES):
            size += words[end].size * 4
            end += 1
        chunk = words[start:end]
        total = mx.distributed.all_sum(mx.concatenate(chunk), group=group)
        offsets, at = [], 0
        for w in chunk[:-1]:
            at += w.size
            offsets.append(at)
        out.extend(mx.split(total, offsets) if offsets else [total])
        start = end
    result = []
    for a, w in zip(arrays, out, strict=True):
        u = _UNSIGNED[a.dtype.size]
        b = mx.view(w, u) if a.dtype.size >= 4 else w.astype(u)
        result.append(mx.view(b, a.dtype).reshape(a.shape))
    return result


def repair(model: object, optimizer: object, group: mx.distributed.Group,
           trainable_only: bool = False) -> None:
    """Make every rank's model and optimizer state rank 0's, in place."""
    items = state_items(model, optimizer, trainable_only)
    fixed = from_rank_zero([a for _, a in items], group)
    named = dict(zip([k for k, _ in items], fixed, strict=True))
    params = [(k[len("model."):], v) for k, v in named.items() if k.startswith("model.")]
    opt = [(k[len("optimizer."):], v) for k, v in named.items() if k.startswith("optimizer.")]
    model.update(tree_unflatten(params))
    assign(optimizer.state, tree_unflatten(opt))
    mx.eval(model.parameters(), optimizer.state)

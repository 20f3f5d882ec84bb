"""ZeRO stage 1: AdamW's state (and a bfloat16 run's float32 master weights) sharded over
the data-parallel ranks, with only the collectives a ring has (``all_sum``, ``all_gather``).

MLX's own sharding (``nn.fully_shard``) needs ``sum_scatter``, which the ring backend lacks.
ZeRO-1 does not: the gradients are all-summed as the unsharded step does
(:func:`~mlxops.trainer.step.mean_over_ranks`, the same buffers and order), so every rank
holds the full mean gradient; each rank then updates only its slice of the parameters with
its slice of the moments, and one ``all_gather`` rebuilds the weights everywhere.

**The slices.** The trainable parameters, flattened in ``tree_flatten`` order, are one
vector of S elements. Rank r of n owns ``[r c, min(S, (r + 1) c))`` with ``c = ceil(S /
n)``: the last slices are shorter (or empty) when n does not divide S. ``all_gather``
wants equal parts, so each rank sends its slice padded with zeros to c and the gathered
``n c`` vector is cut back to S (:class:`Layout`).

**Bitwise equal to the unsharded step.** AdamW is element-wise: the optimizer is handed
the rank's slice as one array (``{"flat": slice}``), and each element goes through the same
expression (weight decay, both moments, the step) with the same scalars (the learning rate
of the same step) as in the unsharded update; the gradient clip's norm is taken over the
full gradient every rank holds. ``all_gather`` copies bits. In a bfloat16 run the model
holds bfloat16 weights (the working copy the unsharded step casts from its float32
weights; here the all_gather rebuilds it, so :class:`ZeroSteps` makes no
:attr:`~.step.Steps.copy` of its own) and each rank keeps the float32 master weights of
its slice only; the gradients are bfloat16 in both, cast to float32 before they are
summed (here at once, so that accumulated micro-batches add in float32 as there).
``tests/trainer/test_zero.py`` holds the whole runs equal bit for bit at 2 and 3 ranks.

**Memory per rank** (P parameters, n ranks, :func:`mlxops.trainer.plan.sharded_terms`):
AdamW's moments ``8 P / n`` instead of ``8 P``; in bfloat16, the weights ``2 P`` plus
the master slice ``4 P / n`` instead of ``4 P``. The price: one ``all_gather`` a step of
``P`` weights (4 bytes each, 2 in bfloat16), each rank receiving ``(n - 1) / n`` of them.

**Checkpoints** (:mod:`.zero_checkpoint`). Each rank writes its slice of the moments with
its offsets (``zero-rank-<r>.safetensors``, the offsets in the file's metadata);
the full weights are written as before (a bfloat16 run gathers its float32 master slices
for that, :meth:`ZeroSteps.master_weights`). A resume on another number of ranks
re-slices: the ranks agree who holds each old slice, the holder
sends it (``all_gather``, one old slice at a time) and each rank keeps the part that
falls in its new range. An old slice no rank holds (its host left the run) is refused.

stdlib + mlx + numpy only: synced to nodes with the trainer.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
from mlx.utils import tree_flatten, tree_map, tree_unflatten

from .model import loss_fn
from .step import Steps, assign

#: The key under which the optimizer sees the rank's slice as one array.
FLAT = "flat"


@dataclass(frozen=True)
class Layout:
    """Where each parameter array lies in the flat vector, and this rank's slice of it."""

    names: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]
    total: int           # S: elements of all trainable parameters
    world: int           # n
    rank: int

    @classmethod
    def of(cls, params: dict, world: int, rank: int) -> Layout:
        flat = tree_flatten(params)
        return cls(tuple(k for k, _ in flat), tuple(tuple(a.shape) for _, a in flat),
                   sum(a.size for _, a in flat), world, rank)

    @property
    def chunk(self) -> int:
        """c: every rank's part of the all_gather (its slice, padded)."""
        return math.ceil(self.total / self.world) if self.total else 0

    def bounds(self, rank: int | None = None) -> tuple[int, int]:
        """``[lo, hi)`` of ``rank``'s slice (this rank's by default)."""
        r = self.rank if rank is None else rank
        return min(self.total, r * self.chunk), min(self.total, (r + 1) * self.chunk)

    def take(self, tree: dict, lo: int | None = None, hi: int | None = None) -> mx.array:
        """Elements ``[lo, hi)`` (this rank's slice by default) of ``tree`` flattened, as
        one 1-d array; only the overlapping parts of the arrays are copied."""
        if lo is None or hi is None:
            lo, hi = self.bounds()
        flat = tree_flatten(tree)
        parts, at = [], 0
        for (_, a), shape in zip(flat, self.shapes, strict=True):
            size = math.prod(shape)
            a0, a1 = max(lo, at), min(hi, at + size)
            if a0 < a1:
                parts.append(a.reshape(-1)[a0 - at:a1 - at])
            at += size
        if not parts:
            dtype = flat[0][1].dtype if flat else mx.float32
            return mx.zeros((0,), dtype)
        return parts[0] if len(parts) == 1 else mx.concatenate(parts)

    def padded(self, piece: mx.array) -> mx.array:
        """This rank's slice padded with zeros to :attr:`chunk` for the all_gather."""
        pad = self.chunk - piece.size
        return mx.concatenate([piece, mx.zeros((pad,), piece.dtype)]) if pad else piece

    def rebuild(self, gathered: mx.array) -> dict:
        """The parameter tree from the gathered ``n c`` vector (the padding dropped)."""
        out, at = [], 0
        for name, shape in zip(self.names, self.shapes, strict=True):
            size = math.prod(shape)
            out.append((name, gathered[at:at + size].reshape(shape)))
            at += size
        return tree_unflatten(out)


def gather(piece: mx.array, layout: Layout, group: mx.distributed.Group) -> mx.array:
    """Every rank's slice, in rank order, as one vector of S elements."""
    if group.size() == 1:
        return piece
    return mx.distributed.all_gather(layout.padded(piece), group=group)[:layout.total]


class Shard:
    """This rank's part of a sharded optimizer: the layout, and a bfloat16 run's float32
    master slice. Made once per run, before the optimizer holds any state: it casts a
    bfloat16 run's model to bfloat16 and initialises ``optimizer`` on the slice (under
    :data:`FLAT`); every :class:`ZeroSteps` compiled later (a new batch split) uses it."""

    def __init__(self, model: nn.Module, optimizer: optim.Optimizer,
                 group: mx.distributed.Group, compute_dtype: mx.Dtype):
        if any(isinstance(v, dict | list) for v in optimizer.state.values()):
            raise ValueError("a sharded optimizer is initialised on its slice, not before")
        self.group, self.compute_dtype = group, compute_dtype
        params = model.trainable_parameters()
        self.layout = Layout.of(params, group.size(), group.rank())
        #: A bfloat16 run's float32 weights of this rank's slice (empty in float32: the
        #: model's own weights are the master then).
        self.master: dict[str, mx.array] = {}
        self.sharded_master = compute_dtype != mx.float32
        self._own(model, params)
        optimizer.init({FLAT: self.slice_of(params)})

    def _own(self, model: nn.Module, params: dict) -> None:
        """The master slice from ``params`` (float32), and the model cast to bfloat16."""
        if self.sharded_master:
            self.master[FLAT] = self.layout.take(params).astype(mx.float32)
            model.update(tree_map(lambda p: p.astype(self.compute_dtype), params))

    def slice_of(self, params: dict) -> mx.array:
        """The float32 weights of this rank's slice."""
        if self.sharded_master:
            return self.master[FLAT]
        return self.layout.take(params)

    def master_weights(self, model: nn.Module) -> dict[str, mx.array]:
        """The full float32 weights (flat names), for the checkpoint's model file: a
        bfloat16 run gathers its master slices (a collective: every rank calls it)."""
        params = model.trainable_parameters()
        if self.sharded_master:
            full = gather(self.master[FLAT], self.layout, self.group)
            mx.eval(full)  # now, on every rank: a rank that would not read it still sends
            params = self.layout.rebuild(full)
        return dict(tree_flatten(params))

    def load(self, model: nn.Module, optimizer: optim.Optimizer,
             slices: dict[str, mx.array]) -> None:
        """Resume: ``model`` holds the checkpoint's float32 weights; ``slices`` is this
        rank's optimizer state (:func:`~.zero_checkpoint.load_slices`)."""
        self._own(model, model.trainable_parameters())
        assign(optimizer.state, tree_unflatten(list(slices.items())))
        mx.eval(model.parameters(), optimizer.state, self.master)


class ZeroSteps(Steps):
    """:class:`~mlxops.trainer.step.Steps` with the update sharded (see the module).

    ``shard``: the run's :class:`Shard`; by default one is made here, which takes over
    ``model`` and ``optimizer`` (a bfloat16 run's model cast to bfloat16, ``optimizer``
    initialised on this rank's slice: it must hold no state yet).
    """

    def __init__(self, model: nn.Module, optimizer: optim.Optimizer,
                 group: mx.distributed.Group, compute_dtype: mx.Dtype, grad_clip: float,
                 wire: mx.Dtype = mx.float32, scale: float = 1.0,
                 loss: Callable[..., mx.array] = loss_fn, random: bool = False,
                 shard: Shard | None = None):
        self.shard = shard or Shard(model, optimizer, group, compute_dtype)
        self.layout, self.master = self.shard.layout, self.shard.master
        self.sharded_master = self.shard.sharded_master
        # No working copy (Steps' ``copy``): a bfloat16 run's model holds the bfloat16
        # weights the all_gather rebuilds every step, which are the working copy already;
        # a second one would cost 2 P bytes the plan does not count, and this _update
        # (which replaces Steps') would never recast it: the forward passes would run on
        # the weights the copy was made from.
        super().__init__(model, optimizer, group, compute_dtype, grad_clip, wire, scale,
                         loss, random, working_copy=False)
        # The compiled functions read and write the master slice too (mx.compile reads
        # the state list when called, so appending before the first call is enough).
        self.state.append(self.master)

    def _slice_of(self, params: dict) -> mx.array:
        return self.shard.slice_of(params)

    def _grads(self, *batch: mx.array) -> tuple[mx.array, dict]:
        # bfloat16 weights give bfloat16 gradients; the unsharded step's float32 ones are
        # the same values (the derivative of its cast), so they are cast at once: the
        # sums of accumulated micro-batches are then float32 as there.
        loss, g = super()._grads(*batch)
        if not self.sharded_master:
            return loss, g  # float32 already: no copy
        return loss, tree_map(lambda a: a.astype(mx.float32), g)

    def _update(self, grads: dict, loss: mx.array) -> mx.array:
        g, stats = self._reduce(grads, loss)
        mine = self._slice_of(self.model.trainable_parameters())
        new = self.optimizer.apply_gradients({FLAT: self.layout.take(g)}, {FLAT: mine})[FLAT]
        if self.sharded_master:
            self.master[FLAT] = new
            new = new.astype(self.compute_dtype)
        # After the stats' all-reduce, whatever graph a peer built (one that abstains runs
        # its collectives in this order: the gradients', the stats', this all_gather).
        new = mx.depends(new, stats)
        self.model.update(self.layout.rebuild(gather(new, self.layout, self.group)))
        return stats

    def abstain(self, stuck: bool = False) -> mx.array:
        """:meth:`Steps.abstain`, and this rank's part of the all_gather its peers enter
        (zeros: the step is undone everywhere, the flag says so)."""
        stats = super().abstain(stuck)
        dtype = self.compute_dtype if self.sharded_master else mx.float32
        if self.group.size() > 1:
            nothing = mx.depends(mx.zeros((self.layout.chunk,), dtype), stats)
            mx.eval(mx.distributed.all_gather(nothing, group=self.group))
        return stats

    def snapshot(self) -> tuple[dict, dict, dict | None]:
        params, opt, copy = super().snapshot()
        return params, {"optimizer": opt, "master": dict(self.master)}, copy

    def restore(self, snap: tuple[dict, dict, dict | None]) -> None:
        params, saved, copy = snap
        super().restore((params, saved["optimizer"], copy))
        self.master.update(saved["master"])

    # -- checkpoints -----------------------------------------------------------------------

    def master_weights(self) -> dict[str, mx.array]:
        """:meth:`Shard.master_weights` (a collective: every rank calls it)."""
        return self.shard.master_weights(self.model)

    def slice_state(self) -> dict[str, mx.array]:
        """This rank's optimizer state (flat names), as a checkpoint holds it."""
        return dict(tree_flatten(self.optimizer.state))

    def load(self, weights: dict[str, mx.array], slices: dict[str, mx.array]) -> None:
        """Resume: the full float32 ``weights`` (flat names) and this rank's optimizer
        state (:func:`~.zero_checkpoint.load_slices`)."""
        self.model.load_weights(list(weights.items()), strict=True)
        self.shard.load(self.model, self.optimizer, slices)


class _NoOptimizer:
    """An optimizer with no state: what the consistency check compares of a sharded
    optimizer's (each rank's slice is its own)."""

    state: dict = {}


NO_OPTIMIZER = _NoOptimizer()

"""The compiled training step: gradients, the all-reduce, clipping and the AdamW update.

With accumulation 1 (the common case when the per-rank batch fits) the whole step is one
``mx.compile`` over explicit state (the model's and the optimizer's arrays; training draws
no random numbers, so no RNG key is part of it): forward/backward, the mean over ranks,
clipping and the update run as one graph and the host waits once per step, as a plain
mlx-lm loop does. With accumulation above 1 each micro-batch's forward/backward is a
compiled function evaluated on its own (one micro-batch's activations at a time), and a
compiled ``apply`` reduces and updates.

The loss is the trainer's (:func:`~mlxops.trainer.model.loss_fn` over ``(x, y)``) unless
another is given: fine-tuning (:mod:`mlxops.finetune`) passes its own, over its own batch
arrays, and its adapters' dropout makes the RNG state part of the compiled state
(``random=True``).

With a bfloat16 compute dtype the master weights and AdamW's moments stay float32, and the
forward/backward passes run on a bfloat16 *working copy* of the weights: compiled state
like the rest, cast by the update that makes the new masters (the cast fuses into AdamW's
elementwise kernel), so the differentiated graph casts nothing and its gradients come back
in bfloat16, cast to float32 by the update. The same bits as casting the masters at the
start of every forward pass, which on MLX's CUDA build had cost the backward pass 154 ms
against 88 at issue 33's 2048/16/16 row (benchmarks/README.md). On CUDA :meth:`Steps.fused`
also launches the gradients' graph before the rest (``mx.async_eval``, no host wait): left
to one evaluation MLX interleaves the update with the backward pass, 15-25% slower there.

Either way a step makes one chain of collectives (:func:`mean_over_ranks`): the gradients
and a small float32 vector of step statistics (the loss, and a flag saying this rank
computed its gradients). A rank that runs out of memory before its collectives
:meth:`Steps.abstain`\\ s: it joins the same chain with zeros and flag 0, so no rank hangs
in an all-reduce its peer never enters, and every rank learns from the flag, with no extra
round trip, that the step must be undone and redone with a smaller micro-batch.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
from mlx.utils import tree_flatten, tree_map, tree_unflatten

from .model import loss_fn

#: Gradients are concatenated into buffers of about this size, one all-reduce each, as
#: ``nn.average_gradients`` does (its ``all_reduce_size``).
GROUP_BYTES = 32 * 1024**2

#: Every all-reduced buffer is padded with zeros to a multiple of this many elements per
#: rank. MLX's ring all-reduce cuts a buffer into one segment per rank and each segment in
#: two or more packets. When those cuts do not fall on aligned addresses its sums run
#: slower: 3 loss values added to an aligned 428,672-float gradient made a 2-rank step
#: 12% slower (benchmarks/trainer.py; with the padding the step is as fast as
#: ``nn.average_gradients`` on the bare gradient). The padding costs at most 1 KiB per rank.
ALIGN_ELEMENTS = 256

WIRE_DTYPES = {"float32": mx.float32, "bfloat16": mx.bfloat16}


def compute_backend() -> str:
    """The backend this process computes on, as the memory plan names it (trainer/plan.py):
    ``cpu`` (MLX's default device is the CPU), else ``cuda`` or ``metal``."""
    if mx.default_device() == mx.cpu:
        return "cpu"
    return "cuda" if mx.cuda.is_available() else "metal"


def mean_over_ranks(
    grads: Any, stats: mx.array, group: mx.distributed.Group, wire: mx.Dtype = mx.float32,
) -> tuple[Any, mx.array]:
    """The mean over ranks of a float32 gradient tree and of a float32 ``stats`` vector.

    ``nn.average_gradients``' concatenate-reduce-split, with four differences:

    - each all-reduce depends on the previous one (``mx.depends``), so every rank runs its
      collectives in the same order whatever graph produced the inputs (a rank that
      abstains builds a different graph than its peers' compiled step);
    - ``wire`` is the dtype on the network: with bfloat16 the gradients travel (and are
      summed across ranks) in bfloat16 and come back as float32, halving the bytes sent;
    - ``stats`` rides in the last float32 buffer (its own tiny all-reduce with a bfloat16
      wire, since a loss in bfloat16 keeps 3 digits);
    - every buffer is padded to :data:`ALIGN_ELEMENTS` per rank.
    """
    n = group.size()
    if n == 1:
        return grads, stats
    flat = tree_flatten(grads)
    pieces = [a.reshape(-1) for _, a in flat]
    if wire == mx.float32:
        pieces.append(stats)
    reduced: list[mx.array] = []
    prev: mx.array | None = None
    for chunk in _by_size(pieces, wire.size):
        offsets, at = [], 0
        for a in chunk:
            at += a.size
            offsets.append(at)
        pad = -at % (ALIGN_ELEMENTS * n)
        # Each piece cast before the concatenation: a bfloat16 wire then never holds a
        # float32 copy of the whole buffer besides the bfloat16 one (same bits either way).
        parts = [a.astype(wire) for a in chunk] + ([mx.zeros((pad,), wire)] if pad else [])
        buf = mx.concatenate(parts) if len(parts) > 1 else parts[0]
        if prev is not None:
            buf = mx.depends(buf, prev)
        prev = mx.distributed.all_sum(buf, group=group)
        mean = prev.astype(mx.float32) / n
        reduced.extend(mx.split(mean, offsets)[:len(chunk)])  # the padding dropped
    if wire == mx.float32:
        stats = reduced.pop()
    else:
        stats = mx.distributed.all_sum(mx.depends(stats, prev), group=group) / n
    out = [(k, r.reshape(a.shape)) for (k, a), r in zip(flat, reduced, strict=True)]
    return tree_unflatten(out), stats


def _by_size(pieces: list[mx.array], itemsize: int) -> list[list[mx.array]]:
    """Consecutive pieces grouped until a group reaches :data:`GROUP_BYTES`."""
    groups: list[list[mx.array]] = [[]]
    size = 0
    for p in pieces:
        if groups[-1] and size >= GROUP_BYTES:
            groups.append([])
            size = 0
        groups[-1].append(p)
        size += p.size * itemsize
    return groups


class Steps:
    """The compiled functions of one trainer, over its model's and optimizer's state."""

    def __init__(self, model: nn.Module, optimizer: optim.Optimizer,
                 group: mx.distributed.Group, compute_dtype: mx.Dtype, grad_clip: float,
                 wire: mx.Dtype = mx.float32, scale: float = 1.0,
                 loss: Callable[..., mx.array] = loss_fn, random: bool = False,
                 working_copy: bool = True, grads_first: bool | None = None):
        self.model, self.optimizer, self.group = model, optimizer, group
        #: ``loss(model, *batch)``: the scalar whose gradients the step takes.
        self.loss = loss
        self.compute_dtype, self.grad_clip, self.wire = compute_dtype, grad_clip, wire
        #: This rank's weight in the mean over ranks (trainer/balance.py); 1.0 when every
        #: rank takes as many sequences as the others.
        self.scale = scale
        #: What the compiled functions read and write besides their arguments; the
        #: containers are updated in place (see :func:`assign`), never replaced.
        self.state = [model.state, optimizer.state]
        if random:  # the step draws random numbers (dropout): the key is state too
            self.state.append(mx.random.state)
        #: The trainable weights in the compute dtype, flat by name, or None: cast from
        #: the float32 masters by the update that made them rather than at the start of
        #: every forward pass (see :meth:`refresh`).
        self.copy: dict[str, mx.array] | None = None
        if working_copy and compute_dtype != mx.float32:
            self.copy = {}
            self.refresh()
            self.state.append(self.copy)
        self._value_and_grad = mx.value_and_grad(self._loss)
        compiled = partial(mx.compile, inputs=self.state, outputs=self.state)
        self._fused_graph = compiled(self._fused)
        #: Launch the gradients' graph before the update's (:meth:`fused`): by default on
        #: CUDA only, where it was measured (benchmarks/README.md, issue 33).
        self.grads_first = compute_backend() == "cuda" if grads_first is None else grads_first
        self.first = compiled(self._first)
        self.next = compiled(self._next)
        self.apply = compiled(self._apply)

    def refresh(self) -> None:
        """Cast the working copy again from the master weights: after they changed outside
        a step (a consistency repair, a restore)."""
        if self.copy is not None:
            self._recast()
            mx.eval(self.copy)

    def _recast(self) -> None:
        assert self.copy is not None
        self.copy.update((k, v.astype(self.compute_dtype))
                         for k, v in tree_flatten(self.model.trainable_parameters()))

    def _loss(self, params: dict, *batch: mx.array) -> mx.array:
        if self.copy is None and self.compute_dtype != mx.float32:
            # bf16 compute: cast a copy of the fp32 master weights; the cast is
            # differentiated, so the gradients come back in fp32.
            params = tree_map(lambda p: p.astype(self.compute_dtype), params)
        self.model.update(params)
        return self.loss(self.model, *batch)

    def fused(self, *batch: mx.array) -> tuple[mx.array, dict]:
        """The whole step (accumulation 1): ``(stats, local gradients)``, not evaluated."""
        stats, local = self._fused_graph(*batch)
        if self.grads_first:  # the gradients' graph launched before the update's
            mx.async_eval(local)
        return stats, local

    def _grads(self, *batch: mx.array) -> tuple[mx.array, dict]:
        params = self.model.trainable_parameters()
        if self.copy is not None:  # gradients in the compute dtype, cast by the update
            loss, g = self._value_and_grad(tree_unflatten(list(self.copy.items())), *batch)
        else:
            loss, g = self._value_and_grad(params, *batch)
        self.model.update(params)  # the fp32 master weights, not the bf16 copy
        return loss, g

    def _first(self, *batch: mx.array) -> tuple[mx.array, dict]:
        loss, g = self._grads(*batch)
        return loss, tree_map(lambda a: a.astype(mx.float32), g)

    def _reduce(self, grads: dict, loss: mx.array) -> tuple[dict, mx.array]:
        """The gradients every rank applies (scaled, mean over ranks, clipped) and the stats
        ``[mean loss, mean flag, 0]``; the sharded step (:mod:`.zero`) applies them too."""
        if self.scale != 1.0:
            grads = tree_map(lambda a: a * self.scale, grads)
            loss = loss * self.scale
        stats = mx.stack([loss, mx.array(1.0), mx.array(0.0)])
        g, stats = mean_over_ranks(grads, stats, self.group, self.wire)
        if self.grad_clip > 0:
            g, _ = optim.clip_grad_norm(g, self.grad_clip)
        return g, stats

    def _update(self, grads: dict, loss: mx.array) -> mx.array:
        """Mean over ranks, clip, AdamW; returns the stats ``[mean loss, mean flag, 0]``
        (the last is :meth:`abstain`'s "cannot back off")."""
        grads = tree_map(lambda a: a.astype(mx.float32), grads)  # a no-op unless copied
        g, stats = self._reduce(grads, loss)
        self.optimizer.update(self.model, g)
        if self.copy is not None:
            self._recast()
        return stats

    def _fused(self, *batch: mx.array) -> tuple[mx.array, dict]:
        loss, g = self._grads(*batch)
        # The local gradients are an output too: evaluating them first splits the step's
        # time into compute and all-reduce+update where it is logged (same graph, so the
        # same numbers as when it is evaluated at once).
        return self._update(g, loss), g

    def _next(self, *batch_then_sums: Any) -> tuple[mx.array, dict]:
        """``next(*batch, loss_sum, acc)``: one more micro-batch added to the sums."""
        *batch, loss_sum, acc = batch_then_sums
        loss, g = self._grads(*batch)
        return loss_sum + loss, tree_map(lambda a, b: a + b.astype(mx.float32), acc, g)

    def _apply(self, loss_sum: mx.array, acc: dict, accum: mx.array) -> mx.array:
        return self._update(tree_map(lambda a: a / accum, acc), loss_sum / accum)

    def run(self, batches: list[tuple[mx.array, ...]], divisor: float, timed: bool
            ) -> tuple[mx.array, float | None]:
        """One step over this rank's ``batches``: ``(stats, seconds at which compute
        ended or None)``. One host wait per step (the final ``mx.eval``), plus one per
        micro-batch when accumulating; ``timed`` (a logged step) waits once more between
        the gradients and the all-reduce of a fused step to measure the split.
        ``divisor``: what the summed micro-batch losses and gradients are divided by."""
        t0 = time.perf_counter()
        compute = None
        if len(batches) == 1:
            (batch,) = batches
            stats, local = self.fused(*batch)
            if timed:
                mx.eval(local)
                compute = time.perf_counter() - t0
            del local
        else:
            loss_sum, acc = None, None
            for batch in batches:
                if acc is None:
                    loss_sum, acc = self.first(*batch)
                else:
                    loss_sum, acc = self.next(*batch, loss_sum, acc)
                mx.eval(loss_sum, acc)
            compute = time.perf_counter() - t0
            stats = self.apply(loss_sum, acc, mx.array(divisor))
            del acc
        mx.eval(stats, self.state)
        return stats, compute

    def abstain(self, stuck: bool = False) -> mx.array:
        """Join this step's collectives with nothing (zeros, flag 0) and update nothing.

        For a rank that could not compute its gradients: its peers are waiting in the
        all-reduce. Returns the stats, whose flag mean below 1 tells every rank to undo,
        and whose last entry above 0 that some rank cannot back off (``stuck``: its
        micro-batch is 1 already), so that all of them stop, not only that one.
        """
        zeros = tree_map(mx.zeros_like, self.model.trainable_parameters())
        flags = mx.array([0.0, 0.0, 1.0 if stuck else 0.0])
        _, stats = mean_over_ranks(zeros, flags, self.group, self.wire)
        return stats

    def snapshot(self) -> tuple[dict, dict, dict | None]:
        """References to the current state (arrays are immutable: no copy is made)."""
        copy = None if self.copy is None else dict(self.copy)
        return self.model.parameters(), tree_map(lambda a: a, self.optimizer.state), copy

    def restore(self, snap: tuple[dict, dict, dict | None]) -> None:
        params, opt, copy = snap
        self.model.update(params)
        assign(self.optimizer.state, opt)
        if self.copy is not None and copy is not None:
            self.copy.update(copy)


def assign(target: dict, source: dict) -> None:
    """Set ``target``'s arrays to ``source``'s, in place: compiled functions hold
    ``target`` itself as their state, so it must never be replaced by a new container."""
    for key, value in source.items():
        if isinstance(value, dict) and isinstance(target.get(key), dict):
            assign(target[key], value)
        elif isinstance(value, list) and isinstance(target.get(key), list):
            for i, item in enumerate(value):
                if isinstance(item, dict):
                    assign(target[key][i], item)
                else:
                    target[key][i] = item
        else:
            target[key] = value

"""The pipeline step: one stage's gradients of a global batch, over ``send`` / ``recv``.

Each rank is one stage (:mod:`.stages`) and runs the 1F1B schedule (:mod:`.schedule`)
over the step's micro-batches: a forward receives its input from the stage before (the
first stage reads tokens), a backward receives its output's gradient from the stage
after (the last stage's loss has gradient 1), with ``mx.distributed.send`` / ``recv``
between ring neighbours, which the ring backend has.

**One forward.** A forward builds the stage's forward and backward graph at once with
``mx.vjp``, its cotangent a ``recv`` from the next stage not yet evaluated, and evaluates
only the outputs. MLX keeps the arrays the backward graph refers to (the activations) and
runs the ``recv`` when its step comes (``RECV_GRAD``): the forward runs once, and a stage
holds the activations of the micro-batches in flight, no more (``min(S - s, M)``).

**The gradients** are those of one process running the same micro-batches in order:
each stage sums its parameters' gradients over the micro-batches in micro-batch order and
divides by ``M``, as the trainer's accumulation does (:class:`~mlxops.trainer.step.Steps`),
and the losses likewise. A parameter's gradient is made by the same operations on the
same inputs as in one process, so on the same kernels it is the same bits; what differs
is said where it does: tied embeddings, clipping.

**Tied embeddings.** The first stage's embedding and the last stage's head are one matrix:
each holds a copy, and after the micro-batches the two exchange their gradients and both
take ``first + last`` (the same sum on both, so the copies stay equal bit for bit under
the same update). One process adds the two contributions per micro-batch before summing
over micro-batches; here each is summed over micro-batches first, so the embedding's
gradient equals one process's within float rounding (not bitwise) when ``M > 1``.

**Clipping** needs the global norm: each stage's sum of squares (the tied embedding
counted on the first stage only) is summed over the ranks with ``all_sum``: the same norm
as one process's up to the order of summation.

Standard library, mlx and numpy, as everything synced to a node.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import mlx.core as mx
from mlx.utils import tree_flatten, tree_map, tree_map_with_path

from . import schedule as sch

#: The tied embedding's name in the bundled trainer's model (first and last stage).
TIED = "embed.weight"


class Stage(Protocol):
    """One stage's model, as the pipeline step drives it."""

    first: bool
    last: bool

    def trainable(self) -> dict[str, mx.array]:
        """The parameters this stage differentiates, by their names in the whole model."""

    def forward(self, params: dict[str, mx.array], x: mx.array | None,
                batch: Sequence[mx.array]) -> mx.array:
        """The stage on one micro-batch with ``params``: ``x`` the previous stage's output
        (None on the first stage, which reads ``batch``); the last stage returns the
        micro-batch's loss (a scalar), the others their output."""

    def boundary(self, batch: Sequence[mx.array]) -> tuple[tuple[int, ...], mx.Dtype]:
        """Shape and dtype of the activation between two stages for ``batch``."""


class PipelineStep:
    """The gradients of stage ``index`` of ``stages`` for one global batch."""

    def __init__(self, stage: Stage, group: mx.distributed.Group | None, index: int,
                 stages: int, tied: str | None = None, first_backward: int = 0):
        self.stage, self.group, self.index, self.stages = stage, group, index, stages
        #: The tied embedding's name (None: untied); only the first and last stage hold it.
        self.tied = tied if stages > 1 and (stage.first or stage.last) else None
        #: The first stage with something to train (:func:`.schedule.schedule`): the
        #: stages before it run forwards only, and it needs no gradient of its input.
        self.first_backward = first_backward
        if index < first_backward and stage.trainable():
            raise ValueError(f"stage {index} trains {next(iter(stage.trainable()))} but "
                             f"the first stage with something to train is {first_backward}")

    def _send(self, x: mx.array, dst: int) -> None:
        mx.eval(mx.distributed.send(x, dst, group=self.group))

    def _recv(self, shape: tuple[int, ...], dtype: mx.Dtype, src: int) -> mx.array:
        return mx.distributed.recv(shape, dtype, src, group=self.group)

    def gradients(self, batches: Sequence[Sequence[mx.array]]
                  ) -> tuple[mx.array | None, dict[str, mx.array]]:
        """``(mean loss or None, mean gradients by name)`` over ``batches``, the step's
        micro-batches in order; the loss on the last stage only."""
        st, last = self.stage, self.stage.last
        names = list(st.trainable())
        backward = self.index >= self.first_backward
        input_grad = self.index > self.first_backward   # the stage before trains
        inputs: dict[int, mx.array] = {}
        pending: dict[int, tuple[mx.array, list[mx.array], mx.array]] = {}
        dxs: dict[int, mx.array] = {}
        acc: list[mx.array] | None = None
        loss_sum: mx.array | None = None
        for op in sch.schedule(self.index, self.stages, len(batches), self.first_backward):
            m, batch = op.micro, batches[op.micro]
            if op.kind == sch.RECV_ACT:
                shape, dtype = st.boundary(batch)
                inputs[m] = self._recv(shape, dtype, self.index - 1)
                mx.eval(inputs[m])
            elif op.kind == sch.FORWARD:
                params = st.trainable()
                x = inputs.pop(m, None)
                if last:
                    cot = mx.array(1.0, dtype=mx.float32)
                elif backward:
                    shape, dtype = st.boundary(batch)
                    cot = self._recv(shape, dtype, self.index + 1)   # run at RECV_GRAD
                else:
                    cot = None

                def fn(*flat: mx.array, x=x, batch=batch) -> mx.array:
                    p = dict(zip(names, flat[:len(names)], strict=True))
                    return st.forward(p, flat[len(names)] if input_grad else x, batch)

                primals = [params[k] for k in names] + ([x] if input_grad else [])
                if backward:
                    (out,), vjps = mx.vjp(fn, primals, [cot])
                else:   # forwards only: no backward graph, no activations kept
                    out, vjps = fn(*primals), []
                mx.eval(out)
                pending[m] = (out, vjps, cot)
                if last:
                    loss_sum = out if loss_sum is None else loss_sum + out
            elif op.kind == sch.SEND_ACT:
                self._send(pending[m][0], self.index + 1)
            elif op.kind == sch.RECV_GRAD:
                mx.eval(pending[m][2])
            elif op.kind == sch.BACKWARD:
                _, vjps, _ = pending.pop(m)
                grads = vjps[:len(names)]
                acc = grads if acc is None else [a + g for a, g in zip(acc, grads,
                                                                        strict=True)]
                if input_grad:
                    dxs[m] = vjps[len(names)]
                mx.eval(acc, dxs.get(m))
            elif op.kind == sch.SEND_GRAD:
                self._send(dxs.pop(m), self.index - 1)
        count = mx.array(float(len(batches)))
        mean = {k: a / count for k, a in zip(names, acc or [], strict=True)}
        if self.tied and self.tied in mean:
            mean[self.tied] = self._sum_tied(mean[self.tied])
        loss = loss_sum / count if loss_sum is not None else None
        mx.eval(mean, loss)
        return loss, mean

    def _sum_tied(self, g: mx.array) -> mx.array:
        """Both copies' gradient: ``first + last`` on both ends (the first stage sends
        first, the last receives first: the ring's two ends are neighbours)."""
        last = self.stages - 1
        if self.stage.first:
            self._send(g, last)
            other = self._recv(g.shape, g.dtype, last)
            return g + other
        other = self._recv(g.shape, g.dtype, 0)
        mx.eval(other)
        self._send(g, 0)
        return other + g

    def clip(self, grads: dict[str, mx.array], max_norm: float) -> dict[str, mx.array]:
        """``grads`` scaled to a global norm of at most ``max_norm`` (mlx's
        ``clip_grad_norm`` over every stage's gradients)."""
        sq = sum((mx.sum(g.astype(mx.float32) ** 2) for k, g in grads.items()
                  if not (k == self.tied and not self.stage.first)), mx.array(0.0))
        if self.group is not None and self.group.size() > 1:
            sq = mx.distributed.all_sum(sq, group=self.group, stream=mx.cpu)
        scale = mx.minimum(max_norm / (mx.sqrt(sq) + 1e-6), 1.0)
        return {k: g * scale for k, g in grads.items()}


def shaped(template: Any, flat: dict[str, Any]) -> Any:
    """``flat`` (``{"blocks.7.mlp.up.weight": a}``) as a tree shaped like ``template``
    (a module's parameters, an optimizer's state): a stage's blocks may be a list from 0
    or a dict by their numbers in the whole model, which ``tree_unflatten`` cannot tell."""
    return tree_map_with_path(lambda path, _: flat[path], template)


def update(model: Any, optimizer: Any, grads: dict[str, mx.array]) -> None:
    """Apply ``grads`` (by name) to ``model``'s trainable parameters with ``optimizer``."""
    optimizer.update(model, shaped(model.trainable_parameters(), grads))


def named(tree: Any) -> dict[str, mx.array]:
    """A parameter tree as ``{name: array}``, the names of the whole model."""
    return dict(tree_flatten(tree))


def cast(params: dict[str, mx.array], dtype: mx.Dtype) -> dict[str, mx.array]:
    """A copy of ``params`` in the compute ``dtype`` (the cast is differentiated, so the
    gradients come back in the master weights' float32)."""
    return params if dtype == mx.float32 else tree_map(lambda p: p.astype(dtype), params)


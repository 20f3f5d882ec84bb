"""The one-forward-one-backward (1F1B) schedule of a pipeline stage, as a list of steps.

Standard library only: the pipeline step (:mod:`.pipeline`) runs it on a node, and the
controller's plan prices it (:func:`step_seconds`).

**Order.** Stage ``s`` of ``S`` runs ``M`` micro-batches: first ``w = min(S - s - 1, M)``
forwards (the warm-up), then ``M - w`` pairs of one forward and one backward (the steady
state), then the ``w`` backwards left (the cool-down). Backwards run in micro-batch order.
So stage ``s`` holds at most ``min(S - s, M)`` micro-batches' activations at once: the
forwards it has run whose backward has not (``w`` of the warm-up and the one of the pair).

**Messages.** A forward of stage ``s > 0`` starts by receiving its input from ``s - 1``
(``RECV_ACT``), and one of ``s < S - 1`` ends by sending its output to ``s + 1``
(``SEND_ACT``); a backward of ``s < S - 1`` starts by receiving its output's gradient
(``RECV_GRAD``) and one of ``s > 0`` ends by sending its input's gradient (``SEND_GRAD``).
``mx.distributed.send`` / ``recv`` block until the peer takes part (the ring backend writes
to a socket; a large array does not fit its buffer), so two neighbours must meet their
link's messages in the same order, or both wait forever. The downstream stage ``s + 1``
meets them in its natural order (in the steady state: the input of forward ``m``, then the
gradient of backward ``i``). Stage ``s`` runs one forward more in its warm-up, so in its
steady state its natural order would be the reverse (the output of forward ``m`` sent
before the gradient of backward ``i`` received): it receives that gradient first, then
sends (Megatron-LM's ``send_forward_recv_backward``, as two blocking calls in that order).
:func:`link_order` gives a stage's messages on one link; tests/trainer/test_pipeline_
schedule.py checks that the two ends agree for every ``S`` and ``M`` up to 9.

**Time.** With ``t_s`` the forward and backward of one micro-batch on stage ``s`` and
``c`` the time of one message on a link, the step's critical path is::

    sum_s t_s + (M - 1) max_s t_s + 2 (S - 1) c

the first micro-batch through every stage and back, then the slowest stage's other
``M - 1`` (:func:`step_seconds`). With equal stages the pipeline's bubble, the share of a
stage's time idle, is ``(S - 1) / (M + S - 1)`` (:func:`bubble`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

FORWARD, BACKWARD = "forward", "backward"
RECV_ACT, SEND_ACT, RECV_GRAD, SEND_GRAD = "recv_act", "send_act", "recv_grad", "send_grad"


@dataclass(frozen=True)
class Op:
    """One step of a stage's schedule: ``kind`` on micro-batch ``micro``."""

    kind: str
    micro: int


def warmup(stage: int, stages: int, micro: int) -> int:
    """Forwards stage ``stage`` runs before its first backward."""
    return min(stages - stage - 1, micro)


def in_flight(stage: int, stages: int, micro: int) -> int:
    """The most micro-batches whose activations stage ``stage`` holds at once (a stage
    that runs forwards only holds none: its parts keep no activation, see
    :mod:`.stages`)."""
    return min(stages - stage, micro)


def schedule(stage: int, stages: int, micro: int, first_backward: int = 0) -> list[Op]:
    """Stage ``stage``'s steps for one optimizer step of ``micro`` micro-batches.

    ``first_backward``: the first stage with something to train (fine-tuning the last
    blocks only). The stages before it run forwards alone, in order; that stage runs its
    backward for its own weights and sends no gradient back."""
    if not 0 <= stage < stages or micro < 1 or not 0 <= first_backward < stages:
        raise ValueError(f"no schedule for stage {stage} of {stages} with {micro} "
                         f"micro-batches (first backward {first_backward})")
    first, last = stage == 0, stage == stages - 1
    ops: list[Op] = []
    if stage < first_backward:   # forward only: nothing here or below trains
        for m in range(micro):
            ops += ([] if first else [Op(RECV_ACT, m)]) + [Op(FORWARD, m), Op(SEND_ACT, m)]
        return ops
    gives_grad = stage > first_backward

    def forward(m: int, send: bool = True) -> None:
        if not first:
            ops.append(Op(RECV_ACT, m))
        ops.append(Op(FORWARD, m))
        if send and not last:
            ops.append(Op(SEND_ACT, m))

    def backward(i: int, received: bool = False) -> None:
        if not last and not received:
            ops.append(Op(RECV_GRAD, i))
        ops.append(Op(BACKWARD, i))
        if gives_grad:
            ops.append(Op(SEND_GRAD, i))

    w = warmup(stage, stages, micro)
    for m in range(w):
        forward(m)
    for i in range(micro - w):
        m = w + i
        forward(m, send=False)
        if not last:   # the gradient the downstream stage sends first, then our output
            ops.append(Op(RECV_GRAD, i))
            ops.append(Op(SEND_ACT, m))
        backward(i, received=True)
    for i in range(micro - w, micro):
        backward(i)
    return ops


def link_order(stage: int, stages: int, micro: int, downstream: bool,
               first_backward: int = 0) -> list[tuple[str, int]]:
    """Stage ``stage``'s messages on its link to ``stage + 1`` (``downstream``) or to
    ``stage - 1``, in its order, each as ``("act" | "grad", micro-batch)``."""
    kinds = {SEND_ACT: "act", RECV_GRAD: "grad"} if downstream else \
        {RECV_ACT: "act", SEND_GRAD: "grad"}
    return [(kinds[op.kind], op.micro)
            for op in schedule(stage, stages, micro, first_backward) if op.kind in kinds]


def step_seconds(stage_seconds: Sequence[float], micro: int, link_seconds: float = 0.0
                 ) -> float:
    """The 1F1B step's critical path (see the module's **Time**): ``stage_seconds[s]`` is
    one micro-batch's forward and backward on stage ``s``, ``link_seconds`` one message."""
    if not stage_seconds:
        raise ValueError("no stages")
    return (sum(stage_seconds) + (micro - 1) * max(stage_seconds)
            + 2 * (len(stage_seconds) - 1) * link_seconds)


def bubble(stages: int, micro: int) -> float:
    """The share of an equal stage's step spent idle: ``(S - 1) / (M + S - 1)``."""
    return (stages - 1) / (micro + stages - 1)

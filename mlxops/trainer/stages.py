"""Pipeline stages: which contiguous block of layers each host holds, sized by memory.

Standard library only: ``mlxops plan JOB`` and pre-flight run it on the controller, and
the ranks run it again to learn their own layers.

**Stages.** Hosts in ring order are stages ``0..S-1``; stage ``s`` holds layers
``[a_s, a_{s+1})`` (``a_0 = 0``, ``a_S = L``, at least one each). Stage 0 also holds the
embedding; stage ``S - 1`` the final norm, the head and the loss (with tied embeddings,
a copy of the embedding as its head: :mod:`.pipeline` sums the two copies' gradients).

**A stage's planned peak** is the memory plan's (:mod:`mlxops.trainer.plan` for the
bundled trainer, :mod:`mlxops.finetune.plan` for fine-tuning) restricted to what the stage
holds, with one change: a stage keeps the activations of up to ``k_s = min(S - s, M)``
micro-batches (``M`` a step), the 1F1B schedule's bound (:mod:`.schedule`). Each part
(a layer, the embedding, the head) is a :class:`Part` of four byte counts: ``alive``
(weights and optimizer state, all along), ``grads`` (what its gradients add at the top of
the backward pass), ``update`` (what the optimizer step adds) and ``activation`` (what one
micro-batch keeps in it for the backward pass). With ``X`` the stage's holdings::

    peak_s = sum_X alive + max( sum_X grads + k_s sum_X activation + transient
                                  + loss (last stage),
                                sum_X update )

``transient`` is the plan's layer being differentiated (one micro-batch at a time) and
``loss`` the last stage's logits, softmax and their gradient (one micro-batch at a time:
1F1B runs the last stage's backward right after its forward). With one stage this is
the plan of one rank accumulating ``M`` micro-batches, term for term
(tests/trainer/test_pipeline_stages.py).

**The split** (:func:`split`): with ``B_s`` each host's budget and the utilisation of a
split ``u = max_s peak_s / B_s``,

1. the least ``u*`` any split reaches (a min-max over contiguous splits, by dynamic
   programming: each stage's peak depends on its own block only). ``u* > 1``: refused,
   with each stage's peak and budget of that best split (:class:`StageError`);
2. among splits with every ``peak_s <= (1 + TIE) u* B_s`` (memory within :data:`TIE` of
   the best is a tie), the one with the least predicted time
   ``max_s work_s / speed_s`` (``work``: the stage's share of the compute,
   ``speed``: each host's measured samples/s from ``balance: auto``, all 1 before it
   measured); a tie left goes to the split that gives earlier stages more layers.

So the layers go in proportion to what each host can hold (stage 0 and the last hold
their ends and hold more micro-batches, which the peak counts), and speed decides between
splits that memory leaves equal. An explicit split (``layers`` per host, summing to
``L``) replaces both steps and is refused the same way when a stage does not fit.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property

from . import plan as P
from .config import TrainerConfig
from .schedule import in_flight, step_seconds

#: Splits whose utilisation is within this share of the best are equal for memory.
TIE = 0.05


class StageError(ValueError):
    """No split fits (or the explicit one does not): the message gives the numbers."""


@dataclass(frozen=True)
class Part:
    """What one part of the model costs the stage holding it, in bytes (see the module);
    ``work``: its share of a micro-batch's compute (any unit, the same for every part)."""

    alive: float = 0
    grads: float = 0
    update: float = 0
    activation: float = 0
    work: float = 0

    def __add__(self, other: Part) -> Part:
        return Part(self.alive + other.alive, self.grads + other.grads,
                    self.update + other.update, self.activation + other.activation,
                    self.work + other.work)

    def __sub__(self, other: Part) -> Part:
        return Part(self.alive - other.alive, self.grads - other.grads,
                    self.update - other.update, self.activation - other.activation,
                    self.work - other.work)


@dataclass(frozen=True)
class ModelCosts:
    """A model as the split sees it: its layers in order, its ends, and the per-stage
    terms of one micro-batch (the plan's)."""

    layers: tuple[Part, ...]
    embed: Part          # stage 0
    head: Part           # the last stage: final norm, head (or the tied embedding's copy)
    transient: float     # the layer being differentiated, one micro-batch
    loss: float          # the last stage's logits, softmax and their gradient
    tied: Part = Part()  # tied embeddings: the last stage's copy (none with one stage)

    @cached_property
    def prefix(self) -> list[Part]:
        """``prefix[i]``: the first ``i`` layers together (a block is a difference)."""
        out = [Part()]
        for part in self.layers:
            out.append(out[-1] + part)
        return out


@dataclass(frozen=True)
class StagePlan:
    """One stage of a split: its layers ``[start, stop)``, planned peak and budget."""

    stage: int
    start: int
    stop: int
    peak: int
    budget: int
    in_flight: int       # micro-batches whose activations it holds at most
    work: float

    @property
    def layers(self) -> int:
        return self.stop - self.start

    @property
    def fits(self) -> bool:
        return self.peak <= self.budget

    def to_dict(self) -> dict:
        return {"stage": self.stage, "layers": [self.start, self.stop], "peak_bytes":
                self.peak, "budget_bytes": self.budget, "in_flight": self.in_flight,
                "fits": self.fits}


def stage_peak(costs: ModelCosts, start: int, stop: int, stage: int, stages: int,
               micro: int) -> tuple[int, float]:
    """``(peak bytes, work)`` of stage ``stage`` holding layers ``[start, stop)``."""
    held = costs.prefix[stop] - costs.prefix[start]
    if stage == 0:
        held = held + costs.embed
    last = stage == stages - 1
    if last:
        held = held + costs.head + (costs.tied if stages > 1 else Part())
    k = in_flight(stage, stages, micro)
    compute = held.grads + k * held.activation + costs.transient + (costs.loss if last else 0)
    return int(held.alive + max(compute, held.update)), held.work


def plan_split(costs: ModelCosts, counts: Sequence[int], budgets: Sequence[int],
               micro: int) -> list[StagePlan]:
    """Each stage's plan for a split of ``counts[s]`` layers to stage ``s``."""
    stages, plans, start = len(counts), [], 0
    for s, (n, budget) in enumerate(zip(counts, budgets, strict=True)):
        peak, work = stage_peak(costs, start, start + n, s, stages, micro)
        plans.append(StagePlan(s, start, start + n, peak, int(budget),
                               in_flight(s, stages, micro), work))
        start += n
    return plans


def _describe(plans: Sequence[StagePlan], hosts: Sequence[str] | None) -> str:
    gib = 1024 ** 3
    return ", ".join(
        f"{hosts[p.stage] if hosts else f'stage {p.stage}'}: layers {p.start}-{p.stop - 1} "
        f"{p.peak / gib:.2f} of {p.budget / gib:.2f} GiB" for p in plans)


def _best(costs: ModelCosts, budgets: Sequence[int], micro: int,
          score: Callable[[int, int, int], float]) -> tuple[float, list[int]] | None:
    """The least ``max_s score(stage, start, stop)`` over splits, and of the splits that
    reach it the one giving earlier stages more layers (the lexicographically greatest
    counts); None where every split scores infinity."""
    L, S = len(costs.layers), len(budgets)
    inf = float("inf")
    # least[s][i]: the least max score of stages s.. holding layers i..L-1.
    least = [[inf] * (L + 1) for _ in range(S + 1)]
    least[S][L] = 0.0
    for s in range(S - 1, -1, -1):
        left = S - s - 1                      # stages after s, one layer each at least
        for i in range(s, L - left):
            least[s][i] = min((max(score(s, i, stop), least[s + 1][stop])
                               for stop in range(i + 1, L - left + 1)), default=inf)
    value = least[0][0]
    if value == inf:
        return None
    counts, i = [], 0
    for s in range(S):                        # the most layers that still reach it
        left = S - s - 1
        stop = next(stop for stop in range(L - left, i, -1)
                    if score(s, i, stop) <= value and least[s + 1][stop] <= value)
        counts.append(stop - i)
        i = stop
    return value, counts


def split(costs: ModelCosts, budgets: Sequence[int], micro: int,
          speeds: Sequence[float] | None = None, explicit: Sequence[int] | None = None,
          hosts: Sequence[str] | None = None) -> list[StagePlan]:
    """The stages of ``costs`` over hosts with ``budgets`` (bytes, ring order), ``micro``
    micro-batches a step (see the module). ``speeds``: samples/s each host measured;
    ``explicit``: layers per host, which overrides the rule; ``hosts``: names for the
    messages. Raises :class:`StageError` when nothing fits."""
    L, S = len(costs.layers), len(budgets)
    if S < 1:
        raise StageError("a pipeline needs one host at least")
    if explicit is not None:
        counts = list(explicit)
        if len(counts) != S or sum(counts) != L or min(counts) < 1:
            raise StageError(f"stages: {counts} must give each of the {S} hosts one layer "
                             f"or more, {L} in all")
        plans = plan_split(costs, counts, budgets, micro)
        if not all(p.fits for p in plans):
            raise StageError(f"the split {counts} does not fit: {_describe(plans, hosts)}")
        return plans
    if L < S:
        raise StageError(f"{L} layers cannot make {S} stages of one layer or more")
    speeds = list(speeds) if speeds else [1.0] * S
    if len(speeds) != S or any(not v > 0 for v in speeds):
        raise StageError(f"speeds: {speeds} must be one positive number per host ({S})")

    def util(s: int, i: int, stop: int) -> float:
        return stage_peak(costs, i, stop, s, S, micro)[0] / max(1, budgets[s])

    found = _best(costs, budgets, micro, util)
    assert found is not None   # L >= S: some split exists
    least, counts = found
    if least > 1:
        raise StageError(f"the model does not fit on {S} hosts even split by memory: "
                         + _describe(plan_split(costs, counts, budgets, micro), hosts))
    cap = least * (1 + TIE)

    def seconds(s: int, i: int, stop: int) -> float:
        if util(s, i, stop) > cap:
            return float("inf")
        return stage_peak(costs, i, stop, s, S, micro)[1] / speeds[s]

    found = _best(costs, budgets, micro, seconds)
    assert found is not None   # the first step's split is within the cap
    return plan_split(costs, found[1], budgets, micro)


def trainer_costs(cfg: TrainerConfig, micro: int, accumulation: int) -> ModelCosts:
    """The bundled trainer's model as parts, with ``micro`` sequences a micro-batch and
    ``accumulation`` micro-batches a step: :func:`mlxops.trainer.plan.estimate`'s terms,
    each at the part it belongs to (``work``: forward and backward FLOPs a micro-batch)."""
    m, t = cfg.model, cfg.train
    d, f, v, T = m.dims, m.hidden(), m.vocab_size, m.seq_len
    n, ht = micro * T, m.heads * T
    bf16 = t.dtype == "bfloat16"
    w = 2 if bf16 else 4
    grads = P.G + P.BF16 * bf16 + P.ACCUMULATE * (accumulation > 1)
    update = P.U + P.U_BF16 * bf16

    def params(p: int, activation: float = 0, work: float = 0) -> Part:
        return Part(P.STATE * p, grads * p, update * p, activation, work)

    layer = w * n * (P.A_D * d + P.A_F * f + P.A_S * ht)
    transient = w * n * (P.X_D * d + P.X_F * f + P.X_S * ht)
    kept = layer
    if t.grad_checkpoint:   # each layer keeps its input; one recomputed at a time
        kept = w * n * d * P.CHECKPOINT
        transient += (1 + P.RECOMPUTED) * layer
    if 0 < m.window < T:
        transient += T ** 2   # the window's mask, bool
    per_layer = 4 * d * d + 3 * d * f + 2 * d
    attention = 12 * d * P.attended_keys(T, m.window)
    block = params(per_layer, kept, n * (6 * per_layer + attention))
    head = params(d + (0 if m.tie_embeddings else v * d), work=n * 6 * v * d)
    return ModelCosts(
        layers=(block,) * m.layers, embed=params(v * d), head=head, transient=transient,
        loss=(P.LOGITS + P.LOGITS_BF16 * bf16) * n * v,
        tied=params(v * d) if m.tie_embeddings else Part())


def predicted_step(plans: Sequence[StagePlan], micro: int, sequences: int,
                   speeds: Sequence[float], link_seconds: float = 0.0) -> tuple[float, float]:
    """``(seconds, bubble)`` of one step of a split, from each host's measured speed.

    ``speeds[s]``: the sequences a second host ``s`` trains of the whole model
    (``balance: auto``'s calibration); a stage's share of a micro-batch of ``sequences``
    is its ``work`` over the whole model's, so its forward and backward take
    ``t_s = sequences x share_s / speeds[s]``; the step is the 1F1B schedule's critical path
    (:func:`.schedule.step_seconds`) and the bubble its share not spent computing on the
    busiest stage, ``1 - M max_s t_s / step``."""
    total = sum(p.work for p in plans) or 1.0
    times = [sequences * p.work / total / v for p, v in zip(plans, speeds, strict=True)]
    seconds = step_seconds(times, micro, link_seconds)
    return seconds, 1 - micro * max(times) / seconds if seconds else 0.0

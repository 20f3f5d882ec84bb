"""Unequal ranks: how a global batch is split by speed, and what a split costs.

Each rank takes a contiguous slice of the same global batch, ``counts[r]`` sequences,
and its mean gradient is weighted by ``counts[r] / global_batch`` before the mean over
ranks (the trainer multiplies by ``counts[r] * world / global_batch``, the all-reduce
divides by ``world``), so the update is the equal split's up to summation order.

Which split a rank takes is one rule, :meth:`Balance.split`, called by the trainer and by
``mlxops plan`` (jobs/balance.py): ``equal`` is ``global_batch / world`` each (refused when
it does not divide); a list of weights is :func:`split_counts` by them; ``auto`` is the
near-equal split until speeds are measured, then :func:`auto_split` by them. The speeds
``auto`` measured are the :class:`~mlxops.node.protocol.calibration.Calibration` record
(``calibration.json``), written by the trainer and read by the controller through a node
command; :func:`recorded_speeds` applies one to the ranks of a run.

Standard library only: the controller imports it to show a split in ``mlxops plan``.
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

#: ``balance: auto`` keeps the split it has unless the measured speeds predict a step at
#: least this much shorter with another (equal ranks measure a little apart).
MIN_GAIN = 0.10


def split_counts(global_batch: int, speeds: Sequence[float]) -> list[int]:
    """Sequences per rank, at least one each, that make the slowest rank finish first.

    Minimises the step's compute time ``max(counts[r] / speeds[r])``: every rank starts
    with one sequence, then each further sequence goes to the rank that would finish it
    soonest (ties to the lower rank). With equal speeds and a world size that divides the
    global batch, that is the equal split.
    """
    world = len(speeds)
    if world < 1 or global_batch < world:
        raise ValueError(f"cannot split {global_batch} sequences over {world} ranks, "
                         "at least one each")
    if any(not s > 0 for s in speeds):
        raise ValueError(f"speeds must be positive, got {list(speeds)}")
    counts = [1] * world
    heap = [(2 / s, r) for r, s in enumerate(speeds)]
    heapq.heapify(heap)
    for _ in range(global_batch - world):
        _, r = heapq.heappop(heap)
        counts[r] += 1
        heapq.heappush(heap, ((counts[r] + 1) / speeds[r], r))
    return counts


def step_seconds(counts: Sequence[int], speeds: Sequence[float]) -> float:
    """The compute time of a step: the slowest rank's ``counts[r] / speeds[r]``."""
    return max(c / s for c, s in zip(counts, speeds, strict=True))


def auto_split(global_batch: int, speeds: Sequence[float]) -> list[int]:
    """``balance: auto``'s split: by the measured ``speeds``, unless that predicts a step
    less than :data:`MIN_GAIN` shorter than the near-equal split (equal ranks measure a
    little apart, and a split that gains little is noise)."""
    start = split_counts(global_batch, [1.0] * len(speeds))
    after = split_counts(global_batch, speeds)
    if step_seconds(after, speeds) < step_seconds(start, speeds) * (1 - MIN_GAIN):
        return after
    return start


def scale(counts: Sequence[int], rank: int) -> float:
    """What rank ``rank`` multiplies its mean gradient (and loss) by before the mean over
    ranks: ``counts[rank] * world / global_batch`` (exactly 1.0 for an equal split)."""
    return counts[rank] * len(counts) / sum(counts)


def recorded_speeds(rank_hosts: Sequence[str], measured_hosts: Sequence[str],
                    measured: Sequence[float]) -> list[float] | None:
    """Each rank's samples/s on ``rank_hosts`` (the host of each rank, in rank order) from a
    calibration that measured ranks on ``measured_hosts``, or None if it does not apply.

    A rank's speed depends on its host and on how many ranks share that host, not on its
    rank number: a resume without one host (``--exclude``) keeps the other hosts' speeds,
    each host's ranks taking its measured speeds in their order. A host not measured, or
    measured with another number of ranks on it, makes the calibration stale (None).
    """
    if len(measured_hosts) != len(measured):
        return None
    by_host: dict[str, list[float]] = {}
    for host, speed in zip(measured_hosts, measured, strict=True):
        by_host.setdefault(host, []).append(float(speed))
    now = Counter(rank_hosts)
    if any(len(by_host.get(h, ())) != n for h, n in now.items()):
        return None
    taken = {h: iter(by_host[h]) for h in now}
    return [next(taken[h]) for h in rank_hosts]


#: ``train.balance``'s modes (a job's ``balance:`` takes the same words), and the mode of a
#: list of weights.
EQUAL, AUTO, WEIGHTS = "equal", "auto", "weights"


@dataclass(frozen=True)
class Balance:
    """``train.balance`` as a value: a mode, and for ``weights`` one weight per rank."""

    mode: str
    weights: tuple[float, ...] = ()

    @classmethod
    def of(cls, value: str | Sequence[float]) -> Balance:
        """From the config's value: ``equal``, ``auto`` or a list of per-rank weights."""
        if isinstance(value, str):
            if value not in (EQUAL, AUTO):
                raise ValueError(f"balance: must be {EQUAL}, {AUTO} or weights, got {value!r}")
            return cls(value)
        return cls(WEIGHTS, tuple(float(w) for w in value))

    @property
    def measures(self) -> bool:
        """Whether the split waits for measured speeds (``auto``)."""
        return self.mode == AUTO

    def split(self, global_batch: int, world: int,
              speeds: Sequence[float] | None = None) -> list[int]:
        """Sequences per rank of each step, for ``world`` ranks; ``speeds``: samples/s
        each rank measured (used by ``auto`` only). ValueError for a split the trainer
        refuses (an equal split that does not divide, fewer sequences than ranks, a weight
        per rank missing)."""
        if self.mode == EQUAL:
            if world < 1 or global_batch % world or global_batch < world:
                raise ValueError(f"cannot split {global_batch} sequences equally over "
                                 f"{world} ranks")
            return [global_batch // world] * world
        if self.mode == WEIGHTS:
            if len(self.weights) != world:
                raise ValueError(f"{len(self.weights)} weights for {world} ranks")
            return split_counts(global_batch, self.weights)
        if speeds is None:
            return split_counts(global_batch, [1.0] * world)  # auto before it measured
        return auto_split(global_batch, speeds)

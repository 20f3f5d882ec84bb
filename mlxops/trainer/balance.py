"""Unequal ranks: how a global batch is split by speed, and what a split costs.

Each rank takes a contiguous slice of the same global batch, ``counts[r]`` sequences,
and its mean gradient is weighted by ``counts[r] / global_batch`` before the mean over
ranks (the trainer multiplies by ``counts[r] * world / global_batch``, the all-reduce
divides by ``world``), so the update is the equal split's up to summation order.

Standard library only: the controller imports it to show a split in ``mlxops plan``.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

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


def scale(counts: Sequence[int], rank: int) -> float:
    """What rank ``rank`` multiplies its mean gradient (and loss) by before the mean over
    ranks: ``counts[rank] * world / global_batch`` (exactly 1.0 for an equal split)."""
    return counts[rank] * len(counts) / sum(counts)

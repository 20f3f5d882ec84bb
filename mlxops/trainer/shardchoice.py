"""Whether a run asking ``train.shard_optimizer: auto`` shards AdamW's state (ZeRO-1).

The rule, pure: each place a rank runs (a node; its ranks share its budget equally) has a
budget ``B`` (:func:`.plan.budget_bytes`) and two planned peaks of one of its ranks
(:func:`.plan.plan_memory`, each at the micro-batch and checkpointing its search picks):
``U`` with the state whole and ``S`` with it sharded over the run's ``n`` ranks.

- ``n < 2``: nothing to shard over: unsharded.
- ``U <= B`` everywhere: unsharded. Sharding would add an ``all_gather`` of the weights
  every step (``w P`` bytes, ``w`` = 4 in float32, 2 in bfloat16) and slice the update
  for memory the run does not need: a run that fits is not slowed down.
- else, ``S <= B`` everywhere: sharded, on every rank (the ``all_gather`` is a
  collective, and the ranks take one step: all shard or none), although only the places
  where ``U > B`` need it.
- else neither fits: refused, both peaks against the budget shown.

Why ``S`` is not simply smaller (:mod:`.plan`'s terms, ``P`` parameters): the state is
``4 P + 8 P / n`` instead of ``12 P`` in float32 (``2 P + 12 P / n`` in bfloat16), so the
backward pass's peak falls by ``8 P (n - 1) / n``; but the update also holds
``SLICE_ARRAYS`` float32 arrays of the slice (``4 P / n`` each) and makes moments for the
slice only, so the update's peak moves by ``-16 P + (16 + 4 SLICE_ARRAYS) P / n`` in
float32 (``SLICE_ARRAYS`` = 4: nothing on 2 ranks, ``-5.3 P`` on 3, ``-8 P`` on 4) and
by ``-20 P + (16 + 4 SLICE_ARRAYS) P / n`` in bfloat16 (``-4 P`` on 2). A float32 run
on 2 ranks whose update is its peak is not helped by sharding; the rule compares the
plans, so it says so instead of sharding for nothing.

Standard library only: the controller decides a job's ranks' mode with it at launch
(:mod:`mlxops.jobs.sharding`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class ShardChoice:
    """The rule's answer: ``shard`` the state or not, whether the run then ``fits``, and
    the places (indices) whose unsharded peak is over their budget (``over``) and whose
    sharded one is too (``short``)."""

    shard: bool
    fits: bool
    over: tuple[int, ...]
    short: tuple[int, ...]


def choose(world: int, budgets: Sequence[int], unsharded: Sequence[int],
           sharded: Sequence[int]) -> ShardChoice:
    """The module's rule over ``world`` ranks: per place its budget and its two peaks, in
    bytes (one list entry per place, in the same order)."""
    over = tuple(i for i, (b, u) in enumerate(zip(budgets, unsharded, strict=True)) if u > b)
    short = tuple(i for i, (b, s) in enumerate(zip(budgets, sharded, strict=True)) if s > b)
    if world < 2 or not over:
        return ShardChoice(False, not over, over, short)
    return ShardChoice(not short, not short, over, short)

"""The memory plan's search and its shared record: one rule for every training program.

A program's memory plan (the bundled trainer's :mod:`.plan`, fine-tuning's
:mod:`mlxops.finetune.plan`) has its own terms: what its step holds at its peak for a
micro-batch of ``m`` items, with or without gradient checkpointing. Which micro-batch a
plan suggests is this module's rule, the same for both:

- the candidates are the micro-batches the program's out-of-memory back-off can reach from
  ``train.micro_batch``, largest first (:func:`trainer_micro_batches`: the divisors of
  the rank's share not above the cap; :func:`finetune_micro_batches`: the cap halved, each
  a whole cut of the share);
- the plan takes the first candidate whose peak fits the budget, first without gradient
  checkpointing (unless the config asks for it), then with it;
- when none fits, the plan is the smallest micro-batch (1) with checkpointing, marked
  ``fits: False``.

:class:`PlanFields` are the fields both plans have (``mlxops plan`` prints them in one
table); each plan adds its own. Standard library only: the controller plans without mlx.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any


@dataclass
class PlanFields:
    """What every memory plan says of one rank, in bytes."""

    params: int            # the model's parameters
    grad_bytes: int        # gradients (with their running sum when accumulating)
    optimizer_bytes: int   # the optimizer's state
    activation_bytes: int  # the backward pass's peak above what is alive all along
    update_bytes: int      # the optimizer update's peak above it
    total_bytes: int       # the estimated peak
    budget_bytes: int      # what this rank may use
    budget_from: str       # "working set" (MLX's recommended, Metal) or "memory" (CPU)
    micro_batch: int       # items per forward/backward
    accumulation: int      # micro-batches per step
    grad_checkpoint: bool
    fits: bool
    world_size: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Choice:
    """The micro-batch and checkpointing a plan suggests, and whether its peak fits."""

    micro_batch: int
    grad_checkpoint: bool
    fits: bool


def search(candidates: list[int], grad_checkpoint: bool,
           peak: Callable[[int, bool], int], budget: int) -> Choice:
    """The rule of the module docstring: ``candidates`` largest first, ``peak(micro,
    checkpointing)`` in bytes."""
    for ckpt in ([True] if grad_checkpoint else [False, True]):
        for micro in candidates:
            if peak(micro, ckpt) <= budget:
                return Choice(micro, ckpt, True)
    return Choice(min(candidates), True, False)


def trainer_micro_batches(per_rank: int, cap: int) -> list[int]:
    """The bundled trainer's micro-batches for a share of ``per_rank`` sequences: the
    divisors of the share not above ``cap``, largest first (every micro-batch one shape)."""
    divisors = [d for d in range(per_rank, 0, -1) if per_rank % d == 0]
    return [d for d in divisors if d <= cap] or [1]


def cut(per_rank: int, cap: int) -> int:
    """Fine-tuning's micro-batch for a share of ``per_rank`` examples and a cap: the share
    cut into ``ceil(per_rank / cap)`` micro-batches, the largest of them."""
    pieces = -(-per_rank // max(1, cap))
    return -(-per_rank // pieces)


def finetune_micro_batches(per_rank: int, cap: int) -> list[int]:
    """Fine-tuning's micro-batches from ``cap``, as its back-off halves it, largest first."""
    micro = cut(per_rank, min(cap, per_rank))
    out = [micro]
    while micro > 1:
        micro = cut(per_rank, -(-micro // 2))
        out.append(micro)
    return out

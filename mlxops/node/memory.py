"""What the node's MLX says about memory: the recommended working set of its GPU.

On Apple silicon, CPU and GPU share RAM, and MLX's Metal allocator is built around
``MTLDevice.recommendedMaxWorkingSetSize``: it starts giving its cache back at 95% of it,
and memory beyond it is paged or swapped, which slows every rank of a ring to the pace of
that Mac. MLX reports it as ``mx.device_info()["max_recommended_working_set_size"]``
(``mx.metal.device_info()`` before mlx 0.29); owners report 74% of RAM on a 16 GB M3
and 84% on a 128 GB M5 Max by default (README), and it follows ``sysctl
iogpu.wired_limit_mb`` when that is raised. A rank's memory plan is held
to it (:func:`mlxops.trainer.plan.budget_bytes`).

MLX without a GPU (the Linux CPU build) has no such figure: None, and the plan takes its
CPU budget from the node's RAM instead.

Standard library + mlx, imported late: the node helpers answer without mlx too.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

#: The key of ``mx.device_info()`` that holds it (Metal only).
WORKING_SET_KEY = "max_recommended_working_set_size"


def working_set_of(info: Mapping[str, Any]) -> int | None:
    """The recommended working set in ``mx.device_info()``'s answer; None when it has none
    (MLX's CPU build answers with the CPU's name and architecture only)."""
    value = info.get(WORKING_SET_KEY)
    return int(value) if isinstance(value, int) and value > 0 else None


def recommended_working_set() -> int | None:
    """The GPU's recommended working set in bytes, as this interpreter's MLX reports it;
    None without mlx or without a GPU that has one."""
    try:
        import mlx.core as mx
    except ImportError:
        return None
    reader = getattr(mx, "device_info", None)
    if reader is None:  # mlx < 0.29: the same dict under mx.metal
        metal = getattr(mx, "metal", None)
        if metal is None or not metal.is_available():
            return None
        reader = metal.device_info
    try:
        return working_set_of(reader())
    except (RuntimeError, ValueError):
        return None

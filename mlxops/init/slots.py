"""How many ranks ``mlxops init`` writes for a host (``mlxops_slots``): a rule on its facts.

Policy (a pure rule, no I/O). ``mlxops_slots`` is the number of processes (ranks) a host
runs (docs/inventory.md); a rank computes on the device its MLX uses, so the rule is by
device.

GPU -- an Apple silicon Mac (``Darwin`` on ``arm64``: MLX runs on Metal there), or any
host whose MLX reports a GPU working set: **1 rank**. The Mac has one GPU and every rank's
work goes to it. With ``k`` ranks each gets about ``1/k`` of the GPU's time (the same
FLOP/s in all, ``k`` times the kernel launches and the all-reduce traffic) and ``W/k`` of
its working set ``W`` (:func:`mlxops.trainer.plan.budget_bytes` divides it by the node's
ranks), so a model that fits one rank in ``W`` may not fit ``k`` of them: no ``k > 1``
does more work a step. The cores (8 performance cores on an M1 Pro, 24 on an M3 Ultra)
and the memory do not change that.

CPU -- MLX's CPU build (a Linux host, the sandbox's nodes; an Intel Mac): the ranks share
the cores. A rank runs its elementwise kernels on one thread and its matrix products on
the BLAS library's threads, so it keeps a few cores busy, not all of them; the rule gives
each rank :data:`CORES_PER_RANK` cores and :data:`MEMORY_PER_RANK` of memory:

    slots = min(32, max(1, min(floor(cores / 4), floor(memory / 4 GiB))))

``cores``: the performance cores where the host tells them apart
(``hw.perflevel0.physicalcpu``), else its online CPUs; 32 is the inventory's bound. The
4 and 4 GiB are a choice, not a measurement (no CPU-only cluster was measured here): a
2-core host (the sandbox's node) gets 1 rank, a 16-core 64 GiB server 4. A host that did
not say its cores or memory gets 1.
"""

from __future__ import annotations

from mlxops.hostfacts import HostFacts

CORES_PER_RANK = 4
MEMORY_PER_RANK = 4 * 2**30
MAX_SLOTS = 32  # mlxops_slots' bound (docs/inventory.md)


def computes_on_gpu(facts: HostFacts) -> bool:
    """Whether the host's MLX runs on a GPU: Apple silicon, or an MLX reporting one."""
    return (facts.is_darwin and facts.arch == "arm64") or bool(facts.ranks_working_set)


def slots(facts: HostFacts) -> int:
    """``mlxops_slots`` for a host with ``facts``, by the rule in the module's docstring."""
    if computes_on_gpu(facts):
        return 1
    cores = facts.perf_cores or facts.cpu_cores
    if not cores or not facts.memory_bytes:
        return 1
    return min(MAX_SLOTS, max(1, min(cores // CORES_PER_RANK,
                                     facts.memory_bytes // MEMORY_PER_RANK)))

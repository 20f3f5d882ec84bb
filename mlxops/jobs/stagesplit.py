"""A pipelined job's stages over its hosts: the split, checked against each node's budget.

A job asking for stages (``trainer.stages``: ``auto`` or layers per host,
docs/pipeline.md) runs one rank per host, the hosts in ring order being the stages.
Before any rank starts (``mlxops launch``, ``resume``) and in ``mlxops plan``, the split is
made on the controller by the rule of :func:`mlxops.trainer.stages.split` from each
node's budget: the trainer plan's (:func:`mlxops.trainer.plan.budget_bytes`, the GPU's
recommended working set on a Mac, 80% of the memory elsewhere, a memory cgroup's limit
on a sandbox's small node) for one rank. ``auto`` becomes the list the ranks are given
(``train.stages``); an explicit list is kept, and either is refused, naming the file and
the key, when a stage's planned peak exceeds its node's budget, with each stage's
numbers. A ``resume --exclude`` splits again over the hosts left.

The predicted step (:func:`mlxops.trainer.stages.predicted_step`) needs each host's
measured speed; without one (no ``balance: auto`` calibration) the hosts are taken as
equally fast, which still gives the schedule's bubble.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from mlxops.errors import bad_input
from mlxops.hostfacts import HostFacts
from mlxops.jobs.spec import JobSpec
from mlxops.tasks.facts import ask_facts, load_cached_facts, save_facts
from mlxops.trainer.plan import budget_bytes
from mlxops.trainer.stages import StageError, StagePlan, predicted_step, split
from mlxops.transport import Connector, Results, run_parallel


@dataclass(frozen=True)
class StageSplit:
    """The stages of a job: one :class:`StagePlan` per host in ring order, and the
    schedule's predicted step from ``speeds`` (sequences/s of the whole model per host,
    None: equal, and the step's seconds unknown)."""

    hosts: list[str]
    plans: list[StagePlan]
    micro_batches: int
    sequences: int
    speeds: list[float] | None

    @property
    def layers(self) -> list[int]:
        return [p.layers for p in self.plans]

    @property
    def step(self) -> tuple[float | None, float]:
        """``(seconds or None, bubble)`` of one step."""
        seconds, bubble = predicted_step(self.plans, self.micro_batches, self.sequences,
                                         self.speeds or [1.0] * len(self.plans))
        return (seconds if self.speeds else None), bubble

    def to_dict(self) -> dict[str, Any]:
        seconds, bubble = self.step
        return {"layers": self.layers, "micro_batches": self.micro_batches,
                "step_seconds": seconds, "bubble": bubble,
                "stages": [{"host": h} | p.to_dict() for h, p in zip(self.hosts, self.plans,
                                                                      strict=True)]}


def host_facts(hosts: list, connector: Connector, refresh: bool = False) -> Results:
    """Each host's ``(facts, where they came from)``: cached by ``mlxops provision``
    where they hold its memory, else asked now (and cached)."""

    def work(host) -> tuple[HostFacts, str]:
        cached = None if refresh else load_cached_facts(host.name)
        if cached and cached.memory_bytes:
            return cached, "cached facts"
        fresh = ask_facts(connector.connect(host), host)
        save_facts(host.name, fresh)
        return fresh, "asked now"

    return run_parallel(hosts, work)


def stage_split(spec: JobSpec, hosts: Sequence[Any], facts: dict[str, HostFacts],
                speeds: Sequence[float] | None = None) -> StageSplit | None:
    """The job's stages over ``hosts`` (ring order) with their ``facts``; None for a job
    without stages. Bad input (a split that does not fit) names the job file and key."""
    pipe = spec.workload.pipeline()
    if pipe is None:
        return None
    names = [h.name for h in hosts]
    budgets = []
    for name in names:
        node = facts[name]
        budgets.append(budget_bytes(int(node.memory_bytes or 0), node.ranks_working_set, 1)[0])
    try:
        plans = split(pipe.costs, budgets, pipe.micro_batches, speeds, pipe.explicit, names)
    except StageError as exc:
        raise bad_input(spec.path, pipe.key, str(exc)) from None
    return StageSplit(names, plans, pipe.micro_batches, pipe.sequences,
                      list(speeds) if speeds else None)


def split_spec(spec: JobSpec, hosts: Sequence[Any], facts: dict[str, HostFacts]) -> JobSpec:
    """``spec`` with its stages' layers decided for ``hosts`` (what its ranks are given);
    ``spec`` itself for a job without stages."""
    found = stage_split(spec, hosts, facts)
    if found is None:
        return spec
    return replace(spec, workload=spec.workload.with_split(found.layers))

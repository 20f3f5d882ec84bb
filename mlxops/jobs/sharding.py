"""A job's ``train.shard_optimizer: auto``, decided on the controller over its hosts.

Before any rank starts (``mlxops launch``, ``resume``) and in ``mlxops plan``, each node's
rank is planned twice by the workload's planner (:mod:`mlxops.trainer.plan`): with
AdamW's state whole and sharded over the job's ranks (ZeRO-1), against the node's budget
from its facts (:func:`mlxops.trainer.plan.budget_bytes`: the GPU's recommended working
set on a Mac, 80% of the memory elsewhere, a memory cgroup's limit on a sandbox's small
node), shared by its ranks. The rule of :func:`mlxops.trainer.shardchoice.choose` decides:
unsharded where every node fits so (nothing gathered: a job that fits is not slowed
down), sharded on every rank where some node does not and every node fits sharded, and a
job that fits neither way is refused naming the file and the key, with each node's
numbers (exit 2). ``auto`` becomes ``true`` or ``false`` in the ranks' config; the record
keeps ``auto``, decided again when the job resumes (over the hosts it resumes on).

A rank's share of the global batch is the largest ``balance:`` may give a rank on its host
(:func:`mlxops.jobs.balance.largest_share`, as ``mlxops check`` plans it); ``mlxops
plan`` passes its own split.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from mlxops.errors import bad_input
from mlxops.hostfacts import HostFacts
from mlxops.jobs.spec import JobSpec
from mlxops.trainer.shardchoice import ShardChoice, choose

GB = 1024**3


@dataclass(frozen=True)
class ShardPlan:
    """Per host (job order), one rank's plan with the state whole and sharded, and the
    rule's choice over them."""

    key: str
    hosts: list[str]
    unsharded: list[Any]   # MemoryPlan
    sharded: list[Any]     # MemoryPlan
    choice: ShardChoice

    @property
    def plans(self) -> list[Any]:
        """Each host's plan as its ranks will run."""
        return self.sharded if self.choice.shard else self.unsharded

    def refusal(self) -> str:
        """Why a job that fits neither way is refused, one line: each host whose peak is
        over its budget, both peaks against it."""
        c = self.choice
        if self.unsharded[0].world_size < 2:
            peaks = "; ".join(f"{self.hosts[i]} {self.unsharded[i].total_bytes / GB:.2f} GB, "
                              f"budget {self.unsharded[i].budget_bytes / GB:.2f} GB"
                              for i in c.over)
            return f"{self.key}: auto: one rank has nothing to shard over and does not fit: {peaks}"
        nodes = "; ".join(
            f"{self.hosts[i]} {self.unsharded[i].total_bytes / GB:.2f} GB unsharded, "
            f"{self.sharded[i].total_bytes / GB:.2f} GB sharded, budget "
            f"{self.unsharded[i].budget_bytes / GB:.2f} GB" for i in sorted(
                set(c.over) | set(c.short)))
        return f"{self.key}: auto: a rank fits neither unsharded nor sharded: {nodes}"


def shard_plan(spec: JobSpec, hosts: Sequence[Any], facts: dict[str, HostFacts],
               share: Callable[[str], int | None]) -> ShardPlan | None:
    """Both plans of every host in ``hosts`` (their ``facts``) and the rule's choice; None
    for a job without the choice to make. ``share(host)``: a rank's sequences a step
    there (None: the equal split)."""
    key = spec.workload.shard_auto()
    if key is None:
        return None
    whole = spec.workload.with_shard(False).planner(spec.path)
    split = spec.workload.with_shard(True).planner(spec.path)
    world = sum(h.slots for h in hosts)
    unsharded, sharded = [], []
    for host in hosts:
        node = facts[host.name]
        kwargs = dict(ranks_per_node=host.slots, per_rank=share(host.name),
                      working_set=node.ranks_working_set)
        memory = int(node.memory_bytes or 0)
        unsharded.append(whole.memory(memory, world, **kwargs))
        sharded.append(split.memory(memory, world, **kwargs))
    choice = choose(world, [p.budget_bytes for p in unsharded],
                    [p.total_bytes for p in unsharded], [p.total_bytes for p in sharded])
    return ShardPlan(key, [h.name for h in hosts], unsharded, sharded, choice)


def shard_spec(spec: JobSpec, hosts: Sequence[Any], facts: dict[str, HostFacts]) -> JobSpec:
    """``spec`` with ``auto`` decided for ``hosts`` (what its ranks are given); ``spec``
    itself without the choice to make. A job that fits neither way: bad input naming the
    job file and the key, with the numbers."""
    from mlxops.jobs.balance import largest_share

    found = shard_plan(spec, hosts, facts, lambda name: largest_share(spec, hosts, name))
    if found is None:
        return spec
    if not found.choice.fits:
        raise bad_input(spec.path, None, found.refusal())
    return replace(spec, workload=spec.workload.with_shard(found.choice.shard))

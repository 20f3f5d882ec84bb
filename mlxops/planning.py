"""``mlxops plan JOB``: the job's memory plan for every node of a job (its workload's
planner, :meth:`mlxops.jobs.workloads.Workload.planner`).

Node memory comes from the facts ``mlxops provision`` cached; hosts without cached facts
are asked (one facts command each). The plan itself is the trainer's own
(:func:`mlxops.trainer.plan.plan_memory`), so it is the same estimate the ranks log. Its
budget on a Mac is the recommended working set the node's MLX reported in those facts
(:func:`mlxops.tasks.facts.working_set`).

Per step, beside the compute (6 x parameters x tokens, per rank; attention's scores, which
``model.window`` bounds, apart: trainer/plan.py), the all-reduce of the
gradients as the newest ``mlxops bench`` of the same hosts predicts it (its fit
t(S) = a + b*S, docs/formats.md, "mlxops bench --json"); for a sharded job, the
all_gather of its weights from the same bench's all_gather sweep
(:func:`mlxops.bench.results.all_gather_us`).

A trainer job with ``train.shard_optimizer: auto`` is planned as launch decides it over all
its nodes (:mod:`mlxops.jobs.sharding`): sharded or not, with the other plan beside it
where that explains the choice.

A ``finetune:`` job is planned by fine-tuning's own plan
(:func:`mlxops.finetune.plan.plan_finetune`: base weights, quantized or not, adapters,
optimizer state, activations at the sequence length), read from the base model's files on
the controller; its all-reduce carries the trainable parameters' gradients only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mlxops.bench.results import all_gather_us, gather_source, latest_for, predict_us
from mlxops.errors import UserError
from mlxops.finetune.plan import FinetunePlan
from mlxops.jobs.balance import BalancePlan
from mlxops.jobs.selection import select_hosts
from mlxops.jobs.spec import JobSpec
from mlxops.jobs.stagesplit import host_facts
from mlxops.trainer.plan import MemoryPlan
from mlxops.transport import Connector, Results


@dataclass
class NodePlan:
    host: str
    memory_bytes: int
    chip: str
    ranks: int
    plan: MemoryPlan | FinetunePlan
    source: str            # "cached facts" or "asked now"
    #: Where the job does not fit every node: the plan with the optimizer state sharded
    #: over the ranks (ZeRO-1), for a workload that can shard it.
    sharded: MemoryPlan | None = None
    #: Where ``train.shard_optimizer: auto`` shards the job: the plan with the state whole
    #: that did not fit (:mod:`mlxops.jobs.sharding`).
    unsharded: MemoryPlan | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"host": self.host, "memory_bytes": self.memory_bytes, "chip": self.chip,
                "ranks": self.ranks, "facts": self.source, **self.plan.to_dict(),
                "sharded_plan": self.sharded.to_dict() if self.sharded else None,
                "unsharded_plan": self.unsharded.to_dict() if self.unsharded else None}


def plan_job(spec: JobSpec, connector: Connector, *, refresh: bool = False,
             split: BalancePlan | None = None) -> tuple[list[NodePlan], Results]:
    """``split``: the job's ``balance:`` (:func:`mlxops.jobs.balance.balance_plan`); a rank
    is planned with its own share of the global batch (the largest on its host)."""
    planner = spec.workload.planner(spec.path)  # a model's files read now, on the controller
    if planner is None:
        raise UserError(f"{spec.path}: {spec.workload.kind}: 'mlxops plan' plans the bundled "
                        f"trainer and fine-tuning; this job runs {spec.workload.what}")
    hosts = select_hosts(spec)
    world = sum(h.slots for h in hosts)

    results = host_facts(hosts, connector, refresh)
    facts = results.succeeded_values()
    plans = []
    for host in hosts:
        if host.name not in facts:
            continue
        node, source = facts[host.name]
        memory = int(node.memory_bytes or 0)
        per_rank = split.largest(host.name) if split else None
        plan = planner.memory(memory, world, ranks_per_node=host.slots, per_rank=per_rank,
                              working_set=node.ranks_working_set)
        plans.append(NodePlan(host.name, memory, node.chip or node.arch or "",
                              host.slots, plan, source))
    if spec.workload.shard_auto() is not None and len(plans) == len(hosts):
        _decide(spec, hosts, {n: f for n, (f, _) in facts.items()}, plans, split)
    elif not all(p.plan.fits for p in plans) and not any(
            getattr(p.plan, "sharded", False) for p in plans):
        # What sharding AdamW's state over the ranks would make of it (ZeRO-1); a job
        # that fits without is planned, and runs, unsharded: nothing to pay for.
        for p in plans:
            node = facts[p.host][0]
            p.sharded = planner.sharded(
                p.memory_bytes, world, ranks_per_node=p.ranks,
                per_rank=split.largest(p.host) if split else None,
                working_set=node.ranks_working_set)
    return plans, results


def _decide(spec: JobSpec, hosts: list, facts: dict, plans: list[NodePlan],
            split: BalancePlan | None) -> None:
    """``train.shard_optimizer: auto`` as launch decides it over every host
    (:mod:`mlxops.jobs.sharding`): each node's plan as it will run; sharded, the plan
    whole beside it; fitting neither way, the sharded one beside the plan."""
    from mlxops.jobs.sharding import shard_plan

    found = shard_plan(spec, hosts, facts,
                       lambda name: split.largest(name) if split else None)
    for p, whole, sharded in zip(plans, found.unsharded, found.sharded, strict=True):
        if found.choice.shard:
            p.plan, p.unsharded = sharded, whole
        else:
            p.plan = whole
            p.sharded = None if found.choice.fits else sharded


def step_estimate(spec: JobSpec, plans: list[NodePlan]) -> dict[str, Any] | None:
    """One step per rank: its compute (6 x parameters x tokens, in GFLOP) and the all-reduce
    of its fp32 gradients predicted from the newest bench of these hosts (None: no bench)."""
    planner = spec.workload.planner(spec.path) if plans else None
    if planner is None:
        return None
    m = plans[0].plan
    tokens, nbytes = planner.step_work(m)
    out: dict[str, Any] = {"compute_gflop": 6 * m.params * tokens / 1e9,
                           "attention_gflop": None, "attended_keys": None,
                           "gradient_bytes": nbytes, "allreduce": None, "all_gather": None}
    gathered = None
    if plans[0].sharded is not None or getattr(m, "sharded", False):
        # The job runs sharded, or sharding is shown as what would make it fit.
        gathered = planner.gathered_bytes(m.world_size)
        out["all_gather"] = {"bytes": gathered, "predicted_us": None, "fit_of": None}
    attention = planner.attention(tokens)
    if attention is not None:
        # The bundled model's attention (its window included); a fine-tuned model's is
        # in its 6 x parameters estimate.
        out["attention_gflop"], out["attended_keys"] = attention
    found = latest_for([p.host for p in plans])
    if found is not None:
        path, doc = found
        info = doc["allreduce_info"]
        out["allreduce"] = {"bench": str(path), "bench_ranks": info["ranks"],
                            "fit": info["fit"],
                            "predicted_us": predict_us(info, nbytes, m.world_size)}
        if gathered is not None:
            out["all_gather"].update(
                predicted_us=all_gather_us(info, gathered, m.world_size),
                fit_of=gather_source(info))
    return out

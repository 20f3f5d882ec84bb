"""``mlxops plan JOB``: the trainer's memory plan for every node of a job.

Node memory comes from the facts ``mlxops provision`` cached; hosts without cached facts
are asked (one facts command each). The plan itself is the trainer's own
(:func:`mlxops.trainer.plan.plan_memory`), so it is the same estimate the ranks log. Its
budget on a Mac is the recommended working set the node's MLX reported in those facts
(:func:`mlxops.tasks.facts.working_set`).

Per step, beside the compute (6 x parameters x tokens, per rank; attention's scores, which
``model.window`` bounds, apart: trainer/plan.py), the all-reduce of the
gradients as the newest ``mlxops bench`` of the same hosts predicts it (its fit
t(S) = a + b*S, docs/formats.md, "mlxops bench --json").

A ``finetune:`` job is planned by fine-tuning's own plan
(:func:`mlxops.finetune.plan.plan_finetune`: base weights, quantized or not, adapters,
optimizer state, activations at the sequence length), read from the base model's files on
the controller; its all-reduce carries the trainable parameters' gradients only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mlxops.bench.results import bus_factor, latest_for, predict_us
from mlxops.errors import UserError
from mlxops.finetune.plan import FinetunePlan, ModelError, plan_finetune, read_model
from mlxops.hostfacts import HostFacts
from mlxops.jobs.balance import BalancePlan
from mlxops.jobs.selection import select_hosts
from mlxops.jobs.spec import JobSpec
from mlxops.tasks.facts import ask_facts, load_cached_facts, save_facts
from mlxops.trainer.plan import MemoryPlan, attended_keys, attention_flops_per_token, plan_memory
from mlxops.transport import Connector, Results, run_parallel


@dataclass
class NodePlan:
    host: str
    memory_bytes: int
    chip: str
    ranks: int
    plan: MemoryPlan | FinetunePlan
    source: str            # "cached facts" or "asked now"

    def to_dict(self) -> dict[str, Any]:
        return {"host": self.host, "memory_bytes": self.memory_bytes, "chip": self.chip,
                "ranks": self.ranks, "facts": self.source, **self.plan.to_dict()}


def plan_job(spec: JobSpec, connector: Connector, *, refresh: bool = False,
             split: BalancePlan | None = None) -> tuple[list[NodePlan], Results]:
    """``split``: the job's ``balance:`` (:func:`mlxops.jobs.balance.balance_plan`); a rank
    is planned with its own share of the global batch (the largest on its host)."""
    if spec.trainer is None and spec.finetune is None:
        raise UserError(f"{spec.path}: trainer: 'mlxops plan' plans the bundled trainer and "
                        "fine-tuning; this job runs its own 'command:'")
    shape = None
    if spec.finetune is not None:
        try:
            shape = read_model(spec.finetune.model.path)
        except ModelError as exc:
            raise UserError(f"{spec.path}: finetune.model.path: {exc}") from None
    hosts = select_hosts(spec)
    world = sum(h.slots for h in hosts)

    def work(host) -> tuple[HostFacts, str]:
        """The host's facts, and where they came from."""
        cached = None if refresh else load_cached_facts(host.name)
        if cached and cached.memory_bytes:
            return cached, "cached facts"
        fresh = ask_facts(connector.connect(host), host)
        save_facts(host.name, fresh)
        return fresh, "asked now"

    results = run_parallel(hosts, work)
    facts = results.succeeded_values()
    plans = []
    for host in hosts:
        if host.name not in facts:
            continue
        node, source = facts[host.name]
        memory = int(node.memory_bytes or 0)
        per_rank = split.largest(host.name) if split else None
        if shape is not None:
            plan = plan_finetune(spec.finetune, shape, memory, world,
                                 ranks_per_node=host.slots, per_rank=per_rank,
                                 working_set=node.ranks_working_set)
        else:
            plan = plan_memory(spec.trainer, memory, world, ranks_per_node=host.slots,
                               per_rank=per_rank, working_set=node.ranks_working_set)
        plans.append(NodePlan(host.name, memory, node.chip or node.arch or "",
                              host.slots, plan, source))
    return plans, results


def step_estimate(spec: JobSpec, plans: list[NodePlan]) -> dict[str, Any] | None:
    """One step per rank: its compute (6 x parameters x tokens, in GFLOP) and the all-reduce
    of its fp32 gradients predicted from the newest bench of these hosts (None: no bench)."""
    if not plans or (spec.trainer is None and spec.finetune is None):
        return None
    m = plans[0].plan
    if isinstance(m, FinetunePlan):
        # Forward over every parameter, backward through the adapted ones: about 6 x
        # params x tokens at most; the wire carries the trainable gradients alone.
        tokens = m.micro_batch * m.accumulation * m.seq_len
        nbytes = m.trainable_bytes
    else:
        tokens = m.micro_batch * m.accumulation * spec.trainer.model.seq_len
        nbytes = 4 * m.params
    out: dict[str, Any] = {"compute_gflop": 6 * m.params * tokens / 1e9,
                           "attention_gflop": None, "attended_keys": None,
                           "gradient_bytes": nbytes, "allreduce": None}
    if spec.trainer is not None:
        # The bundled model's attention (its window included); a fine-tuned model's is
        # in its 6 x parameters estimate.
        model = spec.trainer.model
        out["attention_gflop"] = attention_flops_per_token(spec.trainer) * tokens / 1e9
        out["attended_keys"] = attended_keys(model.seq_len, model.window)
    found = latest_for([p.host for p in plans])
    if found is not None:
        path, doc = found
        info = doc["allreduce_info"]
        out["allreduce"] = {"bench": str(path), "bench_ranks": info["ranks"],
                            "fit": info["fit"],
                            "predicted_us": predict_us(info, nbytes, m.world_size)}
    return out


def all_gather_us(info: dict[str, Any], nbytes: int, world: int) -> float | None:
    """ZeRO-1's ``all_gather`` of ``nbytes`` (the weights, every step) over ``world``
    ranks, predicted from a bench's all-reduce fit ``t(S) = a + b S`` (``info``: its
    ``allreduce_info``). A ring all_gather carries ``(n - 1) / n`` of the bytes over each
    link, half an all-reduce's bus factor ``2 (n - 1) / n``, in one call (one ``a``):
    ``a + b S (n - 1) / n / busfactor(bench ranks)``. None without a fit; 0 on one rank."""
    params, ranks = info.get("fit"), info.get("ranks")
    if world < 2:
        return 0.0
    if not params or not ranks or ranks < 2:
        return None
    return params["a_us"] + params["b_us_per_byte"] * nbytes * (bus_factor(world) / 2) \
        / bus_factor(ranks)

"""``mlxops plan JOB``: memory and batch plan per node."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import click

from mlxops import console
from mlxops.cli.options import connect_options, json_option
from mlxops.errors import EXIT_FAILED

if TYPE_CHECKING:
    from rich.table import Table

    from mlxops.jobs.spec import JobSpec
    from mlxops.jobs.stagesplit import StageSplit
    from mlxops.planning import NodePlan
    from mlxops.transport import Connector

GB = 1024**3


def plan_table(plans: Sequence[NodePlan]) -> Table:
    """One row per node: what one of its ranks needs against what it may use, and the
    batch split that fits. What every node shares is said under it (:func:`plan_notes`)."""
    table = console.table(
        console.column("host", wrap=True), console.column("mem GB", right=True),
        console.column("ranks", right=True), console.column("rank GB", right=True),
        console.column("budget GB", right=True), console.column("micro x acc", right=True),
        console.column("grad ckpt"), console.column("fits"))
    for p in plans:
        m = p.plan
        table.add_row(p.host, f"{p.memory_bytes / GB:.0f}", str(p.ranks),
                      f"{m.total_bytes / GB:.2f}", f"{m.budget_bytes / GB:.1f}",
                      f"{m.micro_batch} x {m.accumulation}",
                      "on" if m.grad_checkpoint else "off",
                      "[green]yes[/]" if m.fits else "[bold red]NO[/]")
    return table


def _size(nbytes: int) -> str:
    """``2.26 GB``, or ``14.8 MB`` below a GB (binary units, as the table's)."""
    return f"{nbytes / GB:.3g} GB" if nbytes >= GB else f"{nbytes / 1024**2:.3g} MB"


def _grouped(values: dict[str, str]) -> list[str]:
    """``value (host, host)`` per distinct value, in first-seen order; ``value`` alone when
    every host has it."""
    hosts_of: dict[str, list[str]] = {}
    for host, value in values.items():
        hosts_of.setdefault(value, []).append(host)
    if len(hosts_of) == 1:
        return list(hosts_of)
    return [f"{value} ({', '.join(hosts)})" for value, hosts in hosts_of.items()]


def plan_notes(plans: Sequence[NodePlan]) -> list[str]:
    """The lines under the plan table: chips, the per-rank breakdown, the global batch."""
    from mlxops.finetune.plan import FinetunePlan

    if not plans:
        return []
    m = plans[0].plan
    lines = [f"chip: {chip}" for chip in _grouped({p.host: p.chip or "?" for p in plans})]
    if isinstance(m, FinetunePlan):
        return lines + finetune_notes(plans)
    if getattr(m, "sharded", False):   # ZeRO-1: this rank's slice of the moments
        lines.append(f"per rank: weights {_size(m.param_bytes)} and its slice of the moments "
                     f"{_size(m.optimizer_bytes)}")
    else:
        lines.append(f"per rank: weights+moments {_size((4 + 8) * m.params)}")
    lines += [f"peak: {above}" for above in _grouped({
        p.host: f"backward +{_size(p.plan.activation_bytes)}, update "
                f"+{_size(p.plan.update_bytes)}" for p in plans})]
    lines += [f"budget: {source}" for source in _grouped({
        p.host: "MLX's recommended working set" if p.plan.budget_from == "working set"
        else "80% of memory (no GPU working set reported)" for p in plans})]
    shares = {p.plan.micro_batch * p.plan.accumulation for p in plans}
    if len(shares) == 1:
        lines.append(f"{m.params / 1e6:.1f}M parameters; global batch "
                     f"{m.micro_batch * m.accumulation * m.world_size} = micro_batch "
                     f"{m.micro_batch} x accumulation {m.accumulation} x world "
                     f"{m.world_size}")
    else:  # balance: each host's ranks take their own share (the split below)
        lines.append(f"{m.params / 1e6:.1f}M parameters; the global batch is split "
                     f"unequally over {m.world_size} ranks (balance, below)")
    return lines


def finetune_notes(plans: Sequence[NodePlan]) -> list[str]:
    """A fine-tuning rank's terms (mlxops/finetune/plan.py): what every node holds alike,
    then each node's peak above it."""
    m = plans[0].plan
    base = (f"{m.quantized_bits}-bit, " if m.quantized_bits else "") + _size(m.base_bytes)
    lines = [f"per rank: base weights {base}; trainable {m.trainable_params / 1e6:.3g}M "
             f"parameters {_size(m.trainable_bytes)}, gradients {_size(m.grad_bytes)}, "
             f"optimizer state {_size(m.optimizer_bytes)}"]
    lines += [f"peak: {above}" for above in _grouped({
        p.host: f"activations at {p.plan.seq_len} tokens x micro-batch "
                f"{p.plan.micro_batch} +{_size(p.plan.activation_bytes)}, update "
                f"+{_size(p.plan.update_bytes)}" for p in plans})]
    lines += [f"budget: {source}" for source in _grouped({
        p.host: "MLX's recommended working set" if p.plan.budget_from == "working set"
        else "80% of memory (no GPU working set reported)" for p in plans})]
    lines.append(f"{m.params / 1e6:.1f}M parameters in the base model; each rank's "
                 f"examples a step = micro-batch {m.micro_batch} x accumulation "
                 f"{m.accumulation}, over {m.world_size} ranks")
    return lines


def sharded_notes(plans: Sequence[NodePlan], step: dict | None) -> list[str]:
    """Where the job does not fit: whether sharding AdamW's state over the ranks (ZeRO-1)
    makes it fit, each node's peak then, and the all_gather it adds a step."""
    sharded = [p for p in plans if p.sharded is not None]
    if not sharded:
        return []
    fits = all(p.sharded.fits for p in sharded)
    peaks = _grouped({p.host: f"{p.sharded.total_bytes / GB:.2f} GB of "
                              f"{p.sharded.budget_bytes / GB:.1f}" for p in sharded})
    head = ("fits with the optimizer state sharded over the ranks (ZeRO-1)" if fits else
            "does not fit even with the optimizer state sharded over the ranks (ZeRO-1)")
    return [f"{head}: rank peak {'; '.join(peaks)}", *gather_notes(step)]


def auto_notes(plans: Sequence[NodePlan], step: dict | None, auto: bool) -> list[str]:
    """``train.shard_optimizer: auto`` (``auto``), as launch decides it: sharded, each
    node's rank peak with the state whole and sharded against its budget, and the
    all_gather it adds a step; or not sharded, nothing to pay."""
    if not auto or not plans:
        return []
    whole = [p for p in plans if p.unsharded is not None]
    if not whole:
        return (["train.shard_optimizer auto: not sharded (every rank fits with the "
                 "optimizer state whole: nothing gathered)"]
                if all(p.plan.fits for p in plans) else [])
    peaks = _grouped({p.host: f"{_size(p.unsharded.total_bytes)} whole, "
                              f"{_size(p.plan.total_bytes)} sharded, budget "
                              f"{_size(p.plan.budget_bytes)}" for p in whole})
    return [f"train.shard_optimizer auto: sharded over the ranks (ZeRO-1), the state whole "
            f"does not fit: rank peak {'; '.join(peaks)}", *gather_notes(step)]


def gather_notes(step: dict | None) -> list[str]:
    """The weights' all_gather a sharded step adds, predicted from the last bench."""
    gather = (step or {}).get("all_gather")
    if not gather:
        return []
    # A bench saved before its all_gather sweep predicts from its all-reduce fit, which
    # measured 1.1-1.6x the gather on a quiet machine, up to 3.6x under load
    # (benchmarks/README.md, "zero.py"): said, so that it is rerun.
    source = ("the bench" if gather.get("fit_of") != "all_sum" else
              "the bench's all-reduce: no all_gather sweep in it, rerun 'mlxops bench'")
    cost = ("no 'mlxops bench' of these hosts yet" if gather["predicted_us"] is None
            else f"~{gather['predicted_us'] / 1e3:.3g} ms a step (from {source})")
    return [f"  + weights all_gather {gather['bytes'] / 1e6:.3g} MB: {cost}"]


def step_notes(step: dict | None) -> list[str]:
    """The compute of one step and, from the last bench of these hosts, its all-reduce."""
    if step is None:
        return []
    lines = [f"per step and rank: {step['compute_gflop']:.3g} GFLOP of compute "
             "(6 x params x tokens)"]
    # Attention's scores are not in 6 x params: their own line (model.window bounds them).
    # (A fine-tuning job's model is mlx-lm's: its attention is not estimated apart.)
    attention = [] if step["attention_gflop"] is None else [
        f"  + {step['attention_gflop']:.3g} GFLOP of attention (a query attends to "
        f"{step['attended_keys']:.4g} keys)"]
    grads = f"gradient all-reduce {step['gradient_bytes'] / 1e6:.3g} MB"
    ar = step["allreduce"]
    if ar is None:
        return [*lines, f"{grads}: no 'mlxops bench' of these hosts yet", *attention]
    return [*lines, f"{grads}: ~{ar['predicted_us'] / 1e3:.3g} ms (bench "
                    f"{Path(ar['bench']).name}, {ar['bench_ranks']} ranks)", *attention]


def stage_table(found: StageSplit) -> Table:
    """One row per stage (host, ring order): its layers, planned peak and budget."""
    table = console.table(
        console.column("stage", right=True), console.column("host", wrap=True),
        console.column("layers", right=True), console.column("in flight", right=True),
        console.column("peak GB", right=True), console.column("budget GB", right=True),
        console.column("fits"))
    for host, p in zip(found.hosts, found.plans, strict=True):
        table.add_row(str(p.stage), host, f"{p.start}-{p.stop - 1}", str(p.in_flight),
                      f"{p.peak / GB:.2f}", f"{p.budget / GB:.2f}",
                      "[green]yes[/]" if p.fits else "[bold red]NO[/]")
    return table


def stage_notes(found: StageSplit) -> list[str]:
    seconds, bubble = found.step
    step = (f"predicted step {seconds * 1e3:.0f} ms" if seconds is not None else
            "step time: needs each host's measured speed (hosts taken as equally fast)")
    return [f"stages: layers {found.layers} over {len(found.hosts)} hosts; "
            f"{found.micro_batches} micro-batches of {found.sequences} a step through every "
            f"stage (1F1B)",
            f"{step}; pipeline bubble {bubble:.0%} of the step"]


def _plan_stages(job: str, spec: JobSpec, connector: Connector, refresh: bool,
                 as_json: bool) -> None:
    """``mlxops plan`` of a job with stages: the split over its hosts (a split that does
    not fit is refused with each stage's numbers, exit 2)."""
    from mlxops.jobs.selection import select_hosts
    from mlxops.jobs.stagesplit import host_facts, stage_split

    hosts = select_hosts(spec)
    results = host_facts(hosts, connector, refresh)
    facts = {name: f for name, (f, _) in results.succeeded_values().items()}
    reached = [h for h in hosts if h.name in facts]
    found = stage_split(spec, reached, facts) if reached == hosts else None
    if as_json:
        console.print_json({"name": spec.name, "fits": found is not None,
                            "stages": found.to_dict() if found else None,
                            "unreachable": {h: results[h].message for h in results.unreachable}})
    else:
        for host in results.unreachable:
            console.err.print(f"{host}: unreachable: {results[host].message}")
        if found is not None:
            console.print_table(stage_table(found))
            console.out.print()
            for line in stage_notes(found):
                console.out.print(line, markup=False)
            console.out.print(f"Next: mlxops launch {job}", markup=False)
    sys.exit(results.exit_code or (0 if found is not None else EXIT_FAILED))


@click.command("plan")
@click.argument("job", type=click.Path(dir_okay=False))
@click.option("--refresh", is_flag=True, help="Ask every node for its memory, ignoring cached "
                                                "facts.")
@json_option
@connect_options
def command(job, refresh, as_json, connect):
    """Per node: parameters, gradients, optimizer state and activations of one rank, and the
    micro-batch, accumulation and checkpointing that fit its memory."""
    from mlxops.cli.plan_balance import balance_notes, balance_table, shown
    from mlxops.jobs.balance import balance_plan
    from mlxops.jobs.spec import load_job
    from mlxops.planning import plan_job, step_estimate
    from mlxops.transport import Connector

    spec = load_job(job)
    if spec.workload.pipeline() is not None:
        with Connector(connect) as connector:
            _plan_stages(job, spec, connector, refresh, as_json)
        return
    with Connector(connect) as connector:
        split = balance_plan(spec, connector) if spec.workload.splits_batch else None
        plans, results = plan_job(spec, connector, refresh=refresh, split=split)
    fits = all(p.plan.fits for p in plans)
    step = step_estimate(spec, plans)
    if as_json:
        console.print_json({"name": spec.name, "fits": fits, "step": step,
                            "nodes": [p.to_dict() for p in plans],
                            "unreachable": {h: results[h].message for h in results.unreachable},
                            "balance": split.to_dict() if split else None})
    else:
        console.print_table(plan_table(plans))
        for host in results.unreachable:
            console.err.print(f"{host}: unreachable: {results[host].message}")
        if plans:
            console.out.print()
        auto = spec.workload.shard_auto() is not None
        for line in (plan_notes(plans) + step_notes(step) + sharded_notes(plans, step)
                     + auto_notes(plans, step, auto)):
            console.out.print(line, markup=False)
        if split and plans and shown(split):
            console.out.print()
            console.print_table(balance_table(split))
            for line in balance_notes(split):
                console.out.print(line, markup=False)
        if plans:
            console.out.print(f"Next: mlxops launch {job}", markup=False)
    if results.exit_code:
        sys.exit(results.exit_code)
    sys.exit(0 if fits else EXIT_FAILED)

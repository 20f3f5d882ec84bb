"""Start a job: pre-flight every node, then start every rank detached, then record the job.

Pre-flight (:mod:`mlxops.jobs.preflight`) passes on every host or nothing starts. Then, one
command per host writes the run directory (:mod:`mlxops.jobs.runfiles`: configs, hostfile,
one start script per rank) and spawns that host's ranks in their own sessions, so they
outlive the SSH connection and the controller.

``backend: mpi``: the rank scripts are the same, but mpirun starts them. The job's first
host (the one with rank 0) also gets ``launcher.sh`` (mpirun with one app context per rank,
each running that rank's script on its own host); every other host is written first, then
the first host is written and its launcher spawned detached, like a rank.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from mlxops.errors import UserError
from mlxops.jobs.fastsynch import fast_synch_on
from mlxops.jobs.placement import NodePaths, Rank, place_ranks
from mlxops.jobs.preflight import (
    HostPrep,
    check_preflight,
    preflight,
    resumable_steps,
    verify_collectives,
)
from mlxops.jobs.record import HostRecord, JobRecord, launched_job
from mlxops.jobs.runfiles import run_files, start_command_prefix, tar
from mlxops.jobs.selection import rdma_devices, select_hosts
from mlxops.jobs.spec import JobSpec
from mlxops.jobs.stop import stop_job
from mlxops.node import protocol
from mlxops.transport import Connector, Results, nodecmd, run_parallel


def _start(spec: JobSpec, preps: dict[str, HostPrep], ranks: list[Rank], resume: bool,
           rdma: list | None, connector: Connector, forks: int | None,
           fresh: bool = False) -> Results:
    """Write every host's run files and start its ranks; each result's value is the node's
    :class:`~mlxops.node.protocol.SpawnAnswer`."""
    mpi = spec.backend == protocol.MPI
    launcher = ranks[0].host

    def work(host) -> protocol.SpawnAnswer:
        prep = preps[host.name]
        paths = NodePaths(prep.root, spec.name)
        archive = tar(run_files(spec, prep, ranks, resume, rdma, preps))
        # mpi: mpirun starts the ranks; this only writes the files (and clears `stopped`).
        host_ranks = [] if mpi else [r.rank for r in ranks if r.host == host.name]
        args = protocol.spawn_args(paths.run_dir, host_ranks,
                                   launcher=mpi and host.name == launcher)
        return nodecmd.run_node(connector.connect(host), prep.python, paths.code, args,
                                stdin=archive,
                                prefix=start_command_prefix(paths.run_dir, fresh))

    hosts = [p.host for p in preps.values()]
    if not mpi:
        return run_parallel(hosts, work, forks=forks)
    # Every rank script must be in place before mpirun (on the first host) starts them.
    others = run_parallel([h for h in hosts if h.name != launcher], work, forks=forks)
    if others.exit_code:
        return others
    first = run_parallel([h for h in hosts if h.name == launcher], work, forks=forks)
    return Results({**dict(others.items()), **dict(first.items())})


def launch(spec: JobSpec, connector: Connector, *, resume: bool = False,
           exclude: Sequence[str] = (), forks: int | None = None,
           previous: JobRecord | None = None, fresh: bool = False,
           on_warning: Callable[[str], None] = lambda _: None) -> JobRecord:
    """Pre-flight, then start every rank; returns the saved record. Raises on any problem.

    ``fresh`` starts over: an earlier run of the same name is removed from every node, but
    only once pre-flight passed everywhere (never while a rank of it runs).
    ``on_warning`` hears what started but slower than it should: a node whose kernel cache
    is not safe to use (its ranks compile every MLX CPU kernel again, in their run).
    """
    if fresh and resume:
        raise UserError("--fresh starts over and resume continues: choose one")
    hosts = select_hosts(spec, exclude)
    rdma = rdma_devices(spec, hosts)  # bad input is refused before any host is touched
    spec = _split_stages(spec, hosts, connector)
    spec = _decide_sharding(spec, hosts, connector)
    ranks = place_ranks(hosts, spec.base_port, one_per_host=spec.workload.one_rank_per_host)
    results, preps = preflight(spec, hosts, ranks, connector, forks)
    results.raise_on_failure("pre-flight")
    step = check_preflight(spec, preps, ranks, resume, fresh)
    verify_collectives(spec, ranks, connector, launch)  # those the job trusts with data
    if resume and step is not None and spec.workload.spreads_checkpoints():
        # Every node gets the parts of that step it needs (other stages', slices): ckptmove.
        step = _bring_parts(spec, preps, ranks, previous, connector, forks, on_warning)
    if resume and step is not None:
        # Every node resumes from the same step: drop newer checkpoints only some nodes have.
        _align_checkpoints(spec, preps, step, connector, forks)
    started = _start(spec, preps, ranks, resume, rdma, connector, forks, fresh)
    record = JobRecord(
        name=spec.name, job_file=str(spec.path), inventory=str(spec.inventory),
        backend=spec.backend, workload=spec.workload,
        hosts=[HostRecord(n, p.root, p.python) for n, p in preps.items()],
        ranks=ranks, state=protocol.RUNNING,
        attempt=(previous.attempt + 1) if previous else 1,
        steps=spec.total_steps,
        restart=spec.restart, stop_grace=spec.stop_grace, job=launched_job(spec),
        excluded=list(exclude),
        restarts=list(previous.restarts) if previous else [],
        stray=[h for h in previous.stray if h.name not in preps] if previous else [],
        created=previous.created if previous else time.time(),
        stopped_at=previous.stopped_at if previous else None,
        supervisor=previous.supervisor if previous else None,  # a restart keeps its own
        message=f"resumed from step {step}" if resume and step is not None else "",
        fast_synch=fast_synch_on(spec.env, hosts),
        needs_reboot=list(previous.needs_reboot) if previous else [],
    )
    record.save()
    for host, answer in sorted(started.succeeded_values().items()):
        if answer.kernel_cache_refused:
            on_warning(f"{host}: the kernel cache is not used ({answer.kernel_cache_refused}):"
                       " its ranks compile MLX's CPU kernels again, in their run directory")
    if started.exit_code:
        # Some ranks started, some did not: leave nothing half-running.
        stop_job(record, connector, grace=1.0, mark_stopped=False)
        record.state = protocol.FAILED
        record.save()
        started.raise_on_failure("starting ranks")
    return record


def _split_stages(spec: JobSpec, hosts: list, connector: Connector) -> JobSpec:
    """A pipelined job's layers per host (``stages: auto`` split by memory over these
    hosts, an explicit split checked against their budgets): :mod:`.stagesplit`."""
    if spec.workload.pipeline() is None:
        return spec
    from mlxops.jobs.stagesplit import host_facts, split_spec

    found = host_facts(hosts, connector)
    found.raise_on_failure("reading the nodes' memory for the stages")
    facts = {name: f for name, (f, _) in found.succeeded_values().items()}
    return split_spec(spec, hosts, facts)


def _bring_parts(spec: JobSpec, preps: dict[str, HostPrep], ranks: list[Rank],
                 previous: JobRecord | None, connector: Connector, forks: int | None,
                 on_warning: Callable[[str], None]) -> int | None:
    """The step to resume from, once its checkpoint parts are on every node that needs
    them (asked of the run's nodes and of the previous run's that this one leaves out)."""
    from mlxops.jobs.ckptmove import Node, bring_together
    from mlxops.jobs.record import inventory_hosts

    nodes = [Node(p.host, p.root, p.python) for p in preps.values()]
    if previous is not None:
        others = [h for h in previous.hosts if h.name not in preps]
        try:
            known = inventory_hosts(previous) if others else {}
        except UserError:
            known = {}  # a host gone from the inventory: its parts cannot be asked for
        nodes += [Node(known[h.name], h.root, h.python) for h in others if h.name in known]
    run = list(dict.fromkeys(r.host for r in ranks))
    moved = bring_together(nodes, run, spec.name, resumable_steps(preps), connector, forks,
                           split=spec.workload.stage_layers())
    for copy in moved.copies:
        on_warning(f"checkpoint part {copy.line()} (copied before the ranks start)")
    return moved.step


def _decide_sharding(spec: JobSpec, hosts: list, connector: Connector) -> JobSpec:
    """``train.shard_optimizer: auto`` decided from these hosts' budgets (a job that fits
    neither way refused, with the numbers): :mod:`.sharding`."""
    if spec.workload.shard_auto() is None:
        return spec
    from mlxops.jobs.sharding import shard_spec
    from mlxops.jobs.stagesplit import host_facts

    found = host_facts(hosts, connector)
    found.raise_on_failure("reading the nodes' memory for train.shard_optimizer: auto")
    return shard_spec(spec, hosts, {name: f for name, (f, _) in found.succeeded_values().items()})


def _align_checkpoints(spec: JobSpec, preps: dict[str, HostPrep], step: int,
                       connector: Connector, forks: int | None) -> None:
    behind = {n: p for n, p in preps.items() if max(p.answer.checkpoints or [0]) > step}
    if not behind:
        return

    def work(host) -> protocol.KeepCheckpointsAnswer:
        prep = preps[host.name]
        paths = NodePaths(prep.root, spec.name)
        return nodecmd.run_node(connector.connect(host), prep.python, paths.code,
                                protocol.keep_checkpoints_args(paths.run_dir, step))

    results = run_parallel([p.host for p in behind.values()], work, forks=forks)
    if results.exit_code:
        results.raise_on_failure("aligning checkpoints")

"""Pre-flight of a job: one pass over its hosts (:mod:`mlxops.jobs.selection` chose them)
that refuses what would fail.

One pass over the hosts, in parallel: reachable; ``mlxops_root`` and the interpreter
resolved to absolute paths; code synced (only what changed travels); then, from every
node's pre-flight answer (:class:`mlxops.node.protocol.PreflightAnswer`): the same mlx and
Python everywhere (and mlx-lm, for a job that runs its code); the ring ports free (ring) or
Open MPI found (mpi); no leftover rank of this job; the checkpoint step a resume starts
from; a job's ``data:`` placed on each node on the way (:mod:`mlxops.jobs.data`), and for
a ``finetune:`` job the base model and its data under the node root
(:mod:`mlxops.jobs.content`: only what differs travels; a copy that still differs from its
manifest is refused). Nothing is started anywhere unless every host passes. The node's
side: docs/node-protocol.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from mlxops.errors import MlxopsError
from mlxops.jobs import collectives
from mlxops.jobs.code import code_bundle, sync_code
from mlxops.jobs.content import PlaceReport, place, place_contents
from mlxops.jobs.data import files_for_node
from mlxops.jobs.placement import NodePaths, Rank
from mlxops.jobs.spec import JobSpec
from mlxops.node import protocol
from mlxops.node.protocol.collectives import ALL_SUM
from mlxops.readiness import HostSaid, Questions, Versions, agreement, mlx_findings, mlx_lm_findings
from mlxops.readiness import findings as host_findings
from mlxops.readiness import questions as host_questions
from mlxops.sync import parse_manifest, python_manifest_args
from mlxops.transport import Connector, Results, nodecmd, run_parallel


class PreflightError(MlxopsError):
    pass


@dataclass
class HostPrep:
    """What pre-flight learned about one host."""

    host: object                    # mlxops.inventory.Host
    root: str
    python: str
    answer: protocol.PreflightAnswer
    asked: Questions = field(default_factory=Questions)  # what it was asked
    data: PlaceReport | None = None   # the job's data: on this node (where, what was sent)
    data_problems: list[str] = field(default_factory=list)
    # A copy of the job's content (a fine-tuning model, its data) that still differs.
    content_problems: list[str] = field(default_factory=list)


def preflight(spec: JobSpec, hosts: list, ranks: list[Rank], connector: Connector,
              forks: int | None) -> tuple[Results, dict[str, HostPrep]]:
    """Ask every host, syncing the code on the way; the preps of those that answered."""
    _, roots, _ = code_bundle(spec)
    manifest_args = python_manifest_args(protocol.CODE_DIR, roots)
    content = spec.data.content() if spec.data else None
    wanted = files_for_node(spec.data.manifest()) if spec.data else []
    contents = spec.workload.contents()

    def work(host) -> HostPrep:
        conn = connector.connect(host)
        host_ranks = [r for r in ranks if r.host == host.name]
        ports = [r.port for r in host_ranks]
        # A port of the workload's own (a server's) is asked where it will listen.
        serve = (spec.workload.binds()
                 if host_ranks and host_ranks[0].rank == 0 else None)
        asked = host_questions(spec.backend, host.ip, ports, serve)
        questions = {"ip": asked.ip, "ports": list(asked.ports), "mpi": asked.mpi}
        # One round trip when the code is current: resolve, manifest and the questions
        # (asked in <root>, so of the run directory relative to it).
        result = conn.run(nodecmd.preflight_command(
            host.root, host.python, manifest_args,
            protocol.preflight_args(protocol.run_path(spec.name), **questions)), timeout=60)
        root, python, manifest, answer = nodecmd.parse_preflight(host.name, result,
                                                                 host.python)
        paths = NodePaths(root, spec.name)
        report = sync_code(conn, paths, spec, python, remote=parse_manifest(manifest, True))
        helpers_changed = any(p.startswith("mlxops/node/")
                              for p in report.added + report.changed + report.deleted)
        if answer is None or helpers_changed:
            # The answer came from missing or older helpers: ask the ones just synced.
            answer = nodecmd.run_node(conn, python, paths.code,
                                      protocol.preflight_args(paths.run_dir, **questions))
        prep = HostPrep(host, root, python, answer, asked)
        if content is not None:
            prep.data, prep.data_problems = place(conn, python, root, content, wanted)
        if contents:
            prep.content_problems = place_contents(conn, python, root, contents)
        return prep

    results = run_parallel(hosts, work, forks=forks)
    return results, results.succeeded_values()


def check_preflight(spec: JobSpec, preps: dict[str, HostPrep], ranks: list[Rank],
                    resume: bool, fresh: bool = False) -> int | None:
    """Refuse what would fail or hang later; returns the checkpoint step to resume from."""
    # The readiness rules mlxops check reports by (mlxops.readiness), without the pin:
    # every rank imports mlx, and mlx and Python agree across the hosts.
    versions = [Versions(name, p.python, p.answer.python_version, p.answer.mlx,
                         p.answer.system, mlx_lm=p.answer.mlx_lm) for name, p in preps.items()]
    problems = [f.line for v in versions for f in mlx_findings(v)]
    problems += [f.line for f in agreement(versions, keys=("mlx", "python")).findings]
    if spec.needs_mlx_lm:
        # Refused, not installed: software is provision's business (docs/job-file.md).
        problems += [f.line for f in mlx_lm_findings(versions)]
    # Nothing in the way, and what the backend needs (mlxops.readiness: check reports
    # the same rules per host).
    said = {name: HostSaid.from_preflight(name, spec.name, p.answer) for name, p in preps.items()}
    problems += [f.line for f in host_findings(
        said, {name: p.asked for name, p in preps.items()}, spec.backend,
        ranks[0].host if ranks else None, spec.path.name)]
    problems += [line for prep in preps.values() for line in prep.data_problems]
    problems += [line for prep in preps.values() for line in prep.content_problems]
    if problems:
        raise PreflightError("pre-flight failed: " + "; ".join(problems))
    steps = [set(p.answer.checkpoints) for p in preps.values()]
    if not resume:
        if any(steps) and not fresh:
            holders = [n for n, p in preps.items() if p.answer.checkpoints]
            raise PreflightError(
                f"job {spec.name!r} already has checkpoints on {', '.join(holders)}: "
                f"'mlxops resume {spec.name}' continues it, 'mlxops launch --fresh' starts "
                "over, or give the job another name")
        return None
    common = resumable_steps(preps)
    return max(common) if common else None


def resumable_steps(preps: dict[str, HostPrep]) -> set[int]:
    """The checkpoint steps every node has (in ``ckpt/`` or a stage's ``ckpt/stage-<s>/``,
    the node's count): those a resume may start from."""
    steps = [set(p.answer.checkpoints) for p in preps.values()]
    return set.intersection(*steps) if steps else set()



def collectives_for(spec: JobSpec, world: int) -> tuple[str, ...]:
    """The collectives the job's ranks will trust with their data, which pre-flight proves
    first (:func:`verify_collectives`); none on one rank.

    Its workload's own (:meth:`~mlxops.jobs.workloads.base.Workload.collectives`: ZeRO-1's
    sharded optimizer ``all_gather``, pipeline stages ``send_recv``), with ``all_sum``
    beside them (the gradients' mean); a job whose workload names none is not checked
    here: its ranks use ``all_sum`` alone, which ``mlxops check`` proves (check_all_sum,
    check_collectives).
    """
    if world < 2:
        return ()
    named = spec.workload.collectives(world)
    return (ALL_SUM, *(op for op in named if op != ALL_SUM)) if named else ()


def verify_collectives(spec: JobSpec, ranks: list[Rank], connector: Connector,
                       start: collectives.Start, ops: tuple[str, ...] | None = None) -> None:
    """Run the collectives check for ``ops`` (the job's, :func:`collectives_for`, by
    default) on the ranks' hosts with the job's backend, ring ports and ``env:``; one line
    naming the backend, the MLX version and what came back wrong if any answer is wrong.
    ``start``: the launcher that starts the check's own job (:func:`mlxops.jobs.launch.
    launch`, which calls this)."""
    hosts = list(dict.fromkeys(r.host for r in ranks))
    ops = collectives_for(spec, len(ranks)) if ops is None else ops
    if not ops or len(ranks) < 2:
        return
    check = collectives.job_spec(spec.inventory, ",".join(hosts), spec.backend,
                                 spec.base_port, ops, spec.env)
    try:
        answers = collectives.run_check(check, connector, start)
    except MlxopsError as exc:
        raise PreflightError(f"pre-flight failed: the collectives check did not run: {exc}")\
            from None
    line = collectives.refusal([a for _, a in answers])
    if line:
        raise PreflightError(f"pre-flight failed: {line}")

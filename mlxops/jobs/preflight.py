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
from mlxops.jobs.code import code_bundle, sync_code
from mlxops.jobs.content import PlaceReport, place, place_contents
from mlxops.jobs.data import files_for_node
from mlxops.jobs.placement import NodePaths, Rank
from mlxops.jobs.spec import JobSpec
from mlxops.node import protocol
from mlxops.readiness import Versions, agreement, mlx_findings, mlx_lm_findings
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
        ports = [r.port for r in host_ranks] if spec.backend == protocol.RING else []
        questions = {"ip": host.ip if ports else "", "ports": ports,
                     "mpi": spec.backend == protocol.MPI}
        # A port of the workload's own (a server's) is asked where it will listen.
        ip, ports = spec.workload.questions(questions["ip"], ports,
                                            bool(host_ranks) and host_ranks[0].rank == 0)
        questions.update(ip=ip, ports=ports)
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
        prep = HostPrep(host, root, python, answer)
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
    for name, prep in preps.items():
        if prep.answer.leftovers:
            pids = ", ".join(str(x.pid) for x in prep.answer.leftovers)
            problems.append(f"{name}: ranks of job {spec.name!r} still run (pids {pids}); "
                            f"run 'mlxops stop {spec.name}'")
        elif own := spec.workload.port_problem(name, prep.answer):
            problems.append(own)
        elif prep.answer.ports_busy:
            ports = ", ".join(map(str, prep.answer.ports_busy))
            problems.append(f"{name}: ring ports in use: {ports} (another job? set 'port:' in "
                            f"{spec.path.name})")
        if spec.backend in protocol.JACCL_BACKENDS and prep.answer.system != "Darwin":
            problems.append(f"{name}: the {spec.backend} backend needs macOS with RDMA over "
                            "Thunderbolt 5; this node runs " + str(prep.answer.system))
    if spec.backend == protocol.MPI and ranks:
        problems += mpi_problems(preps, ranks[0].host)
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
    common = set.intersection(*steps) if steps else set()
    return max(common) if common else None


def mpi_problems(preps: dict[str, HostPrep], launcher: str) -> list[str]:
    """mpirun on the launcher host, and Open MPI at the same place on every other node
    (mpirun's ``--prefix`` tells the remote orted where it is)."""
    mpirun = preps[launcher].answer.mpirun
    if not mpirun:
        return [f"mpirun not found on {launcher}: install Open MPI (brew install open-mpi)"]
    problems = []
    for name, prep in preps.items():
        theirs = prep.answer.mpirun
        if name != launcher and theirs != mpirun:
            problems.append(f"{name}: Open MPI must be installed at the same path on every "
                            f"node: mpirun on {launcher} is {mpirun}, here "
                            f"{theirs or 'not found'}")
    return problems

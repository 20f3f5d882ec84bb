"""Start a job: pre-flight every node, then start every rank detached, then record the job.

Pre-flight (one pass over the hosts, in parallel): reachable; ``mlxops_root`` and the
interpreter resolved to absolute paths; code synced (only what changed travels); the same
mlx and Python everywhere; the ring ports free (ring) or Open MPI found (mpi); no leftover
rank of this job. Nothing is started anywhere unless every host passes. Then, one command
per host writes the run directory (configs, hostfile, one start script per rank) and
spawns that host's ranks in their own sessions, so they outlive the SSH connection and the
controller.

``backend: mpi``: the rank scripts are the same, but mpirun starts them. The job's first
host (the one with rank 0) also gets ``launcher.sh`` (mpirun with one app context per rank,
each running that rank's script on its own host); every other host is written first, then
the first host is written and its launcher spawned detached, like a rank.
"""

from __future__ import annotations

import io
import json
import tarfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import PurePosixPath

from mlxops import render, shell
from mlxops.errors import MlxopsError, UserError
from mlxops.inventory import load_inventory
from mlxops.jobs import nodecmd
from mlxops.jobs.code import code_bundle, sync_code
from mlxops.jobs.placement import (
    NodePaths,
    Rank,
    launcher_script,
    place_ranks,
    rank_environment,
    rank_script,
    ring_hostfile,
)
from mlxops.jobs.record import RUNNING, HostRecord, JobRecord
from mlxops.jobs.spec import JobSpec, check_world
from mlxops.jobs.stop import stop_job
from mlxops.sync import parse_manifest, python_manifest_args
from mlxops.transport import Connector, HostResult, Results, run_parallel
from mlxops.transport.results import OK


class PreflightError(MlxopsError):
    pass


@dataclass
class HostPrep:
    """What pre-flight learned about one host."""

    host: object                    # mlxops.inventory.Host
    root: str = ""
    python: str = ""
    answer: dict = field(default_factory=dict)


def select_hosts(spec: JobSpec, exclude: Sequence[str] = ()) -> list:
    inventory = load_inventory(spec.inventory)
    hosts = inventory.select(spec.hosts, source=f"{spec.path}: hosts")
    unknown = [h for h in exclude if h not in inventory.hosts]
    if unknown:
        raise UserError(f"--exclude: no host named {unknown[0]!r} in {spec.inventory}")
    hosts = [h for h in hosts if h.name not in set(exclude)]
    if not hosts:
        raise UserError(f"--exclude: no host of {spec.path.name} is left to run on")
    check_world(spec, sum(h.slots for h in hosts))  # launch, plan, resume: before connecting
    return hosts


def rdma_devices(spec: JobSpec, hosts: list) -> list | None:
    """MLX_IBV_DEVICES for jaccl (checked like mlx.launch checks it), else None."""
    if spec.backend not in ("jaccl", "jaccl-ring"):
        return None
    return render.rdma_matrix(hosts, spec.backend, source=spec.inventory)


def _preflight(spec: JobSpec, hosts: list, ranks: list[Rank], connector: Connector,
               forks: int | None) -> tuple[Results, dict[str, HostPrep]]:
    preps: dict[str, HostPrep] = {}

    _, roots, _ = code_bundle(spec)
    manifest_args = python_manifest_args("code", roots)

    def work(host) -> HostResult:
        conn = connector.connect(host)
        mine = [r for r in ranks if r.host == host.name]
        ports = [str(r.port) for r in mine] if spec.backend == "ring" else []
        mpi = ["--mpi"] if spec.backend == "mpi" else []
        ask = ["preflight", "--run-dir", f"runs/{spec.name}", "--ip", host.ip if ports else "",
               *mpi, "--ports", *ports]
        # One round trip when the code is current: resolve, manifest and the questions.
        result = conn.run(nodecmd.preflight_command(host.root, host.python, manifest_args,
                                                    ask), timeout=60)
        root, python, manifest, answer = nodecmd.parse_preflight(host.name, result,
                                                                 host.python)
        paths = NodePaths(root, spec.name)
        report = sync_code(conn, paths, spec, python, remote=parse_manifest(manifest, True))
        helpers_changed = any(p.startswith("mlxops/node/")
                              for p in report.added + report.changed + report.deleted)
        if answer is None or helpers_changed:
            # The answer came from missing or older helpers: ask the ones just synced.
            answer = nodecmd.run_node(conn, python, paths.code, [
                "preflight", "--run-dir", paths.run_dir, *ask[3:]])
        preps[host.name] = HostPrep(host, root, python, answer)
        return HostResult(host.name, OK)

    return run_parallel(hosts, work, forks=forks), preps


def check_preflight(spec: JobSpec, preps: dict[str, HostPrep], ranks: list[Rank],
                    resume: bool, fresh: bool = False) -> int | None:
    """Refuse what would fail or hang later; returns the checkpoint step to resume from."""
    problems = []
    versions = {name: (p.answer.get("mlx"), p.answer.get("python_version", "")[:4])
                for name, p in preps.items()}
    for name, (mlx, _) in versions.items():
        if mlx is None:
            problems.append(f"{name}: mlx is not importable by {preps[name].python} "
                            "(run 'mlxops provision')")
    if len({v for v in versions.values()}) > 1:
        listing = ", ".join(f"{n}: mlx {m} python {p}" for n, (m, p) in versions.items())
        problems.append(f"mlx/python versions differ across hosts ({listing})")
    for name, prep in preps.items():
        if prep.answer.get("leftovers"):
            pids = ", ".join(str(x["pid"]) for x in prep.answer["leftovers"])
            problems.append(f"{name}: ranks of job {spec.name!r} still run (pids {pids}); "
                            f"run 'mlxops stop {spec.name}'")
        elif prep.answer.get("ports_busy"):
            ports = ", ".join(map(str, prep.answer["ports_busy"]))
            problems.append(f"{name}: ring ports in use: {ports} (another job? set 'port:' in "
                            f"{spec.path.name})")
        if spec.backend in ("jaccl", "jaccl-ring") and prep.answer.get("system") != "Darwin":
            problems.append(f"{name}: the {spec.backend} backend needs macOS with RDMA over "
                            "Thunderbolt 5; this node runs " + str(prep.answer.get("system")))
    if spec.backend == "mpi" and ranks:
        problems += _mpi_problems(preps, ranks[0].host)
    if problems:
        raise PreflightError("pre-flight failed: " + "; ".join(problems))
    steps = [set(p.answer.get("checkpoints", [])) for p in preps.values()]
    if not resume:
        if any(steps) and not fresh:
            holders = [n for n, p in preps.items() if p.answer.get("checkpoints")]
            raise PreflightError(
                f"job {spec.name!r} already has checkpoints on {', '.join(holders)}: "
                f"'mlxops resume {spec.name}' continues it, 'mlxops launch --fresh' starts "
                "over, or give the job another name")
        return None
    common = set.intersection(*steps) if steps else set()
    return max(common) if common else None


def _mpi_problems(preps: dict[str, HostPrep], launcher: str) -> list[str]:
    """mpirun on the launcher host, and Open MPI at the same place on every other node
    (mpirun's ``--prefix`` tells the remote orted where it is)."""
    mpirun = preps[launcher].answer.get("mpirun")
    if not mpirun:
        return [f"mpirun not found on {launcher}: install Open MPI (brew install open-mpi)"]
    problems = []
    for name, prep in preps.items():
        theirs = prep.answer.get("mpirun")
        if name != launcher and theirs != mpirun:
            problems.append(f"{name}: Open MPI must be installed at the same path on every "
                            f"node: mpirun on {launcher} is {mpirun}, here "
                            f"{theirs or 'not found'}")
    return problems


def mpi_environment(launcher: dict) -> dict[str, str]:
    """What every mpi rank gets from the launcher node's pre-flight answer, as
    ``mlx.launch`` sets it: ``MLX_MPI_LIBNAME`` (and on macOS ``DYLD_LIBRARY_PATH``, the
    ``lib`` beside mpirun's ``bin``) when a libmpi was found."""
    libname = launcher.get("mpi_libname")
    if not libname:
        return {}
    env = {"MLX_MPI_LIBNAME": libname}
    if launcher.get("system") == "Darwin" and launcher.get("mpirun"):
        env["DYLD_LIBRARY_PATH"] = str(PurePosixPath(launcher["mpirun"]).parent.parent / "lib")
    return env


def _run_files(spec: JobSpec, prep: HostPrep, ranks: list[Rank], resume: bool,
               rdma: list | None, preps: dict[str, HostPrep]) -> dict[str, bytes]:
    host = prep.host
    paths = NodePaths(prep.root, spec.name)
    files: dict[str, bytes] = {}
    if spec.trainer is not None:
        config = dict(spec.trainer, out=paths.run_dir)
        files["trainer.json"] = json.dumps(config, indent=1).encode()
        argv = [prep.python, "-m", "mlxops.trainer", "--config", f"{paths.run_dir}/trainer.json"]
        if resume:
            argv.append("--resume")
        cwd = paths.run_dir
    else:
        argv = list(spec.command or [])
        if argv[0] in ("python", "python3"):
            argv[0] = prep.python  # the node's absolute interpreter, as mlx.launch --python
        cwd = paths.workdir() if spec.workdir else paths.run_dir
    if spec.backend == "ring" and len(ranks) > 1:
        files["hostfile.json"] = ring_hostfile(ranks).encode()
    if rdma is not None:
        files["ibv_devices.json"] = json.dumps(rdma).encode()
    mpi = spec.backend == "mpi"
    launcher = preps[ranks[0].host].answer if mpi else {}
    for rank in (r for r in ranks if r.host == host.name):
        env = rank_environment(backend=spec.backend, rank=rank, ranks=ranks, paths=paths,
                               host_env=host.env, job_env=spec.env, resume=resume,
                               mpi_env=mpi_environment(launcher) if mpi else None)
        files[f"rank-{rank.rank}.sh"] = rank_script(env=env, argv=argv, paths=paths, cwd=cwd,
                                                    rank=rank.rank, mpi=mpi).encode()
    if mpi and host.name == ranks[0].host:
        scripts = {r.rank: f"{NodePaths(preps[r.host].root, spec.name).run_dir}/rank-{r.rank}.sh"
                   for r in ranks}
        files["launcher.sh"] = launcher_script(mpirun=launcher["mpirun"], ranks=ranks,
                                               scripts=scripts, paths=paths).encode()
    return files


def _tar(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = 0o600
            info.mtime = int(time.time())
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def start_command_prefix(run_dir: str, fresh: bool = False) -> str:
    """Clear the previous attempt's rank files (not logs, not checkpoints), then unpack.

    ``fresh`` starts over: the whole run directory goes (checkpoints, metrics, logs).
    """
    q = shell.quote(run_dir)
    wipe = f"rm -rf {q} && " if fresh else ""
    return (f"{wipe}mkdir -p {q} && rm -f {q}/rank-*.sh {q}/rank-*.pid {q}/rank-*.exit "
            f"{q}/launcher.sh {q}/launcher.pid {q}/launcher.exit "
            f"{q}/progress/rank-*.json && tar -xf - -C {q}")


def _start(spec: JobSpec, preps: dict[str, HostPrep], ranks: list[Rank], resume: bool,
           rdma: list | None, connector: Connector, forks: int | None,
           fresh: bool = False) -> Results:
    mpi = spec.backend == "mpi"
    launcher = ranks[0].host

    def work(host) -> HostResult:
        prep = preps[host.name]
        paths = NodePaths(prep.root, spec.name)
        archive = _tar(_run_files(spec, prep, ranks, resume, rdma, preps))
        # mpi: mpirun starts the ranks; this only writes the files (and clears `stopped`).
        mine = [] if mpi else [str(r.rank) for r in ranks if r.host == host.name]
        args = ["spawn", "--run-dir", paths.run_dir, "--ranks", *mine]
        if mpi and host.name == launcher:
            args.append("--launcher")
        conn = connector.connect(host)
        answer = nodecmd.run_node(conn, prep.python, paths.code, args,
                                  stdin=archive,
                                  prefix=start_command_prefix(paths.run_dir, fresh))
        return HostResult(host.name, OK, data=answer)

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
           previous: JobRecord | None = None, fresh: bool = False) -> JobRecord:
    """Pre-flight, then start every rank; returns the saved record. Raises on any problem.

    ``fresh`` starts over: an earlier run of the same name is removed from every node, but
    only once pre-flight passed everywhere (never while a rank of it runs).
    """
    if fresh and resume:
        raise UserError("--fresh starts over and resume continues: choose one")
    hosts = select_hosts(spec, exclude)
    rdma = rdma_devices(spec, hosts)  # bad input is refused before any host is touched
    ranks = place_ranks(hosts, spec.base_port)
    results, preps = _preflight(spec, hosts, ranks, connector, forks)
    results.raise_on_failure("pre-flight")
    step = check_preflight(spec, preps, ranks, resume, fresh)
    if resume and step is not None:
        # Every node resumes from the same step: drop newer checkpoints only some nodes have.
        _align_checkpoints(spec, preps, step, connector, forks)
    started = _start(spec, preps, ranks, resume, rdma, connector, forks, fresh)
    record = JobRecord(
        name=spec.name, job_file=str(spec.path), inventory=str(spec.inventory),
        backend=spec.backend,
        hosts=[HostRecord(n, p.root, p.python) for n, p in preps.items()],
        ranks=ranks, state=RUNNING,
        attempt=(previous.attempt + 1) if previous else 1,
        steps=((spec.trainer or {}).get("train") or {}).get("steps") if spec.trainer else None,
        stall_timeout=spec.restart.stall_timeout, max_restarts=spec.restart.max_restarts,
        stop_grace=spec.stop_grace, poll_interval=spec.restart.poll_interval,
        exclude_unreachable=spec.restart.exclude_unreachable,
        excluded=list(exclude),
        restarts=list(previous.restarts) if previous else [],
        stray=[h for h in previous.stray if h.name not in preps] if previous else [],
        created=previous.created if previous else time.time(),
        message=f"resumed from step {step}" if resume and step is not None else "",
    )
    record.save()
    if started.exit_code:
        # Some ranks started, some did not: leave nothing half-running.
        stop_job(record, connector, grace=1.0)
        record.state = "failed"
        record.save()
        started.raise_on_failure("starting ranks")
    return record


def _align_checkpoints(spec: JobSpec, preps: dict[str, HostPrep], step: int,
                       connector: Connector, forks: int | None) -> None:
    behind = {n: p for n, p in preps.items() if max(p.answer.get("checkpoints") or [0]) > step}
    if not behind:
        return

    def work(host) -> HostResult:
        prep = preps[host.name]
        paths = NodePaths(prep.root, spec.name)
        nodecmd.run_node(connector.connect(host), prep.python, paths.code,
                         ["keep-checkpoints", "--run-dir", paths.run_dir, "--step", str(step)])
        return HostResult(host.name, OK)

    results = run_parallel([p.host for p in behind.values()], work, forks=forks)
    if results.exit_code:
        results.raise_on_failure("aligning checkpoints")

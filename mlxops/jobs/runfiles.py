"""What a job's run directory on one node holds before its ranks start, and the command
that clears the previous attempt's files and unpacks the new ones.

What the ranks run is the workload's rank plan (:mod:`mlxops.jobs.workloads`); names are
:mod:`mlxops.node.protocol`'s: ``trainer.json`` (the bundled trainer's config) or
``finetune.json`` (a ``finetune:`` job's, its paths the node's copies of the model and data),
``hostfile.json`` (ring), ``ibv_devices.json`` (jaccl), one ``rank-<r>.sh`` per rank on the
node and, on an mpi job's first host, ``launcher.sh`` (docs/node-protocol.md).
"""

from __future__ import annotations

import json
from pathlib import PurePosixPath

from mlxops import archive, shell
from mlxops.jobs.placement import (
    NodePaths,
    Rank,
    launcher_script,
    rank_environment,
    rank_script,
    ring_hostfile,
)
from mlxops.jobs.preflight import HostPrep
from mlxops.jobs.spec import BLAS_AUTO, JobSpec, rank_weights
from mlxops.jobs.workloads import NodePlacement
from mlxops.node import protocol
from mlxops.node.protocol import rankenv


def mpi_environment(launcher: protocol.PreflightAnswer) -> dict[str, str]:
    """What every mpi rank gets from the launcher node's pre-flight answer, as
    ``mlx.launch`` sets it: ``MLX_MPI_LIBNAME`` (and on macOS ``DYLD_LIBRARY_PATH``, the
    ``lib`` beside mpirun's ``bin``) when a libmpi was found."""
    if not launcher.mpi_libname:
        return {}
    env = {rankenv.MLX_MPI_LIBNAME: launcher.mpi_libname}
    if launcher.system == "Darwin" and launcher.mpirun:
        env["DYLD_LIBRARY_PATH"] = str(PurePosixPath(launcher.mpirun).parent.parent / "lib")
    return env


def run_files(spec: JobSpec, prep: HostPrep, ranks: list[Rank], resume: bool,
              rdma: list | None, preps: dict[str, HostPrep]) -> dict[str, bytes]:
    """The files of ``prep``'s host, by name in its run directory: the workload's rank plan
    (:meth:`mlxops.jobs.workloads.Workload.rank_plan`), the backend's files, and one start
    script per rank with the rank's environment."""
    host = prep.host
    paths = NodePaths(prep.root, spec.name)
    plan = spec.workload.rank_plan(NodePlacement(
        host=host.name, python=prep.python, paths=paths, ranks=ranks,
        balance=rank_weights(spec, [r.host for r in ranks]), resume=resume,
        data_dir=prep.data.node_dir if prep.data is not None else None,
        workdir=spec.workdir is not None))
    files = dict(plan.files)
    if spec.backend == protocol.RING and len(ranks) > 1:
        files[protocol.RING_HOSTFILE] = ring_hostfile(ranks).encode()
    if rdma is not None:
        files[protocol.IBV_DEVICES] = json.dumps(rdma).encode()
    mpi = spec.backend == protocol.MPI
    launcher = preps[ranks[0].host].answer
    openblas = prep.answer.openblas if spec.blas == BLAS_AUTO else None
    for rank in (r for r in ranks if r.host == host.name):
        env = rank_environment(backend=spec.backend, rank=rank, ranks=ranks, paths=paths,
                               host_env=host.env, job_env=spec.env, resume=resume,
                               mpi_env=mpi_environment(launcher) if mpi else None,
                               openblas=openblas, cpus=prep.answer.cpus)
        files[protocol.process_file(rank.rank, protocol.SCRIPT)] = rank_script(
            env=env, argv=plan.argv[rank.rank], paths=paths, cwd=plan.cwd, rank=rank.rank,
            mpi=mpi, prepare=plan.prepare).encode()
    if mpi and host.name == ranks[0].host:
        assert launcher.mpirun, "pre-flight refuses an mpi job without mpirun on its first host"
        scripts = {r.rank: NodePaths(preps[r.host].root, spec.name).process_file(
            r.rank, protocol.SCRIPT) for r in ranks}
        files[protocol.process_file(protocol.LAUNCHER, protocol.SCRIPT)] = launcher_script(
            mpirun=launcher.mpirun, ranks=ranks, scripts=scripts, paths=paths).encode()
    return files


def tar(files: dict[str, bytes]) -> bytes:
    """``files`` as one tar archive, for ``tar -xf -`` in the run directory; mode 600:
    the rank scripts carry the job's environment."""
    return archive.write_bytes(archive.from_bytes(files, 0o600))


def start_command_prefix(run_dir: str, fresh: bool = False) -> str:
    """Clear the previous attempt's rank files (not logs, not checkpoints), then unpack.

    ``fresh`` starts over: the whole run directory goes (checkpoints, metrics, logs).
    """
    q = shell.quote(run_dir)
    wipe = f"rm -rf {q} && " if fresh else ""
    # The globs stay outside the quotes: they are the protocol's names, not user input.
    stale = " ".join(f"{q}/{pattern}" for pattern in protocol.attempt_files())
    return f"{wipe}mkdir -p {q} && rm -f {stale} && tar -xf - -C {q}"

"""Where each rank runs, and exactly what it is started with.

Ranks are numbered in inventory order, ``mlxops_slots`` consecutive ranks per host, and ring
ports are handed out like ``mlx.launch`` does (one per rank, consecutive from the first
port). Each rank gets the environment ``mlx.launch`` would give its backend (read from
``mlx/_distributed_utils/launch.py``): ``MLX_RANK`` and ``MLX_HOSTFILE`` for ring;
``MLX_JACCL_COORDINATOR``, ``MLX_IBV_DEVICES`` (and ``MLX_JACCL_RING``) for jaccl; plus the
managed ``env.sh``, the host's ``mlxops_env``, the job's ``env:`` and mlxops' own
``MLXOPS_*`` variables that the trainer reads; ``TMPDIR`` is the run's own temporary
directory (not the node's shared one: MLX compiles its CPU kernels there). On a Linux
node with an OpenBLAS, it is preloaded (``LD_PRELOAD``) with ``OPENBLAS_NUM_THREADS`` at
the cores per rank and a short idle spin (``OPENBLAS_THREAD_TIMEOUT``), unless the user
set those themselves (docs/job-file.md, "What each rank gets").
"""

from __future__ import annotations

import ipaddress
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass

from mlxops import render, shell
from mlxops.node import blas, protocol
from mlxops.node.protocol import rankenv


@dataclass(frozen=True)
class Rank:
    rank: int
    host: str          # inventory name
    ip: str            # address other ranks reach it at
    port: int
    local_rank: int    # index among the ranks on the same host
    # Its host's management address (ansible_host) when that is an IP address: where
    # jaccl's coordinator listens, apart from the data plane (``ip``). None: a name that
    # only the controller may resolve (an ssh_config alias), so the data address serves.
    management: str | None = None

    def to_dict(self) -> dict:
        return {"rank": self.rank, "host": self.host, "ip": self.ip, "port": self.port,
                "local_rank": self.local_rank, "management": self.management}

    @property
    def coordinator(self) -> str:
        """``ip:port`` of jaccl's coordinator when this is rank 0: management, else data."""
        return f"{self.management or self.ip}:{self.port}"


def _ip_literal(address: str) -> str | None:
    try:
        return str(ipaddress.ip_address(address))
    except ValueError:
        return None


def place_ranks(hosts: Sequence, base_port: int, *, one_per_host: bool = False) -> list[Rank]:
    """The ranks of ``hosts`` in the one rank order (:func:`mlxops.render.rank_hosts`),
    each with its port and its index among its host's ranks. ``one_per_host``: a serve
    job's, one server process per host whatever its ``mlxops_slots``."""
    ranks: list[Rank] = []
    for n, host in enumerate(hosts if one_per_host else render.rank_hosts(hosts)):
        local = sum(r.host == host.name for r in ranks)
        ranks.append(Rank(n, host.name, host.ip, base_port + n, local,
                          management=_ip_literal(host.address)))
    return ranks


def ring_hostfile(ranks: Sequence[Rank]) -> str:
    """MLX_HOSTFILE for ring: a JSON list per rank of ``"ip:port"`` strings."""
    return json.dumps([[f"{r.ip}:{r.port}"] for r in ranks])


@dataclass(frozen=True)
class NodePaths:
    """Absolute paths on one node (the node resolved ``mlxops_root`` at launch)."""

    root: str
    name: str

    @property
    def code(self) -> str:
        return f"{self.root}/{protocol.CODE_DIR}"

    @property
    def run_dir(self) -> str:
        return f"{self.root}/{protocol.run_path(self.name)}"

    def run_file(self, name: str) -> str:
        """A file of the run directory (a ``protocol`` name), as an absolute path."""
        return f"{self.run_dir}/{name}"

    def process_file(self, rank: int | str, kind: str) -> str:
        """``<run_dir>/rank-3.exit``, ``<run_dir>/launcher.exit``, ..."""
        return self.run_file(protocol.process_file(rank, kind))

    @property
    def tmp_dir(self) -> str:
        """The run's own temporary directory: its ranks' ``TMPDIR``."""
        return self.run_file(protocol.TMP_DIR)

    @property
    def env_file(self) -> str:
        return f"{self.root}/{protocol.ENV_FILE}"

    def workdir(self) -> str:
        return f"{self.code}/{protocol.job_code_path(self.name)}"


def blas_environment(*, rank: Rank, ranks: Sequence[Rank], openblas: str | None,
                     cpus: int | None) -> dict[str, str]:
    """The optimised BLAS of a rank on a Linux node: ``openblas`` (the node's pre-flight
    answer; None on macOS, without one, or with ``blas: off``) preloaded before whatever the
    rank's session preloads, and its threads at the node's ``cpus`` shared by the job's
    ranks there (at least 1), so that ranks on one host do not fight over its cores, and
    idle threads that sleep instead of spinning while the rank waits for its peers
    (:func:`mlxops.node.blas.thread_env`)."""
    if not openblas:
        return {}
    here = sum(1 for r in ranks if r.host == rank.host)
    return {"LD_PRELOAD": shell.Prepend(openblas), **blas.thread_env(cpus, here)}


def rank_environment(*, backend: str, rank: Rank, ranks: Sequence[Rank], paths: NodePaths,
                     host_env: dict[str, str], job_env: dict[str, str],
                     resume: bool, mpi_env: dict[str, str] | None = None,
                     openblas: str | None = None, cpus: int | None = None) -> dict[str, str]:
    """Environment of one rank, later entries winning (mlxops' own variables last).

    ``mpi_env``: for the mpi backend, what the launcher node found about Open MPI
    (``MLX_MPI_LIBNAME``, and ``DYLD_LIBRARY_PATH`` on macOS), as ``mlx.launch`` sets it.
    MPI numbers the ranks itself, so an mpi rank gets no ``MLX_RANK``.
    ``openblas``, ``cpus``: :func:`blas_environment`, first, so that an ``LD_PRELOAD`` or
    ``OPENBLAS_NUM_THREADS`` in the host's ``mlxops_env`` or the job's ``env:`` wins.
    ``TMPDIR`` is the run's own temporary directory (:mod:`mlxops.node.tempdir`: MLX
    compiles its CPU kernels there), also first: a user's ``TMPDIR`` wins.
    """
    env: dict[str, str] = {"TMPDIR": paths.tmp_dir}
    env.update(blas_environment(rank=rank, ranks=ranks, openblas=openblas, cpus=cpus))
    env.update(host_env)
    env.update(job_env)
    world = len(ranks)
    if backend == protocol.MPI:
        for name in (rankenv.MLX_RANK, rankenv.MLX_HOSTFILE):
            env.pop(name, None)
        env.update(mpi_env or {})
    else:
        env[rankenv.MLX_RANK] = str(rank.rank)
    env.update(rankenv.RankEnv(world_size=world, local_rank=rank.local_rank, backend=backend,
                               run_dir=paths.run_dir, resume=resume, host=rank.host).to_env())
    if world > 1:
        if backend == protocol.RING:
            env[rankenv.MLX_HOSTFILE] = paths.run_file(protocol.RING_HOSTFILE)
        elif backend in protocol.JACCL_BACKENDS:
            env[rankenv.MLX_JACCL_COORDINATOR] = ranks[0].coordinator
            env[rankenv.MLX_IBV_DEVICES] = paths.run_file(protocol.IBV_DEVICES)
            if backend == protocol.JACCL_RING:
                env[rankenv.MLX_JACCL_RING] = "1"
    return env


def rank_script(*, env: dict[str, str], argv: Sequence[str], paths: NodePaths, cwd: str,
                rank: int, mpi: bool = False, prepare: Sequence[str] = ()) -> str:
    """The script a rank runs, detached: managed env, then its own, then the program.

    It does not ``exec`` the program: it stays to record the exit code, which is how the
    watchdog tells a rank that finished or failed from one that vanished. Under ``mpi``,
    mpirun (or its orted), not ``mlxops.node spawn``, starts it: so it records its own pid
    and sends its output to its own log first. ``prepare``: command lines (built with
    :mod:`mlxops.shell`) that must succeed before the program starts (a serve job's
    export); the first that fails gives the rank its exit code.
    """
    exit_file = paths.process_file(rank, protocol.EXIT)
    pid_file = paths.process_file(rank, protocol.PID)
    log_file = paths.process_file(rank, protocol.LOG)
    started_by = "mpirun (launcher.sh)" if mpi else "mlxops.node spawn"
    lines = [
        f"# rank {rank} of job {paths.name}: written by mlxops, started by {started_by}",
    ]
    if mpi:
        lines += [
            # The log is 0600 (like this script) before anything is written to it.
            f": >> {shell.quote(log_file)} && chmod 600 {shell.quote(log_file)} || exit 1",
            f"exec >> {shell.quote(log_file)} 2>&1 < /dev/null",
            f'printf "%s\\n" "$$" > {shell.quote(pid_file + ".tmp")} && '
            f"mv {shell.quote(pid_file + '.tmp')} {shell.quote(pid_file)}",
        ]
    lines += [
        # Where this attempt begins in the log (appended across attempts): the node reads
        # a failed rank's reason after it (mlxops.node.failure).
        f'printf "%s (pid %s)\\n" {shell.quote(protocol.START_LINE)} "$$"',
        f"if [ -f {shell.quote(paths.env_file)} ]; then . {shell.quote(paths.env_file)}; fi",
        shell.export_lines(env).rstrip("\n"),
        f"export PYTHONPATH={shell.quote(paths.code)}${{PYTHONPATH:+:$PYTHONPATH}}",
        f"cd {shell.quote(cwd)} || exit 1",
        " && ".join([*prepare, shell.join(argv)]),
        "code=$?",
        f'printf "%s\\n" "$code" > {shell.quote(exit_file + ".tmp")} && '
        f"mv {shell.quote(exit_file + '.tmp')} {shell.quote(exit_file)}",
        'exit "$code"',
    ]
    return "\n".join(line for line in lines if line) + "\n"


def mpirun_argv(*, mpirun: str, ranks: Sequence[Rank], scripts: dict[int, str]) -> list[str]:
    """The mpirun command of an mpi job: one app context per rank, in rank order.

    ``-np 1 -host <ip> /bin/sh <rank-r.sh on that host>`` joined by ``:`` (MPMD), so MPI
    rank r runs ``rank-r.sh`` on its own host with that host's paths. On the command line,
    not in an ``--app`` file: Open MPI splits appfile lines at spaces and keeps quotes, so
    a path with a space could not be said there. ``--prefix`` gives the remote orted the
    same Open MPI (PATH, library path) as this node's: Open MPI must be installed at the
    same path on every node.
    """
    prefix = os.path.dirname(os.path.dirname(mpirun))
    argv = [mpirun, "--prefix", prefix, "--oversubscribe", "--bind-to", "none"]
    for i, rank in enumerate(ranks):
        if i:
            argv.append(":")
        argv += ["-np", "1", "-host", rank.ip, "/bin/sh", scripts[rank.rank]]
    return argv


def launcher_script(*, mpirun: str, ranks: Sequence[Rank], scripts: dict[int, str],
                    paths: NodePaths) -> str:
    """``launcher.sh`` of an mpi job, on its first host: env.sh (``OMPI_MCA_*``), mpirun.

    Like a rank script it stays to record mpirun's exit code (``launcher.exit``).
    ``--allow-run-as-root`` only when it runs as root (Open MPI refuses root otherwise).
    """
    exit_file = paths.process_file(protocol.LAUNCHER, protocol.EXIT)
    argv = mpirun_argv(mpirun=mpirun, ranks=ranks, scripts=scripts)
    lines = [
        f"# mpirun of job {paths.name}: written by mlxops, started by mlxops.node spawn",
        f"if [ -f {shell.quote(paths.env_file)} ]; then . {shell.quote(paths.env_file)}; fi",
        f"cd {shell.quote(paths.run_dir)} || exit 1",
        "set --",
        'if [ "$(id -u)" = 0 ]; then set -- --allow-run-as-root; fi',
        # The command line first, so `mlxops logs` shows what was run.
        f"printf '%s\\n' {shell.quote('mlxops: starting ' + shell.join(argv))}",
        # "$@" goes right after the program: mpirun's options come before the first app.
        f'{shell.quote(argv[0])} "$@" {shell.join(argv[1:])}',
        "code=$?",
        f'printf "%s\\n" "$code" > {shell.quote(exit_file + ".tmp")} && '
        f"mv {shell.quote(exit_file + '.tmp')} {shell.quote(exit_file)}",
        'exit "$code"',
    ]
    return "\n".join(lines) + "\n"

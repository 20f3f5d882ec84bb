"""Readiness rules for a job's hosts: nothing in the way of its ranks, and what its backend
needs. One answer to "would launch refuse this host?", asked by two users:

- a job's **pre-flight** (:mod:`mlxops.jobs.preflight`), which refuses on any finding,
  from each node's ``preflight`` answer, before anything starts;
- ``mlxops check`` (:mod:`mlxops.checks.check_resources`, ``check_cluster``), which
  reports each finding on its host, from each node's ``ready`` answer and its facts.

Both ask a node the same questions (:func:`questions`), turn what it said into
:class:`HostSaid`, and apply the same pure rules, so ``mlxops check --job`` reports
every one of these that launch would refuse on, per host:

- **leftovers** (:func:`leftover_findings`): no rank (or mpirun) of a job still runs on
  the host. Pre-flight's answer names the job's own; ``ready``'s names every job's, so
  check reports the job's own and any other's.
- **ports** (:func:`port_findings`): none of the ports asked is in use. A host is asked
  its ring ports (ring backend: one per rank it holds, :func:`mlxops.jobs.placement.
  place_ranks`) on its ``mlxops_ip``; rank 0's host of a serve job also its
  ``serve.port``, and then every port is asked on ``serve.bind`` (one address a question).
- **backend** (:func:`backend_findings`): jaccl and jaccl-ring run only on macOS (RDMA
  over Thunderbolt 5): a host whose ``uname -s`` is not ``Darwin`` is a finding.
- **mpi** (:func:`mpi_findings`): mpirun is found on rank 0's host (the launcher's), and
  at the same path on every other host (mpirun's ``--prefix`` tells the others' orted
  where Open MPI is): a host whose mpirun differs from the launcher's is a finding; none on
  the launcher is that host's finding alone.

A finding is :class:`mlxops.readiness.Finding`: who, what was found, against what, the fix.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from mlxops.node import protocol
from mlxops.node.protocol.vocab import JACCL_BACKENDS, MPI, RING
from mlxops.readiness import Finding

MPI_FIX = "install Open MPI: brew install open-mpi"
MPI_SAME_FIX = "install Open MPI at the same path on every node"
MPIRUN_SEARCHED = "PATH, /opt/homebrew/bin, /usr/local/bin, /opt/local/bin"


@dataclass(frozen=True)
class Questions:
    """What a host is asked (the node's ``--ip``, ``--ports`` and ``--mpi``)."""

    ip: str = ""
    ports: tuple[int, ...] = ()
    mpi: bool = False
    serve_port: int | None = None    # among ``ports``: the server's, on rank 0's host


def questions(backend: str, ip: str, ring_ports: Sequence[int],
              serve: tuple[str, int] | None = None) -> Questions:
    """The questions for a host holding the ring ports ``ring_ports`` (ring backend only)
    at ``ip``; ``serve``: ``(bind, port)`` when it is rank 0's host of a serve job."""
    ports = tuple(ring_ports) if backend == RING else ()
    mpi = backend == MPI
    if serve is not None:
        bind, port = serve
        return Questions(bind, (port, *ports), mpi, port)
    return Questions(ip if ports else "", ports, mpi)


@dataclass(frozen=True)
class Running:
    job: str
    rank: int | str                  # a rank, or protocol.LAUNCHER (mpirun)
    pid: int


@dataclass(frozen=True)
class HostSaid:
    """What one host said, from either answer (None: not known)."""

    host: str
    system: str | None
    ports_busy: tuple[int, ...] = ()
    running: tuple[Running, ...] = ()
    mpirun: str | None = None

    @classmethod
    def from_preflight(cls, host: str, job: str, answer: protocol.PreflightAnswer
                       ) -> HostSaid:
        """Pre-flight's answer: its leftovers are ``job``'s."""
        return cls(host, answer.system, tuple(answer.ports_busy),
                   tuple(Running(job, x.rank, x.pid) for x in answer.leftovers),
                   answer.mpirun)

    @classmethod
    def from_ready(cls, host: str, system: str | None, answer: protocol.ReadyAnswer
                   ) -> HostSaid:
        """``mlxops check``'s: the ``ready`` answer, the system from the host's facts."""
        return cls(host, system, tuple(answer.ports_busy),
                   tuple(Running(r.job, r.rank, r.pid) for r in answer.running),
                   answer.mpirun)


def leftover_findings(said: HostSaid) -> list[Finding]:
    """One finding for every job with a rank (or mpirun) still running on the host."""
    jobs: dict[str, list[str]] = {}
    for r in said.running:
        what = "mpirun" if r.rank == protocol.LAUNCHER else f"rank {r.rank}"
        jobs.setdefault(r.job, []).append(f"{what} (pid {r.pid})")
    return [Finding(said.host, "leftovers", f"job {job}: {', '.join(ps)} still running", "",
                    f"mlxops stop {job}") for job, ps in jobs.items()]


def port_findings(said: HostSaid, asked: Questions, job_file: str | None = None
                  ) -> list[Finding]:
    """The server's port, then the ring ports, in use (the node answers of those asked)."""
    busy = list(said.ports_busy)
    findings = []
    if asked.serve_port in busy:
        busy.remove(asked.serve_port)
        where = f"set another serve.port in {job_file}" if job_file else "set serve.port"
        findings.append(Finding(said.host, "serve_port", f"serve.port {asked.serve_port} on "
                                f"{asked.ip} in use (another server?)", "",
                                f"stop what holds it, or {where}"))
    if busy:
        plural = "s" if len(busy) > 1 else ""
        fix = "stop what holds them (another job? mlxops status)"
        if job_file:
            fix += f", or set another port: in {job_file}"
        findings.append(Finding(said.host, "ring_ports", f"ring port{plural} "
                                f"{', '.join(map(str, busy))} on {asked.ip} in use", "", fix))
    return findings


def backend_findings(said: HostSaid, backend: str) -> list[Finding]:
    """The jaccl backends on a host that is not a Mac."""
    if backend in JACCL_BACKENDS and said.system != "Darwin":
        return [Finding(said.host, "backend", f"runs {said.system or 'an unknown system'}",
                        f"the {backend} backend needs macOS with RDMA over Thunderbolt 5",
                        "choose Macs with Thunderbolt 5 for this job, or backend: ring")]
    return []


def mpi_findings(said: Mapping[str, HostSaid], launcher: str) -> list[Finding]:
    """mpirun on ``launcher`` (rank 0's host), and at the same path on every other host;
    of the hosts that answered (a launcher that did not: nothing to compare with)."""
    first = said.get(launcher)
    if first is None:
        return []
    if not first.mpirun:
        return [Finding(launcher, "mpirun", f"mpirun not found ({MPIRUN_SEARCHED})", "",
                        MPI_FIX)]
    return [Finding(name, "mpirun", f"mpirun {s.mpirun or 'not found'}",
                    f"on {launcher} (rank 0) {first.mpirun}", MPI_SAME_FIX)
            for name, s in said.items() if name != launcher and s.mpirun != first.mpirun]


def findings(said: Mapping[str, HostSaid], asked: Mapping[str, Questions], backend: str,
             launcher: str | None, job_file: str | None = None) -> list[Finding]:
    """Every finding of every host, in host order: what pre-flight refuses on."""
    out = []
    for name, s in said.items():
        out += leftover_findings(s)
        out += port_findings(s, asked.get(name, Questions()), job_file)
        out += backend_findings(s, backend)
    if backend == MPI and launcher is not None:
        out += mpi_findings(said, launcher)
    return out

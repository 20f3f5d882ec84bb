"""Readiness rules: one answer to "is this host's software what a job needs?" and one to
"would launch refuse this host?" (the host rules, below).

Three places ask the first: a job's pre-flight (which raises on the findings, before anything
starts), ``mlxops check`` (which reports them per host) and provision's ``skew`` task. They
read the answer from different sources (the pre-flight answer, the facts), so each turns
what it read into :class:`Versions` and asks the same pure rules:

- **mlx** (:func:`mlx_findings`): the interpreter jobs run imports mlx, and, when a pin is
  given (``mlxops_mlx_version``, else the controller's mlx), that very version. Pre-flight
  gives no pin: it refuses what cannot run (no mlx, hosts that disagree), and leaves a
  controller whose mlx differs from the nodes' to ``mlxops check``.
- **agreement** (:func:`agreement`): mlx, Python's ``major.minor`` (the version's dotted
  parts, never a prefix of its text: ``3.9`` is not ``3.9.``) and, on Macs, the macOS
  build are the same on every host. The expected value of each is the one most hosts
  have; a tie goes to the pin for mlx, else to the first host's. A host whose value
  differs is named with its value and the others'. Pre-flight compares mlx and Python
  only: its answer does not carry the macOS build.
- **mlx-lm** (:func:`mlx_lm_findings`), only on the hosts that need it (their inventory
  sets ``mlxops_mlx_lm``, or a job that runs mlx-lm's code, ``finetune:``, is checked):
  each has mlx-lm, the pin when one is given (``mlxops_mlx_lm: <version>``, else the
  controller's mlx-lm), and they agree with each other (the most common version; a tie
  goes to the pin, else the first host's). Pre-flight gives no pin, as for mlx.

A finding says who (``host``), what was found, against what, and the fix.

Host rules: nothing in the way of a job's ranks, and what its backend needs (the second
half of this module). Pre-flight refuses on them, from each node's ``preflight`` answer;
``mlxops check`` (``check_resources``, ``check_cluster``) reports each on its host, from
each node's ``ready`` answer and its facts. Both ask a node the same questions
(:func:`questions`), turn what it said into :class:`HostSaid` and apply the same rules,
so ``mlxops check --job`` reports every one of these that launch would refuse on:

- **leftovers** (:func:`leftover_findings`): no rank (or mpirun) of a job still runs on
  the host. Pre-flight's answer names the job's own; ``ready``'s names every job's, so
  check reports the job's own and any other's.
- **ports** (:func:`port_findings`): none of the ports asked is in use. A host is asked
  its ring ports (ring backend: one per rank it holds) on its ``mlxops_ip``; rank 0's host
  of a serve job also its ``serve.port``, and then every port on ``serve.bind`` (one
  address a question).
- **backend** (:func:`backend_findings`): jaccl and jaccl-ring run only on macOS (RDMA
  over Thunderbolt 5): a host whose ``uname -s`` is not ``Darwin`` is a finding.
- **mpi** (:func:`mpi_findings`): mpirun is found on rank 0's host (the launcher's), and
  at the same path on every other host (mpirun's ``--prefix`` tells the others' orted
  where Open MPI is): a host whose mpirun differs from the launcher's is a finding; none
  on the launcher is that host's finding alone.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from mlxops.hostfacts import HostFacts
from mlxops.node import protocol
from mlxops.node.protocol.vocab import JACCL_BACKENDS, MPI, RING

PROVISION = "run mlxops provision"
MLX_LM_FIX = ("set mlxops_mlx_lm (true, or a version) for these hosts, then run mlxops "
              "provision --tags mlx_lm")
AGREE_FIX = ("make them agree (mlxops_mlx_version, the Python of mlxops_python, macOS "
             "updates), then run mlxops provision")
#: What must agree across hosts, and how a finding names it.
AGREED = {"mlx": "mlx", "python": "python", "macos_build": "macOS build"}
NOT_A_MAC = "-"   # the macOS build of a host that is not a Mac (not "another build")


def installed_version(distribution: str) -> str | None:
    """The version of ``distribution`` installed beside mlxops (its metadata: no import of
    it), None when it is not. importlib.metadata is imported here, by the first pin read:
    it costs a command's start-up more than the rest of this module (email, zipfile)."""
    from importlib import metadata

    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def controller_mlx_version() -> str | None:
    """The default pin: the mlx the controller runs (metadata only: no import)."""
    return installed_version("mlx")


def pinned_version(host: Any) -> str | None:
    """The mlx a host must run: its ``mlxops_mlx_version``, else the controller's."""
    return host.var("mlxops_mlx_version") or controller_mlx_version()


def pin_source(host: Any) -> str:
    """Where :func:`pinned_version` took the pin from, as a finding names it."""
    return "mlxops_mlx_version" if host.is_set("mlxops_mlx_version") else "controller"


def controller_mlx_lm_version() -> str | None:
    """mlx-lm's default pin: the version the controller has installed (metadata only)."""
    return installed_version("mlx-lm")


def mlx_lm_pin(host: Any) -> str | None:
    """The mlx-lm a host must run: ``mlxops_mlx_lm: <version>``, else (``true``, or a job
    that needs it) the controller's; None when neither says."""
    asked = host.var("mlxops_mlx_lm")
    return asked if isinstance(asked, str) else controller_mlx_lm_version()


def mlx_lm_pin_source(host: Any) -> str:
    """Where :func:`mlx_lm_pin` took the pin from, as a finding names it."""
    return ("mlxops_mlx_lm" if isinstance(host.var("mlxops_mlx_lm"), str)
            else "controller")


def python_series(version: str | None) -> str | None:
    """``3.11.7`` -> ``3.11``: the part of a Python version that must agree."""
    parts = (version or "").split(".")
    return ".".join(parts[:2]) if parts[0] else None


@dataclass(frozen=True)
class Versions:
    """What one host runs, as its facts or its pre-flight answer say (None: not known)."""

    host: str
    interpreter: str | None        # the path of the Python jobs run
    python: str | None             # its X.Y.Z
    mlx: str | None                # the mlx it imports; None: not importable
    system: str | None             # uname -s
    macos_build: str | None = None
    mlx_lm: str | None = None      # the mlx-lm it has installed; None: none

    @classmethod
    def from_facts(cls, host: str, facts: HostFacts) -> Versions:
        """The interpreter jobs run (the venv provision made, else ``mlxops_python``)."""
        python = facts.interpreter()
        return cls(host, python.path, python.version, python.mlx, facts.system,
                   facts.macos_build, python.mlx_lm)

    def agreed(self) -> dict[str, str | None]:
        """The values that must agree across hosts, keyed as :data:`AGREED`."""
        return {"mlx": self.mlx, "python": python_series(self.python),
                "macos_build": (self.macos_build if self.system == "Darwin"
                                else NOT_A_MAC)}


@dataclass(frozen=True)
class Finding:
    host: str
    subject: str                   # "mlx", "python", "macos_build"
    found: str                     # "mlx 0.31.0"
    against: str                   # "controller 0.32.4", "others 0.32.4"; "": nothing
    fix: str

    @property
    def line(self) -> str:
        return f"{self.host}: {self.said}: {self.fix}"

    @property
    def said(self) -> str:
        """What was found, and against what when there is something to compare with."""
        return f"{self.found}, {self.against}" if self.against else self.found


def mlx_findings(node: Versions, pin: str | None = None, source: str = "controller"
                 ) -> list[Finding]:
    """The interpreter imports mlx, and the pin when one is given (``source``: where the
    pin came from, :func:`pin_source`)."""
    wanted = f"{source} {pin}" if pin else "every rank imports it"
    if node.mlx is None:
        return [Finding(node.host, "mlx", f"mlx not importable by {node.interpreter}",
                        wanted, PROVISION)]
    if pin and node.mlx != pin:
        return [Finding(node.host, "mlx", f"mlx {node.mlx}", wanted, PROVISION)]
    return []


def mlx_lm_findings(nodes: Sequence[Versions], pin: str | None = None,
                    source: str = "controller") -> list[Finding]:
    """mlx-lm on every one of ``nodes`` (the hosts that need it), the pin when one is
    given, and the same version everywhere (see the module)."""
    wanted = f"{source} {pin}" if pin else "needed here"
    findings = []
    for node in nodes:
        if node.mlx_lm is None:
            findings.append(Finding(node.host, "mlx_lm", f"mlx-lm not installed for "
                                    f"{node.interpreter}", wanted, MLX_LM_FIX))
        elif pin and node.mlx_lm != pin:
            findings.append(Finding(node.host, "mlx_lm", f"mlx-lm {node.mlx_lm}", wanted,
                                    MLX_LM_FIX))
    installed = [n for n in nodes if n.mlx_lm is not None]
    counts = Counter(n.mlx_lm for n in installed)
    top = max(counts.values(), default=0)
    leaders = [value for value, c in counts.items() if c == top]
    expected = pin if pin in leaders else (leaders[0] if leaders else None)
    for node in installed:
        if node.mlx_lm != expected:
            findings.append(Finding(node.host, "mlx_lm", f"mlx-lm {node.mlx_lm}",
                                    f"others {expected}", MLX_LM_FIX))
    return findings


@dataclass(frozen=True)
class Agreement:
    expected: dict[str, str | None]          # per key of AGREED: what most hosts have
    odd: dict[str, list[str]]                # host -> the keys it differs on
    values: dict[str, dict[str, str | None]]  # host -> its values
    findings: list[Finding]                  # one per odd host and key


def agreement(nodes: Sequence[Versions], pin: str | None = None,
              keys: Sequence[str] = tuple(AGREED)) -> Agreement:
    """Whether the ``keys`` of :data:`AGREED` agree across ``nodes`` (see the module)."""
    values = {n.host: n.agreed() for n in nodes}
    expected: dict[str, str | None] = {}
    for key in keys:
        counts = Counter(v[key] for v in values.values())
        top = max(counts.values(), default=0)
        leaders = [value for value, c in counts.items() if c == top]
        if key == "mlx" and pin in leaders:
            expected[key] = pin
        else:
            expected[key] = leaders[0] if leaders else None   # first host's, on a tie
    odd: dict[str, list[str]] = {}
    findings = []
    for host, mine in values.items():
        for key in keys:
            if mine[key] != expected[key]:
                odd.setdefault(host, []).append(key)
                findings.append(Finding(host, key, f"{AGREED[key]} {mine[key]}",
                                        f"others {expected[key]}", AGREE_FIX))
    return Agreement(expected, odd, values, findings)


def findings_of(findings: Sequence[Finding], host: str) -> list[Finding]:
    return [f for f in findings if f.host == host]


def joined(findings: Sequence[Finding], sep: str = ", ") -> tuple[str, str]:
    """One host's findings as one ``(found, fix)``: what ``mlxops check`` reports."""
    found = sep.join(f.said for f in findings)
    fixes = list(dict.fromkeys(f.fix for f in findings))
    return found, "; ".join(fixes)


# --- host rules: nothing in the way, what the backend needs --------------------------------

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


#: A macOS build: the major (digits), the train letter, the build number, maybe a letter.
_BUILD = re.compile(r"(\d+)([A-Z])(\d+)([a-z]?)")


def beta_build(build: str | None) -> bool:
    """A macOS build that is a beta (a developer or public seed), by Apple's numbering:
    ``25A5316i`` (seeds number from 5000, often with a letter) is; ``24F74``, ``25F80``,
    ``26A428`` (releases) and ``22E772610a`` (a Rapid Security Response: a long number,
    its letter the response's) are not. Betas have run MLX several times slower
    (exo-explore/exo#2166)."""
    match = _BUILD.fullmatch(build or "")
    if not match:
        return False
    number, letter = match.group(3), match.group(4)
    return len(number) == 4 and (number.startswith("5") or bool(letter))

"""Readiness rules: one answer to "is this host's software what a job needs?".

Three places ask: a job's pre-flight (which raises on the findings, before anything
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
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from mlxops.hostfacts import HostFacts

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
    against: str                   # "controller 0.32.4", "others 0.32.4"
    fix: str

    @property
    def line(self) -> str:
        return f"{self.host}: {self.found}, {self.against}: {self.fix}"


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


def joined(findings: Sequence[Finding]) -> tuple[str, str]:
    """One host's findings as one ``(found, fix)``: what ``mlxops check`` reports."""
    found = ", ".join(f"{f.found}, {f.against}" for f in findings)
    fixes = list(dict.fromkeys(f.fix for f in findings))
    return found, "; ".join(fixes)


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

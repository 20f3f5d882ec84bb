"""The ``blas`` task: an OpenBLAS on every Linux node, for its ranks to preload.

MLX's Linux CPU wheel carries netlib's reference BLAS; launch preloads the node's OpenBLAS
into every rank instead (docs/job-file.md, "What each rank gets"), which makes a matmul
tens of times faster. This task reports a Linux node without one and installs Debian's
``libopenblas0-pthread`` (the ``package`` argument) with ``apt-get`` where it can: as root,
or with ``ansible_become`` (``sudo -n``: a password prompt would hang a parallel run). Where
it cannot (no ``apt-get``, no become, the install fails) the node is reported with a
warning, not as failed: its ranks still run, at the slow figure. macOS is skipped: MLX uses
Accelerate and Metal there.

The node is asked where its OpenBLAS is by :func:`mlxops.node.blas.find_openblas` itself
(its source, run by the node's interpreter), so provision and a job's pre-flight look in
the same places and accept the same files. :func:`steps_for` is pure: probe in, steps out.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlxops import shell
from mlxops.node import blas as node_blas
from mlxops.tasks.base import Outcome, PythonRead, TaskContext, task
from mlxops.transport.results import SKIPPED

PACKAGE = "libopenblas0-pthread"
PACKAGE_NAME = re.compile(r"^[a-z0-9][a-z0-9+.-]+$")   # Debian policy's package names
INSTALL_TIMEOUT = 900.0
SLOW = "its ranks run with MLX's reference BLAS, tens of times slower"

# Printed by the node's interpreter after the module's own source: where its OpenBLAS is,
# whether apt-get is there, and whether it runs as root (no sudo needed then).
_REPORT = """
import json as _json, os as _os, shutil as _shutil
print(_json.dumps({"openblas": find_openblas(), "uid": _os.getuid(),
                   "apt": _shutil.which("apt-get", path=_os.environ.get("PATH", "") +
                                        ":/usr/bin:/bin:/usr/sbin:/sbin") is not None}))
"""


def probe_command(python: str) -> str:
    """One command: the node's interpreter runs :mod:`mlxops.node.blas` and says what it
    found (the helpers need not be synced yet: the module travels on the command line)."""
    return shell.join([python, "-c", probe_source()])


def probe_source() -> str:
    """:mod:`mlxops.node.blas` and the report of what it found, as one program."""
    return Path(node_blas.__file__).read_text() + _REPORT


def parse_probe(stdout: str) -> dict[str, Any]:
    """The probe's JSON line; ValueError when there is none."""
    for line in reversed(stdout.strip().splitlines()):
        try:
            doc = json.loads(line)
        except ValueError:
            continue
        if isinstance(doc, dict) and "openblas" in doc:
            return doc
    raise ValueError(f"no answer in {stdout[-200:]!r}")


@dataclass
class Steps:
    install: str | None = None     # the command line that installs the package, or
    warning: str = ""              # why it cannot be installed here


def install_command(package: str, *, root: bool) -> str:
    """``apt-get install`` of ``package``; when the package lists do not know it yet (a
    fresh machine), ``apt-get update`` once and install again. ``sudo -n`` unless root."""

    def apt(*words: str) -> str:
        argv = ["env", "DEBIAN_FRONTEND=noninteractive", "apt-get", *words]
        return shell.join(argv if root else shell.privileged(argv))

    install = apt("install", "-y", "-q", package)
    return f"{install} || {{ {apt('update', '-q')} && {install}; }}"


def steps_for(probe: Mapping[str, Any], package: str, become: bool) -> Steps:
    """What to do on a Linux node without an OpenBLAS (``probe``: the node's answer)."""
    if not probe.get("apt"):
        return Steps(warning=f"no OpenBLAS and no apt-get: {SLOW}; install OpenBLAS with "
                            "the system's package manager")
    root = probe.get("uid") == 0
    if not (root or become):
        return Steps(warning=f"no OpenBLAS: {SLOW}; set ansible_become to let provision "
                            f"install {package}, or run 'apt-get install {package}' as root")
    return Steps(install=install_command(package, root=root))


def check_args(args: Mapping[str, Any]) -> None:
    package = args.get("package", PACKAGE)
    if not isinstance(package, str) or not PACKAGE_NAME.match(package):
        raise ValueError(f"package: must be a Debian package name, got {package!r}")


PROBE = "probe"  # the key of the node's answer among the task's reads


def blas_reads(host: Any, args: Mapping[str, Any]) -> dict[str, PythonRead]:
    """The probe, in ``mlxops_python`` (on a Mac it answers no OpenBLAS; unused there)."""
    return {PROBE: PythonRead(probe_source())}


def _probe(ctx: TaskContext, fresh: bool = False) -> dict[str, Any]:
    """The node's answer: the one read with the facts unless ``fresh`` (after an install)."""
    answer = None if fresh else ctx.prefetched(PROBE)
    if answer is not None:
        try:
            return parse_probe(answer)
        except ValueError:
            pass  # ask again below, and report what that says
    python = (ctx.facts.python.path if ctx.facts else None) or "python3"
    result = ctx.conn.run(probe_command(python), timeout=60)
    if not result.ok:
        raise RuntimeError(f"looking for OpenBLAS failed: {result.error_line()}")
    try:
        return parse_probe(result.stdout)
    except ValueError as exc:
        raise RuntimeError(f"looking for OpenBLAS failed: {exc}") from None


@task("blas", args=["package"], read=blas_reads)
def blas_task(ctx: TaskContext, args: Mapping[str, Any]) -> Outcome:
    system = ctx.facts.system if ctx.facts else None
    if system != "Linux":
        return Outcome.skipped(f"not Linux ({system}): MLX uses Accelerate")
    package = args.get("package", PACKAGE)
    try:
        probe = _probe(ctx)
    except RuntimeError as exc:
        return Outcome.failed(str(exc))
    if probe.get("openblas"):
        return Outcome.ok(probe["openblas"], openblas=probe["openblas"])
    steps = steps_for(probe, package, bool(ctx.host.become))
    if steps.install is None:
        return Outcome(status=SKIPPED, message=f"no OpenBLAS, cannot install {package}",
                       data={"warnings": [steps.warning]})
    if ctx.check:
        return Outcome.changed(f"would install {package} (no OpenBLAS)")
    result = ctx.conn.run(steps.install, timeout=INSTALL_TIMEOUT)
    if not result.ok:
        return Outcome(status=SKIPPED, message=f"installing {package} failed",
                       data={"warnings": [f"installing {package} failed "
                                          f"({result.error_line()}): {SLOW}"]})
    try:
        found = _probe(ctx, fresh=True).get("openblas")
    except RuntimeError as exc:
        return Outcome.failed(f"installed {package}, then {exc}")
    if not found:
        return Outcome(status=SKIPPED, message=f"installed {package}, no OpenBLAS found",
                       data={"warnings": [f"{package} is installed but no loadable "
                                          f"OpenBLAS was found: {SLOW}"]})
    return Outcome.changed(f"installed {package}: {found}", openblas=found)


blas_task.check_args = check_args  # type: ignore[attr-defined]

"""Each host answers over SSH with a verified host key, has an interpreter, and the
interpreter imports the pinned mlx."""

from __future__ import annotations

import pytest

from mlxops.checks import untrusted_ok, when
from mlxops.checks.state import UNTRUSTED
from mlxops.readiness import Versions, joined, mlx_findings, pin_source, pinned_version


@untrusted_ok
@when(lambda cluster, node: node.host.connection != "local")
def check_ssh(node):
    """Reachable over SSH, with a host key known_hosts holds (not new, not changed)."""
    if node.status == UNTRUSTED:
        raise node.fail(node.reason)


def check_interpreter(node):
    """The interpreter jobs run (``<root>/venv``, else ``mlxops_python``) is there and runs."""
    python = node.interpreter
    if not python.path:
        raise node.fail(f"mlxops_python {node.host.python!r} not found",
                        "install Python 3 there, or set mlxops_python to its path")
    if not python.version:
        raise node.fail(f"{python.path} does not run",
                        "repair it, or set mlxops_python to another interpreter")


def check_mlx(node):
    """That interpreter imports the mlx mlxops pins (``mlxops_mlx_version``, else the
    controller's)."""
    python = node.interpreter
    if not python.version:
        pytest.skip("no interpreter (see check_interpreter)")
    pin = pinned_version(node.host)
    if pin is None:
        raise node.fail("no mlx version to compare with (the controller has no mlx)",
                        "set mlxops_mlx_version")
    findings = mlx_findings(Versions.from_facts(node.name, node.facts), pin,
                            pin_source(node.host))
    if findings:
        raise node.fail(*joined(findings))

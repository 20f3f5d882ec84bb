"""The ``blas`` provisioning task: a Linux node's OpenBLAS reported, installed where it may.

The probe runs for real here (this machine's interpreter, through ``sh``); a node's answers
and apt-get's are played by a stand-in connection, and the install command line by a real
``sh`` against a stand-in ``apt-get``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace

import pytest

from mlxops.hostfacts import HostFacts, Interpreter
from mlxops.inventory.model import Host
from mlxops.node.blas import find_openblas
from mlxops.tasks import blas
from mlxops.tasks.base import TaskContext
from mlxops.transport.results import CommandResult

LIB = "/usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblas.so.0"


def test_the_probe_is_the_node_helpers_own_search_run_by_the_nodes_interpreter():
    proc = subprocess.run(["sh", "-c", blas.probe_command(sys.executable)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    probe = blas.parse_probe(proc.stdout)
    assert probe["openblas"] == find_openblas()
    assert probe["uid"] == os.getuid() and isinstance(probe["apt"], bool)
    with pytest.raises(ValueError):
        blas.parse_probe("Traceback ...\n")


@pytest.mark.parametrize("probe, become, install, warning", [
    ({"apt": False, "uid": 0}, True, None, "no apt-get"),
    ({"apt": True, "uid": 501}, False, None, "set ansible_become"),
    ({"apt": True, "uid": 501}, True, "sudo -n env DEBIAN_FRONTEND=noninteractive apt-get "
                                      "install -y -q libopenblas0-pthread", ""),
    ({"apt": True, "uid": 0}, False, "env DEBIAN_FRONTEND=noninteractive apt-get install", ""),
])
def test_steps(probe, become, install, warning):
    steps = blas.steps_for(probe, blas.PACKAGE, become)
    if install is None:
        assert steps.install is None and warning in steps.warning
    else:
        assert steps.install.startswith(install) and not steps.warning
        assert ("sudo" in steps.install) == (probe["uid"] != 0)


def test_install_updates_the_package_lists_once_when_they_do_not_know_the_package(tmp_path):
    apt = tmp_path / "apt-get"
    calls = tmp_path / "calls"
    # Knows the package only after an update, as on a machine whose lists are empty.
    apt.write_text(f'#!/bin/sh\necho "$DEBIAN_FRONTEND $*" >> {calls}\n'
                   f'case "$1" in update) touch {tmp_path}/updated ;; install) '
                   f'[ -e {tmp_path}/updated ] || {{ echo "E: Unable to locate package" >&2; '
                   "exit 100; } ;; esac\n")
    apt.chmod(0o755)
    env = {"PATH": f"{tmp_path}:/usr/bin:/bin"}
    command = blas.install_command("libopenblas0-pthread", root=True)
    assert subprocess.run(["sh", "-c", command], env=env).returncode == 0
    assert calls.read_text().splitlines() == [
        "noninteractive install -y -q libopenblas0-pthread", "noninteractive update -q",
        "noninteractive install -y -q libopenblas0-pthread"]
    calls.unlink()
    assert subprocess.run(["sh", "-c", command], env=env).returncode == 0
    assert len(calls.read_text().splitlines()) == 1   # known now: no update


class Node:
    """A stand-in node: answers the probe from its state, and apt-get as told."""

    def __init__(self, *, openblas=None, apt=True, uid=1000, install_ok=True,
                 installs=LIB) -> None:
        self.openblas, self.apt, self.uid = openblas, apt, uid
        self.install_ok, self.installs = install_ok, installs
        self.sent: list[str] = []

    def run(self, command: str, *, timeout=None, stdin=None) -> CommandResult:
        self.sent.append(command)
        if not self.is_probe(command):
            if not self.install_ok:
                return CommandResult(command, 1, "", "sudo: a password is required\n", 0.1)
            self.openblas = self.installs
            return CommandResult(command, 0, "Setting up libopenblas0-pthread\n", "", 0.1)
        answer = {"openblas": self.openblas, "apt": self.apt, "uid": self.uid}
        return CommandResult(command, 0, json.dumps(answer) + "\n", "", 0.1)

    @staticmethod
    def is_probe(command: str) -> bool:
        return "find_openblas()" in command

    @property
    def installed(self) -> bool:
        return not all(self.is_probe(c) for c in self.sent)


def run_task(node: Node, *, become=False, check=False, system="Linux", **args):
    host = Host("n1", {"ansible_host": "10.0.0.1", "ansible_become": become})
    ctx = TaskContext(host=host, conn=node, inventory=None, hosts=[host], check=check,
                      facts=replace(HostFacts.unknown(), system=system,
                                    python=Interpreter("/usr/bin/python3", None, None)))
    return blas.blas_task(ctx, args)


def test_a_node_with_openblas_is_ok_and_says_where():
    node = Node(openblas=LIB)
    outcome = run_task(node, become=True)
    assert (outcome.status, outcome.message, outcome.data["openblas"]) == ("ok", LIB, LIB)
    assert len(node.sent) == 1 and not node.installed
    assert node.sent[0].startswith("/usr/bin/python3 -c ")


def test_macos_is_skipped_without_a_round_trip():
    node = Node()
    assert run_task(node, system="Darwin").status == "skipped" and not node.sent


def test_without_become_it_is_reported_with_a_warning_not_a_failure():
    node = Node()
    outcome = run_task(node)
    assert outcome.status == "skipped" and not node.installed
    assert "ansible_become" in outcome.data["warnings"][0]


def test_check_reports_the_install_and_installs_nothing():
    node = Node()
    outcome = run_task(node, become=True, check=True)
    assert (outcome.status, outcome.message) == (
        "changed", "would install libopenblas0-pthread (no OpenBLAS)")
    assert not node.installed


def test_it_installs_with_become_and_reports_the_library():
    node = Node()
    outcome = run_task(node, become=True, package="libopenblas0-openmp")
    assert outcome.status == "changed" and outcome.data["openblas"] == LIB
    assert outcome.message == f"installed libopenblas0-openmp: {LIB}"
    install = next(c for c in node.sent if not node.is_probe(c))
    assert install.startswith("sudo -n env DEBIAN_FRONTEND=noninteractive apt-get install -y")
    assert install.count("libopenblas0-openmp") == 2
    # Again: nothing to do.
    assert run_task(node, become=True).status == "ok"


@pytest.mark.parametrize("node, message", [
    (Node(install_ok=False), "sudo: a password is required"),
    (Node(installs=None), "no loadable OpenBLAS"),
])
def test_an_install_that_does_not_help_is_a_warning(node, message):
    outcome = run_task(node, become=True)
    assert outcome.status == "skipped" and message in outcome.data["warnings"][0]


@pytest.mark.parametrize("package", ["-o APT::x=1", "", "Lib;reboot", 3])
def test_bad_package_names_are_refused(package):
    with pytest.raises(ValueError, match="^package: "):
        blas.check_args({"package": package})

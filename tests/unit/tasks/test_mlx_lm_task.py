"""The ``mlx_lm`` provisioning task: mlx-lm, pinned, only where the inventory asks.

A node is played by a stand-in connection that answers pip's command with the probe's
lines, as the facts task's interpreter probe prints them; the probe itself runs for real
against this machine's interpreter (which has mlx-lm: the controller's pin).
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from dataclasses import replace
from importlib import metadata

import pytest

from mlxops.hostfacts import HostFacts, Interpreter
from mlxops.inventory.model import Host
from mlxops.tasks import mlx_lm
from mlxops.tasks.base import TaskContext
from mlxops.tasks.facts import PROBE, parse_probe
from mlxops.transport.results import CommandResult

MLX = metadata.version("mlx")
MLX_LM = metadata.version("mlx-lm")
VENV = "/home/u/.mlxops/venv/bin/python"


class Node:
    """Answers the install command as a node whose pip installs ``installs``."""

    def __init__(self, *, installs: str | None = MLX_LM, pip_ok: bool = True) -> None:
        self.installs, self.pip_ok = installs, pip_ok
        self.sent: list[tuple[str, bytes | None]] = []

    def run(self, command: str, *, timeout=None, stdin=None) -> CommandResult:
        self.sent.append((command, stdin))
        if "tar -xzf" in command:
            return CommandResult(command, 0, "", "", 0.1)
        if not self.pip_ok:
            return CommandResult(command, 1, "", "ERROR: No matching distribution found "
                                 f"for mlx-lm=={MLX_LM}\n", 0.1)
        probe = {"version": "3.11.7", "mlx": MLX, "working_set": None, "mlx_lm": self.installs}
        return CommandResult(command, 0, f"{VENV}\n{json.dumps(probe)}\n", "", 0.1)


def run_task(node: Node, asked, *, check=False, python=None, venv=None, wheelhouse=None):
    variables = {"ansible_host": "10.0.0.1"}
    if asked is not None:
        variables["mlxops_mlx_lm"] = asked
    if wheelhouse is not None:
        variables["mlxops_wheelhouse"] = str(wheelhouse)
    host = Host("n1", variables)
    facts = replace(HostFacts.unknown(), system="Linux", root="/home/u/.mlxops",
                    python=python or Interpreter("/usr/bin/python3", "3.11.7", MLX),
                    venv=venv)
    ctx = TaskContext(host=host, conn=node, inventory=None, hosts=[host], check=check,
                      facts=facts)
    return mlx_lm.mlx_lm_task(ctx, {}), ctx.facts


def test_the_probe_reports_the_mlx_lm_this_interpreter_has():
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True,
                         timeout=120, check=True).stdout
    assert parse_probe(f"{sys.executable}\n{out}").mlx_lm == MLX_LM


@pytest.mark.parametrize("asked", [None, False])
def test_a_host_that_does_not_ask_is_skipped_without_a_round_trip(asked):
    node = Node()
    outcome, _ = run_task(node, asked)
    assert (outcome.status, outcome.message) == ("skipped", mlx_lm.NOT_ASKED)
    assert not node.sent


def test_the_pin_already_there_is_ok_without_a_round_trip():
    node = Node()
    venv = Interpreter(VENV, "3.11.7", MLX, mlx_lm=MLX_LM)
    outcome, _ = run_task(node, True, venv=venv)
    assert (outcome.status, outcome.message) == ("ok", f"mlx-lm {MLX_LM} in {VENV}")
    assert not node.sent


def test_true_installs_the_controllers_version_into_the_venv_beside_the_pinned_mlx():
    node = Node()
    outcome, facts = run_task(node, True)
    assert outcome.status == "changed", outcome.message
    assert outcome.message == f"installed mlx-lm missing -> {MLX_LM} in /home/u/.mlxops/venv"
    (command, _), = node.sent
    words = shlex.split(command.replace("{", "").replace("}", "").replace(";", " "))
    assert f"mlx-lm=={MLX_LM}" in words and f"mlx[cpu]=={MLX}" in words
    assert "--no-index" not in words
    assert facts.interpreter().path == VENV and facts.interpreter().mlx_lm == MLX_LM


def test_a_version_in_the_inventory_is_the_pin_and_a_wheelhouse_is_pushed_first(tmp_path):
    (tmp_path / "mlx_lm-0.30.0-py3-none-any.whl").write_bytes(b"w")
    node = Node(installs="0.30.0")
    outcome, _ = run_task(node, "0.30.0", wheelhouse=tmp_path)
    assert outcome.status == "changed", outcome.message
    (push, archive), (install, _) = node.sent
    assert "tar -xzf - -C /home/u/.mlxops/wheelhouse" in push and archive
    assert "--no-index --find-links /home/u/.mlxops/wheelhouse" in install
    assert "mlx-lm==0.30.0" in install


def test_check_reports_and_installs_nothing():
    node = Node()
    old = Interpreter("/usr/bin/python3", "3.11.7", MLX, mlx_lm="0.30.0")
    outcome, _ = run_task(node, True, check=True, python=old)
    assert (outcome.status, outcome.message) == (
        "changed", f"would install mlx-lm 0.30.0 -> {MLX_LM} in /home/u/.mlxops/venv")
    assert not node.sent


def test_pip_failing_or_installing_another_version_fails_the_host():
    outcome, _ = run_task(Node(pip_ok=False), True)
    assert outcome.status == "failed"
    assert outcome.message.startswith(f"installing mlx-lm=={MLX_LM} (with mlx[cpu]=={MLX}) "
                                      "failed: ")
    assert "No matching distribution" in outcome.message
    outcome, _ = run_task(Node(installs="0.1.0"), True)
    assert outcome.status == "failed" and "mlx-lm 0.1.0" in outcome.message


def test_without_the_pinned_mlx_it_leaves_the_node_to_the_python_task():
    node = Node()
    outcome, _ = run_task(node, True, python=Interpreter("/usr/bin/python3", "3.11.7", None))
    assert outcome.status == "failed" and "run the python task first" in outcome.message
    assert not node.sent


def test_the_variable_takes_true_false_or_a_quoted_version():
    assert Host("n", {"mlxops_mlx_lm": "0.32.2"}).var("mlxops_mlx_lm") == "0.32.2"
    assert Host("n", {}).var("mlxops_mlx_lm") is False
    for wrong in (0.3, "latest", 1):
        with pytest.raises(ValueError, match="true, false or a version"):
            Host("n", {"mlxops_mlx_lm": wrong}).var("mlxops_mlx_lm")

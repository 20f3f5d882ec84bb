"""The ``mlx_lm`` task: mlx-lm, pinned, on the nodes that ask for it (fine-tuning needs it).

Only a host whose inventory sets ``mlxops_mlx_lm`` gets it: ``true`` pins the controller's
mlx-lm, a version string pins that one (:func:`mlxops.readiness.mlx_lm_pin`). Like the
``python`` task it reads what the facts already probed (the mlx-lm installed for the
interpreter jobs run), so a node that has the pin costs no round trip. Otherwise mlx-lm is
pip-installed into ``<root>/venv``, with the node's pinned mlx named beside it so that pip
never moves mlx (the venv is made first when the node ran ``mlxops_python`` until now: a
Python mlxops did not make is not ours to install into), from the pushed wheelhouse when
``mlxops_wheelhouse`` is set. A job that needs mlx-lm on a host without it is refused by
pre-flight with this task's command (docs/job-file.md): installing software stays
provision's business, as in Ansible.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from mlxops.node.protocol.layout import VENV_DIR
from mlxops.readiness import mlx_lm_pin, pinned_version
from mlxops.tasks.base import Outcome, TaskContext, task
from mlxops.tasks.facts import parse_probe
from mlxops.tasks.python import PIP_TIMEOUT, install_command, push_wheelhouse, requirement

NOT_ASKED = "not asked for (mlxops_mlx_lm)"


def mlx_lm_requirement(pin: str) -> str:
    return f"mlx-lm=={pin}"


@task("mlx_lm")
def mlx_lm_task(ctx: TaskContext, args: Mapping[str, Any]) -> Outcome:
    facts = ctx.facts
    if not facts:
        return Outcome.failed("no facts: run the 'facts' task first")
    if ctx.host.var("mlxops_mlx_lm") is False:
        return Outcome.skipped(NOT_ASKED)
    pin = mlx_lm_pin(ctx.host)
    if not pin:
        return Outcome.failed("no mlx-lm version to pin: set mlxops_mlx_lm to a version "
                              "(the controller has no mlx-lm to copy it from)")
    mlx_pin = pinned_version(ctx.host)
    python = facts.interpreter()
    if python.mlx_lm == pin:
        return Outcome.ok(f"mlx-lm {pin} in {python.path}")
    if not mlx_pin or python.mlx != mlx_pin:
        return Outcome.failed(f"mlx-lm goes with the pinned mlx {mlx_pin}, which "
                              f"{python.path} does not have: run the python task first")
    what = f"mlx-lm {python.mlx_lm or 'missing'} -> {pin} in {facts.root}/{VENV_DIR}"
    if ctx.check:
        return Outcome.changed(f"would install {what}")
    node_wheelhouse, problem = push_wheelhouse(ctx)
    if problem:
        return Outcome.failed(problem)
    result = ctx.conn.run(install_command(facts, mlx_pin, [mlx_lm_requirement(pin)],
                                          node_wheelhouse), timeout=PIP_TIMEOUT)
    if not result.ok:
        return Outcome.failed(f"installing {mlx_lm_requirement(pin)} (with "
                              f"{requirement(facts.system, mlx_pin)}) failed: "
                              f"{result.error_line()}")
    info = parse_probe("\n".join(result.stdout.strip().splitlines()[-2:]))
    if not info or info.mlx_lm != pin or info.mlx != mlx_pin:
        return Outcome.failed(f"the venv reports mlx-lm {info and info.mlx_lm} and mlx "
                              f"{info and info.mlx}, not {pin} and {mlx_pin}")
    facts.python = info
    facts.venv = replace(info)
    return Outcome.changed(f"installed {what}")

"""init's one command per host (mlxops/init/probe.py) against a fake connection that
answers with the facts command's output recorded on a sandbox node
(tests/unit/data/facts/linux_x86_64.txt), its interpreter section set per case: the facts
run in the first candidate interpreter, whose own ``import mlx.core`` answers when it
can (no other Python, no second command); the addresses come from the facts' own ``ip``
section."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from mlxops.init.links import Address
from mlxops.init.probe import CANDIDATES, probe
from mlxops.transport.results import CommandResult

RECORDED = (Path(__file__).resolve().parents[1] / "data" / "facts" / "linux_x86_64.txt"
            ).read_text()


def facts_output(python: str, find: str = "") -> str:
    """The recorded output, its ``python`` section replaced, and init's reads' answers."""
    text = re.sub(r"@@mlxops:python\n(.*\n)*?(?=@@mlxops:venv)", f"@@mlxops:python\n{python}",
                  RECORDED)
    return (text + f"@@mlxops:read:init.python\n{find}\n@@mlxops:exit:init.python\n0\n"
            "@@mlxops:read:init.sudo\n\n@@mlxops:exit:init.sudo\n1\n")


@dataclass
class Node:
    """Answers the first command with ``first``, any later one with ``later``."""

    first: str
    later: str = ""
    commands: list[str] = field(default_factory=list)

    def run(self, command: str, *, timeout=None, stdin=None) -> CommandResult:
        self.commands.append(command)
        out = self.first if len(self.commands) == 1 else self.later
        return CommandResult(command, 0, out, "", 0.0)


@dataclass(frozen=True)
class Host:
    python: str = "python3"
    root: str = "~/.mlxops"
    own_python: bool = False  # mlxops_python set in the inventory

    def is_set(self, name: str) -> bool:
        return name == "mlxops_python" and self.own_python


VENV = "/opt/venv/bin/python"


def test_the_facts_interpreter_with_mlx_is_the_answer_in_one_command():
    node = Node(facts_output(f'{VENV}\n{{"version": "3.11.2", "mlx": "0.32.4"}}\n'))
    found = probe(node, Host(), [VENV])
    assert (found.python, found.mlx) == (VENV, "0.32.4")
    assert len(node.commands) == 1 and node.commands[0].startswith(f"py={VENV};")
    assert found.links.addresses == [Address("eth0", "10.241.7.11", 24)]  # the facts' ip


def test_without_mlx_there_the_read_in_the_same_python_finds_another():
    node = Node(facts_output('/usr/bin/python3\n{"version": "3.9.6", "mlx": null}\n',
                             find="/opt/homebrew/bin/python3\n0.30.0"))
    found = probe(node, Host())
    assert (found.python, found.mlx) == ("/opt/homebrew/bin/python3", "0.30.0")
    assert len(node.commands) == 1 and node.commands[0].startswith("py=python3;")


def test_a_first_candidate_not_there_leaves_the_others_to_a_second_command():
    node = Node(facts_output(""), later="/usr/bin/python3\n0.29.0\n")
    found = probe(node, Host(python="/opt/mine/python", own_python=True), [VENV])
    assert (found.python, found.mlx) == ("/usr/bin/python3", "0.29.0")
    assert node.commands[0].startswith("py=/opt/mine/python;")  # the inventory's, first
    assert len(node.commands) == 2
    assert VENV in node.commands[1] and "/opt/mine/python" not in node.commands[1]
    assert all(c in node.commands[1] for c in CANDIDATES)

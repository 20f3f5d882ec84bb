"""Commands the controller sends to a node for a job, and the parsing of their answers.

Every command line is built here from lists of words (quoted by :mod:`mlxops.shell`); the
node side is :mod:`mlxops.node`, which answers with one JSON document.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from mlxops import shell
from mlxops.errors import MlxopsError
from mlxops.transport import CommandResult, Connection


class NodeCommandError(MlxopsError):
    pass


def resolve_command(root: str, python: str) -> str:
    """Create ``mlxops_root``, print its absolute path, then the absolute interpreter.

    A venv made by ``mlxops provision`` (``<root>/venv``) wins over ``mlxops_python``.
    """
    return (
        f"mkdir -p {shell.path_word(root)} && cd {shell.path_word(root)} && pwd && "
        "if [ -x venv/bin/python ]; then printf '%s\\n' \"$PWD/venv/bin/python\"; "
        f"else command -v {shell.quote(python)}; fi"
    )


def parse_resolve(host: str, result: CommandResult, python: str) -> tuple[str, str]:
    lines = [line for line in result.stdout.splitlines() if line.strip()]
    if not result.ok and len(lines) < 1:
        raise NodeCommandError(f"{host}: cannot create mlxops_root: {result.stderr.strip()}")
    if len(lines) < 2 or not lines[1].startswith("/"):
        raise NodeCommandError(f"{host}: interpreter {python!r} (mlxops_python) not found")
    return lines[0], lines[1]


def node_command(python: str, code_dir: str, args: Sequence[object]) -> str:
    """``PYTHONPATH=<code> <python> -m mlxops.node ARGS``."""
    return shell.with_env([python, "-m", "mlxops.node", *args], {"PYTHONPATH": code_dir})


def run_node(conn: Connection, python: str, code_dir: str, args: Sequence[object], *,
             stdin: bytes | None = None, timeout: float = 120.0,
             prefix: str = "") -> dict[str, Any]:
    """Run a node command and return its JSON answer (``prefix`` runs before it, e.g. tar)."""
    command = node_command(python, code_dir, args)
    if prefix:
        command = f"{prefix} && {command}"
    result = conn.run(command, timeout=timeout, stdin=stdin)
    if not result.ok:
        detail = (result.stderr.strip() or result.stdout.strip()).splitlines()
        raise NodeCommandError(f"{conn.name}: {args[0]} failed (exit {result.exit_code}): "
                               f"{detail[-1] if detail else 'no output'}")
    try:
        return json.loads(result.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise NodeCommandError(f"{conn.name}: {args[0]}: unreadable answer "
                               f"{result.stdout[-200:]!r}") from None

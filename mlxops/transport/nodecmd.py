"""Running the node's commands for a job over a connection, and reading their answers.

The argument lists and the typed answers are :mod:`mlxops.node.protocol`'s (the node side
is :mod:`mlxops.node`; the contract for people is docs/node-protocol.md). Every command line
is made here from those lists of words, quoted by :mod:`mlxops.shell`.
"""

from __future__ import annotations

from collections.abc import Sequence

from mlxops import shell
from mlxops.errors import MlxopsError
from mlxops.node import protocol
from mlxops.transport import CommandResult, Connection


class NodeCommandError(MlxopsError):
    pass


SECTION = "@@mlxops-section@@"
#: The node helpers write no bytecode beside the synced code: they are short-lived, and a
#: node's ``code/`` then stays exactly what was synced (``mlxops check`` reads it as such).
#: (Not ``PYTHONPYCACHEPREFIX``: under a prefix the interpreter looks for the standard
#: library's bytecode there too, finds none and compiles argparse, json, dataclasses...
#: at every start: a status took 246 ms of CPU instead of 96 in the sandbox's venv.)
HELPER_ENV = {"PYTHONDONTWRITEBYTECODE": "1"}


def preflight_command(root: str, python: str, manifest_args: str,
                      preflight_args: Sequence[object]) -> str:
    """Pre-flight in one round trip: resolve root and interpreter, list the synced code,
    and ask the node helpers (as synced last time, if at all) the pre-flight questions.

    Runs in ``<root>``, so ``code`` and ``runs/<name>`` are relative. Prints the root, the
    interpreter, then two sections: the code manifest (JSON) and the pre-flight answer (empty
    when the node has no helpers yet; the caller asks again after syncing them).
    """
    # A venv made by `mlxops provision` (<root>/venv) wins over mlxops_python.
    resolve = (
        f"mkdir -p {shell.path_word(root)} && cd {shell.path_word(root)} && pwd && "
        f"{{ if [ -x {protocol.VENV_PYTHON} ]; then P=\"$PWD/{protocol.VENV_PYTHON}\"; "
        f"else P=$(command -v {shell.quote(python)}); fi; "
        '[ -n "$P" ] || exit 127; } && printf \'%s\\n\' "$P"'
    )
    ask = shell.join(["-m", "mlxops.node", *preflight_args])
    return (f"{resolve} && echo {SECTION} && \"$P\" {manifest_args} && echo && echo {SECTION}"
            f" && {{ PYTHONPATH={protocol.CODE_DIR} {shell.env_assignments(HELPER_ENV)}"
            f" \"$P\" {ask} 2>/dev/null || true; }}")


def parse_preflight(host: str, result: CommandResult, python: str
                    ) -> tuple[str, str, str, protocol.PreflightAnswer | None]:
    """``(root, interpreter, manifest JSON, pre-flight answer or None)``."""
    if result.exit_code == 127:
        raise NodeCommandError(f"{host}: interpreter {python!r} (mlxops_python) not found")
    parts = result.stdout.split(SECTION + "\n")
    head = [line for line in parts[0].splitlines() if line.strip()]
    if not result.ok or len(parts) != 3 or len(head) < 2:
        raise NodeCommandError(f"{host}: pre-flight failed: {result.error_line()}")
    answer = None
    if parts[2].strip():
        try:
            answer = protocol.parse_answer(protocol.PREFLIGHT, parts[2].strip().splitlines()[-1])
        except protocol.ProtocolError:
            answer = None  # helpers too old to answer: asked again after the sync
    return head[0], head[1], parts[1].strip(), answer


def node_command(python: str, code_dir: str, args: Sequence[object]) -> str:
    """``PYTHONPATH=<code> PYTHONDONTWRITEBYTECODE=1 <python> -m mlxops.node ARGS``."""
    return shell.with_env([python, "-m", "mlxops.node", *args],
                          {"PYTHONPATH": code_dir, **HELPER_ENV})


def run_node(conn: Connection, python: str, code_dir: str, args: Sequence[str], *,
             stdin: bytes | None = None, timeout: float = 120.0,
             prefix: str = "") -> protocol.Answer:
    """Run a node command (``args`` from a ``protocol.*_args`` function) and return its
    typed answer (``prefix`` runs before it, e.g. tar)."""
    command = node_command(python, code_dir, args)
    if prefix:
        command = f"{prefix} && {command}"
    result = conn.run(command, timeout=timeout, stdin=stdin)
    if not result.ok:
        raise NodeCommandError(f"{conn.name}: {args[0]} failed: {result.error_line()}")
    lines = result.stdout.strip().splitlines()
    try:
        return protocol.parse_answer(args[0], lines[-1] if lines else "")
    except protocol.ProtocolError as exc:
        raise NodeCommandError(f"{conn.name}: {args[0]}: unreadable answer "
                               f"{result.stdout[-200:]!r} ({exc})") from None

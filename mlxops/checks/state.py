"""One host's state, read once for every check: what the checks assert on.

:func:`inspect` asks a host everything the shipped checks need, in a handful of commands
on one kept connection, and changes nothing there: the ``facts`` task's script (system,
interpreter and mlx, memory, macOS settings), ``env.sh`` and the hostfiles as the ``env``
and ``hostfiles`` tasks read them, the manifest of ``<root>/code`` compared with the
controller's bundle by the ``sync`` code in check mode, the node's ``ready`` answer
(docs/node-protocol.md) and, for a ``finetune:`` job, the node's listing of its copies of
the base model and the data (sizes only, nothing hashed). What a part could not read is
kept as its reason (a string), so that only the checks that need it fail.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from mlxops import shell
from mlxops.checks.outcome import NotReady
from mlxops.checks.target import Target
from mlxops.hostfacts import HostFacts, Interpreter
from mlxops.inventory import Host
from mlxops.jobs.content import ask
from mlxops.node import protocol
from mlxops.node.protocol.content import ContentAnswer
from mlxops.sync import SyncError, SyncReport, remote_manifest, sync_files
from mlxops.tasks.env import env_path
from mlxops.tasks.facts import ask_facts
from mlxops.tasks.files import read_file
from mlxops.tasks.hostfiles import hostfile_path
from mlxops.tasks.sync import code_path
from mlxops.transport import ChangedHostKey, Connector, UnknownHostKey
from mlxops.transport.nodecmd import NodeCommandError, run_node
from mlxops.transport.results import FAILED, OK

#: The host answered, but with a host key mlxops does not trust (unknown or changed).
UNTRUSTED = "untrusted"
READY_TIMEOUT = 60.0

FileRead = tuple[bytes | None, int | None]   # (content, mode); (None, None): absent


@dataclass
class NodeState:
    """What one host looked like. ``status``: ok, or why it could not be asked (unreachable,
    untrusted, failed) with ``reason``. A part that could not be read holds its reason."""

    host: Host
    status: str = OK
    reason: str = ""
    facts: HostFacts = field(default_factory=HostFacts.unknown)
    files: dict[str, FileRead | str] = field(default_factory=dict)   # by node path
    code: SyncReport | str | None = None
    ready: protocol.ReadyAnswer | str | None = None
    clock: tuple[float, float] | None = None    # (node clock - controller's, uncertainty) s
    reach: protocol.ReachAnswer | str | None = None
    # A finetune: job's placed directories: the node's listing, by the controller's path.
    placed: dict[str, ContentAnswer | str] = field(default_factory=dict)
    # The job's supervisor host: why it cannot reach the webhook ("": it can; None: not asked).
    webhook: str | None = None
    # A host not read: the facts the last provision cached for it, if any.
    cached: HostFacts | None = None

    @property
    def name(self) -> str:
        return self.host.name

    @property
    def system(self) -> str | None:
        """``Darwin``, ``Linux``; as last seen when the host was not read; None: unknown."""
        return self.facts.system or (self.cached.system if self.cached else None)

    @property
    def interpreter(self) -> Interpreter:
        """The interpreter jobs run: ``<root>/venv`` when there is one (as pre-flight
        resolves it), else ``mlxops_python``."""
        return self.facts.interpreter()

    def fail(self, found: str, fix: str = "") -> NotReady:
        """The finding of a check on this host: ``raise node.fail(found, fix)``."""
        return NotReady(self.name, found, fix)

    def need(self, part: Any, what: str, fix: str = "run mlxops provision") -> Any:
        """``part`` when it was read; when it holds the reason it was not, that is the
        check's failure."""
        if isinstance(part, str):
            raise self.fail(f"cannot read {what}: {part}", fix)
        return part


#: Run by the node's python: a TCP connection to (address, port) within 5 s, or why not.
_REACH = ("import socket, sys\n"
          "try:\n"
          "    socket.create_connection((sys.argv[1], int(sys.argv[2])), 5).close()\n"
          "except OSError as exc:\n"
          "    print(exc)\n")


def _reach(conn: Any, python: str, webhook: Any) -> str:
    """"" when the host reaches the webhook's address, else why not."""
    done = conn.run(shell.join([python, "-c", _REACH, webhook.address, webhook.port]),
                    timeout=30)
    if not done.ok:
        return done.error_line()
    return done.stdout.strip()


def inspect(target: Target, connector: Connector, host: Host) -> NodeState:
    """Read one host's state (the executor's work for it)."""
    conn = connector.connect(host)
    try:
        facts = ask_facts(conn, host)
    except (UnknownHostKey, ChangedHostKey) as exc:
        return NodeState(host, UNTRUSTED, exc.reason)
    except RuntimeError as exc:
        return NodeState(host, FAILED, str(exc))
    state = NodeState(host, facts=facts)
    python, root = state.interpreter.path, facts.root
    if target.webhook is not None and target.webhook.host == host.name:
        state.webhook = _reach(conn, python or host.python, target.webhook)
    paths = [env_path(host)]
    if isinstance(target.hostfiles, list):
        backends = dict.fromkeys(b for _, rendered in target.hostfiles for b in rendered)
        paths += [hostfile_path(host, backend) for backend in backends]
    for path in paths:
        try:
            state.files[path] = read_file(conn, path)
        except OSError as exc:
            state.files[path] = str(exc)
    files, roots, ignore = target.code
    try:
        remote = remote_manifest(conn, code_path(host), roots, python)
        state.code = sync_files(conn, files, code_path(host), roots=roots, ignore=ignore,
                                check=True, remote=remote)
    except SyncError as exc:
        state.code = str(exc)
    if not (python and root):
        state.ready = "no interpreter to ask"
        return state
    asked = target.questions(host)   # what pre-flight asks, so both judge alike
    args = protocol.ready_args(root, ip=asked.ip, ports=asked.ports, mpi=asked.mpi)
    start = time.time()
    try:
        answer = run_node(conn, python, f"{root}/{protocol.CODE_DIR}", args,
                          timeout=READY_TIMEOUT)
    except NodeCommandError as exc:
        state.ready = str(exc)
        return state
    end = time.time()
    state.ready = answer
    # The node read its clock somewhere between our two readings.
    state.clock = (answer.now - (start + end) / 2, (end - start) / 2)
    for content in target.placed:
        try:
            state.placed[str(content.local)] = ask(conn, python, root, content, [])
        except NodeCommandError as exc:
            state.placed[str(content.local)] = str(exc)
    return state

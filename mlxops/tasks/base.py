"""What a provisioning task is: a function of one host's context that acts only on difference.

Like pyinfra's operations: a task reads the host's current state (facts, a file's content),
compares it with what should be, changes only what differs, and reports ok / changed /
skipped / failed. Under ``--check`` it reports what *would* change and changes nothing;
under ``--diff`` it returns a unified diff of the managed files it touches.

A task that reads node state before deciding declares that read (``read=``: host and
arguments in, ``{key: command}`` out). The play takes every selected task's reads along
with the facts command, so that a host with nothing to change costs one round trip in all;
the task then finds its answers in ``ctx.reads`` (:class:`Prefetched`, by key) and reads
for itself only what is not there (a read that failed, a play without facts, an earlier
task of the same kind that changed the host since).

Tasks register themselves by name with :func:`task`; ``playbooks/*.yml`` refers to them by
that name. Most tasks run per host (in parallel across hosts); a ``cluster`` task sees every
host's context at once (e.g. the version-skew check) and runs after the per-host tasks
before it have finished everywhere.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from mlxops import shell
from mlxops.hostfacts import HostFacts
from mlxops.transport.connection import Connection
from mlxops.transport.results import CHANGED, FAILED, OK, SKIPPED


@dataclass(frozen=True)
class Prefetched:
    """What one of a task's read commands printed in the facts round trip, and its exit."""

    exit_code: int
    stdout: str


@dataclass(frozen=True)
class PythonRead:
    """A read that is Python source for the node's interpreter (``mlxops_python``), run in
    the one the facts command starts anyway (a Python start less per read and host):
    ``argv`` is its ``sys.argv[1:]``; it prints its answer; ``sys.exit(n)`` or an exception
    is a failed read."""

    source: str
    argv: tuple[str, ...] = ()


#: A task's reads: host and arguments in, ``{key: POSIX sh command, or PythonRead}`` out.
Reads = Callable[[Any, Mapping[str, Any]], "dict[str, str | PythonRead]"]


@dataclass
class TaskContext:
    """Everything a task may look at for one host."""

    host: Any                      # mlxops.inventory.Host
    conn: Connection
    inventory: Any                 # mlxops.inventory.Inventory
    hosts: Sequence[Any]           # every selected host, in inventory order (for hostfiles)
    facts: HostFacts | None = None  # set by the facts task
    check: bool = False            # --check: report, change nothing
    diff: bool = False             # --diff: return unified diffs of managed files
    # Facts of every selected host, keyed by host name (tasks after `facts` may read them).
    cluster_facts: dict[str, HostFacts | None] = field(default_factory=dict)
    # The reads of the play's selected tasks, by label, for the facts command to take along
    # (set by the play); what they printed, by label (set by the facts task).
    pending_reads: dict[str, str | PythonRead] = field(default_factory=dict)
    read_answers: dict[str, Prefetched] = field(default_factory=dict)
    # The running task's own answers, by its keys (set by the play before each task; empty:
    # the task reads for itself).
    reads: dict[str, Prefetched] = field(default_factory=dict)

    def prefetched(self, key: str) -> str | None:
        """The stdout of this task's read ``key`` when it was read and succeeded."""
        answer = self.reads.get(key)
        return answer.stdout if answer is not None and answer.exit_code == 0 else None


@dataclass
class Outcome:
    status: str = OK               # ok | changed | skipped | failed
    message: str = ""
    diff: str = ""
    data: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def ok(cls, message: str = "", **data: Any) -> Outcome:
        return cls(OK, message, data=data)

    @classmethod
    def changed(cls, message: str = "", diff: str = "", **data: Any) -> Outcome:
        return cls(CHANGED, message, diff, data)

    @classmethod
    def skipped(cls, message: str = "") -> Outcome:
        return cls(SKIPPED, message)

    @classmethod
    def failed(cls, message: str, **data: Any) -> Outcome:
        return cls(FAILED, message, data=data)


@dataclass(frozen=True)
class TaskSpec:
    name: str
    fn: Callable[..., Any]
    scope: str                     # "host" or "cluster"
    args: frozenset[str]           # the argument names the task accepts (checked at load)
    read: Reads | None = None      # what it reads on a host, taken along with the facts


REGISTRY: dict[str, TaskSpec] = {}


def task(name: str, *, scope: str = "host", args: Sequence[str] = (),
         read: Reads | None = None) -> Callable:
    """Register a task under ``name``; ``args`` lists the playbook arguments it accepts,
    ``read`` the node state it reads before deciding (see the module's docstring)."""
    if scope not in ("host", "cluster"):
        raise ValueError(scope)

    def register(fn: Callable) -> Callable:
        REGISTRY[name] = TaskSpec(name, fn, scope, frozenset(args), read)
        return fn

    return register


# --- the reads' part of the facts command (:func:`mlxops.tasks.facts.facts_script`) ------

MARK = "@@mlxops:"   # starts each section's line in the facts command's output
READ, EXIT = "read:", "exit:"  # a read's sections: what it printed, then its exit code

# After the probe, in the same interpreter: each Python read (label, source, argv) prints
# its sections as reads_script's commands do.
_PYTHON_READS = r"""
def _mlxops_reads(reads):
    import sys
    for label, source, argv in reads:
        print("@@mlxops:read:" + label)
        sys.stdout.flush()
        sys.argv[:] = [label, *argv]
        try:
            exec(compile(source, label, "exec"), {"__name__": "__mlxops_read__"})
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
        except BaseException:
            code = 1
        sys.stdout.flush()
        print("\n@@mlxops:exit:" + label)
        print(code)
        sys.stdout.flush()
"""


def python_reads_code(reads: Mapping[str, PythonRead]) -> str:
    """Python source that runs every read of ``reads`` (``{label: PythonRead}``) in turn."""
    if not reads:
        return ""
    table = [(label, r.source, list(r.argv)) for label, r in reads.items()]
    return f"{_PYTHON_READS}\n_mlxops_reads({json.dumps(table)})\n"


def reads_script(reads: Mapping[str, str]) -> str:
    """Each read (``{label: command}``) in a subshell of its own, its output and exit code
    in sections of their own; its stderr is dropped (a failed read is read again by its
    task, which then reports the error)."""
    parts = []
    for label, command in reads.items():
        parts.append(f"printf '%s\\n' {shell.quote(MARK + READ + label)}; "
                     f"( {command}\n) </dev/null 2>/dev/null; s=$?; "
                     # A newline first: the exit's mark starts a line even after output
                     # without a last newline (and the sections' split takes it back).
                     f"printf '\\n%s\\n' {shell.quote(MARK + EXIT + label)}; "
                     f"printf '%s\\n' \"$s\"\n")
    return "".join(parts)


def read_answers(sections: Mapping[str, str], labels: Iterable[str]) -> dict[str, Prefetched]:
    """What each read printed, by label; a read without its exit code is not there (the
    script was cut short)."""
    out = {}
    for label in labels:
        code = sections.get(EXIT + label, "").strip()
        if code.isdigit():
            out[label] = Prefetched(int(code), sections.get(READ + label, ""))
    return out

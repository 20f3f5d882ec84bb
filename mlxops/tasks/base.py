"""What a provisioning task is: a function of one host's context that acts only on difference.

Like pyinfra's operations: a task reads the host's current state (facts, a file's content),
compares it with what should be, changes only what differs, and reports ok / changed /
skipped / failed. Under ``--check`` it reports what *would* change and changes nothing;
under ``--diff`` it returns a unified diff of the managed files it touches.

Tasks register themselves by name with :func:`task`; ``playbooks/*.yml`` refers to them by
that name. Most tasks run per host (in parallel across hosts); a ``cluster`` task sees every
host's context at once (e.g. the version-skew check) and runs after the per-host tasks
before it have finished everywhere.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from mlxops.hostfacts import HostFacts
from mlxops.transport.connection import Connection
from mlxops.transport.results import CHANGED, FAILED, OK, SKIPPED


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


REGISTRY: dict[str, TaskSpec] = {}


def task(name: str, *, scope: str = "host", args: Sequence[str] = ()) -> Callable:
    """Register a task under ``name``; ``args`` lists the playbook arguments it accepts."""
    if scope not in ("host", "cluster"):
        raise ValueError(scope)

    def register(fn: Callable) -> Callable:
        REGISTRY[name] = TaskSpec(name, fn, scope, frozenset(args))
        return fn

    return register

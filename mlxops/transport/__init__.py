"""Getting commands to hosts: connections (SSH or local), host keys, the parallel executor.

The names below are this package's: each is imported from its own module the first time
it is asked for (PEP 562's module ``__getattr__``), so that importing one part (the
connector, the results) does not import the others; ``from mlxops.transport import
Connector`` reads as ever. A command's start-up pays only for the parts it uses before
its first connection (tests/unit/cli/test_startup.py, benchmarks/startup.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from mlxops.node.lazy import lazy_names

#: Each name of the package -> the module under mlxops.transport that defines it.
_HOMES = {
    "CommandResult": "results",
    "Connection": "connection",
    "ConnectOptions": "connection",
    "LocalConnection": "connection",
    "SSHConnection": "connection",
    "Connector": "connector",
    "default_forks": "executor",
    "run_parallel": "executor",
    "ChangedHostKey": "hostkeys",
    "HostUnreachable": "hostkeys",
    "UnknownHostKey": "hostkeys",
    "GroupError": "results",
    "HostResult": "results",
    "Results": "results",
}

__all__ = [
    "ChangedHostKey",
    "CommandResult",
    "ConnectOptions",
    "Connection",
    "Connector",
    "GroupError",
    "HostResult",
    "HostUnreachable",
    "LocalConnection",
    "Results",
    "SSHConnection",
    "UnknownHostKey",
    "default_forks",
    "run_parallel",
]


__getattr__ = lazy_names(__name__, _HOMES, globals())


if TYPE_CHECKING:
    from mlxops.transport.connection import (
        CommandResult,
        Connection,
        ConnectOptions,
        LocalConnection,
        SSHConnection,
    )
    from mlxops.transport.connector import Connector
    from mlxops.transport.executor import default_forks, run_parallel
    from mlxops.transport.hostkeys import ChangedHostKey, HostUnreachable, UnknownHostKey
    from mlxops.transport.results import GroupError, HostResult, Results

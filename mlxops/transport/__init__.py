"""Getting commands to hosts: connections (SSH or local), host keys, the parallel executor."""

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

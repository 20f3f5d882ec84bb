"""testinfra's ``host`` over mlxops's own connections: host keys verified as everywhere else.

testinfra's paramiko backend accepts any host key (it installs a ``WarningPolicy``, and an
``IgnorePolicy`` where ssh_config says ``StrictHostKeyChecking no``). The ``mlxops``
backend registered here never opens a connection of its own: each command goes through
:class:`mlxops.transport.Connector`, whose SSH connections refuse an unknown key (unless
``--accept-new-host-keys``) and always a changed one, read ``~/.ssh/config`` through
Fabric, and are the same kept connections the checks' facts were read on.

testinfra builds backends from host names (its ``--hosts`` and ``--connection``
options, which the mlxops plugin sets) and caches them across sessions; so a backend holds
only its host's name, and finds the connection of the session under way when it runs a
command (:func:`bind`).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

import testinfra.backend
from testinfra.backend import base

from mlxops.inventory import Host
from mlxops.transport import Connector

NAME = "mlxops"
COMMAND_TIMEOUT = 300.0   # a hung command fails its check instead of hanging the run

_lock = threading.Lock()
_bound: tuple[Mapping[str, Host], Connector] | None = None


def register() -> None:
    """Make ``--connection mlxops`` (and ``mlxops://host``) known to testinfra."""
    testinfra.backend.BACKENDS[NAME] = f"{__name__}.MlxopsBackend"


def bind(hosts: Mapping[str, Host], connector: Connector) -> None:
    """The hosts and connections the backends of the session under way use."""
    global _bound
    with _lock:
        _bound = (dict(hosts), connector)


def unbind() -> None:
    global _bound
    with _lock:
        _bound = None


def connection(name: str):
    with _lock:
        bound = _bound
    if bound is None:
        raise RuntimeError("the mlxops testinfra backend works inside `mlxops check` or "
                           "`pytest --mlxops-inventory` only")
    hosts, connector = bound
    if name not in hosts:
        raise RuntimeError(f"{name}: not a host of the inventory being checked")
    return connector.connect(hosts[name])


class MlxopsBackend(base.BaseBackend):
    """A testinfra backend whose commands run on mlxops's connection to one inventory host
    (SSH with verified host keys, or local for ``ansible_connection: local``)."""

    NAME = NAME

    def __init__(self, hostname: str, *args: Any, **kwargs: Any):
        super().__init__(hostname, *args, **kwargs)

    def get_pytest_id(self) -> str:
        # The test ids are the inventory names: check_env_file[mac2].
        return self.hostname

    def run(self, command: str, *args: str, **kwargs: Any) -> base.CommandResult:
        command = self.get_command(command, *args)
        result = connection(self.hostname).run(command, timeout=COMMAND_TIMEOUT)
        return self.result(result.exit_code, self.encode(command), result.stdout,
                           result.stderr)

"""What a loaded inventory is: hosts with their resolved variables, and groups.

Values were validated when the inventory was loaded (see ``loader``), so the typed
properties here only apply defaults and resolve paths.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mlxops.inventory import patterns
from mlxops.inventory.variables import default


@dataclass(frozen=True)
class Host:
    """One inventory host. ``vars`` are resolved with Ansible's precedence.

    ``groups`` are Ansible's ``group_names``: every group the host is in, directly or
    through a parent, sorted, without ``all``.
    """

    name: str
    vars: Mapping[str, Any] = field(compare=False, repr=False)
    groups: tuple[str, ...] = ()
    # The inventory file's directory: relative key and known_hosts paths start there.
    base_dir: Path = field(default=Path("."), compare=False, repr=False)

    def _get(self, name: str) -> Any:
        value = self.vars.get(name)
        return default(name) if value is None else value

    @property
    def address(self) -> str:
        return self.vars.get("ansible_host") or self.name

    @property
    def user(self) -> str | None:
        return self.vars.get("ansible_user")

    @property
    def port(self) -> int:
        return self._get("ansible_port")

    @property
    def key_file(self) -> Path | None:
        return self._local_path("ansible_ssh_private_key_file")

    @property
    def known_hosts(self) -> Path | None:
        return self._local_path("mlxops_known_hosts")

    @property
    def connection(self) -> str:
        return self._get("ansible_connection")

    @property
    def become(self) -> bool:
        return self._get("ansible_become")

    @property
    def python(self) -> str:
        # A local host with no interpreter named runs the controller's own: that is the
        # Python that has mlx when `make demo` runs from a virtualenv.
        if self.vars.get("mlxops_python") is None and self.connection == "local":
            return sys.executable
        return self._get("mlxops_python")

    @property
    def root(self) -> str:
        # A node path: `~` is the node's home, so it is left for the node to expand.
        return self._get("mlxops_root")

    @property
    def slots(self) -> int:
        return self._get("mlxops_slots")

    @property
    def ip(self) -> str:
        return self.vars.get("mlxops_ip") or self.address

    @property
    def env(self) -> dict[str, str]:
        return {k: str(v) for k, v in (self.vars.get("mlxops_env") or {}).items()}

    def _local_path(self, name: str) -> Path | None:
        """A controller path: ``~`` expands, a relative one is relative to the inventory."""
        value = self.vars.get(name)
        if not value:
            return None
        return self.base_dir / os.path.expanduser(value)


@dataclass(frozen=True)
class Group:
    """A group as the inventory defines it.

    ``hosts`` and ``children`` are direct members only; ``vars`` are the group's own
    (inventory file, then its group_vars/ files), not inherited ones.
    """

    name: str
    hosts: tuple[str, ...] = ()
    children: tuple[str, ...] = ()
    parents: tuple[str, ...] = ()
    vars: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)
    depth: int = 0
    priority: int = 1


@dataclass(frozen=True)
class Inventory:
    path: Path
    hosts: Mapping[str, Host]
    groups: Mapping[str, Group]

    def select(self, pattern: str | None = None, source: str = "--limit") -> list[Host]:
        """Hosts matching an Ansible host pattern (``--limit``), in inventory order.

        ``None`` means all hosts. ``source`` names where the pattern came from, for errors
        (``--limit``, or ``job.yml: hosts``). A plain name that is neither a host nor a
        group, or a pattern that selects nothing, is a :class:`~mlxops.errors.UserError`.
        """
        if pattern is None:
            return list(self.hosts.values())
        names = patterns.select(self, pattern, source)
        return [self.hosts[n] for n in names]

    def group_names(self, host: Host | str) -> list[str]:
        """Ansible's ``group_names``: the host's groups, sorted, without ``all``."""
        name = host if isinstance(host, str) else host.name
        return list(self.hosts[name].groups)

    def group_hosts(self, group: str) -> list[str]:
        """Names of the hosts in a group or any of its descendants, in inventory order."""
        return [h.name for h in self.hosts.values() if group == "all" or group in h.groups]

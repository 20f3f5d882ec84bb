"""What a loaded inventory is: hosts with their resolved variables, and groups.

Values were validated when the inventory was loaded (see ``loader``). ``Host.var(name)`` is
the one way to read a registered variable: the registry's parser types it and supplies the
default; the properties here are named shortcuts over it.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mlxops.errors import bad_input
from mlxops.inventory import patterns, variables

# Where a value was written: (file, key path). Hosts built by hand (tests) have none.
Origin = tuple[Path, str]


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
    # variable -> where its value was written, for messages naming the file and the key.
    origins: Mapping[str, Origin] = field(default_factory=dict, compare=False, repr=False)

    def var(self, name: str) -> Any:
        """A registered variable, parsed by its registered parser; its default when unset."""
        return variables.value(name, self.vars.get(name))

    def is_set(self, name: str) -> bool:
        """Whether the inventory gives ``name`` a value (else the default applies)."""
        return self.vars.get(name) is not None

    def origin(self, name: str) -> Origin:
        """(file, key) where ``name`` is set, for an error about its value."""
        return self.origins.get(name) or (self.base_dir, f"{self.name}.{name}")

    @property
    def address(self) -> str:
        return self.var("ansible_host") or self.name

    @property
    def user(self) -> str | None:
        return self.var("ansible_user")

    @property
    def port(self) -> int:
        return self.var("ansible_port")

    @property
    def ssh_port(self) -> int | None:
        """The port only when the inventory names one, so that ``~/.ssh/config`` may."""
        return self.var("ansible_port") if self.is_set("ansible_port") else None

    @property
    def key_file(self) -> Path | None:
        return self.local_path("ansible_ssh_private_key_file")

    @property
    def known_hosts(self) -> Path | None:
        return self.local_path("mlxops_known_hosts")

    @property
    def ssh_proxy(self) -> dict[str, str]:
        """The jump host ``ansible_ssh_common_args`` (else ``_extra_args``) names, as
        ssh_config options (``{"proxyjump": "bastion"}``); {} when they name none."""
        return (self.var("ansible_ssh_common_args") or self.var("ansible_ssh_extra_args")
                or {})

    @property
    def connection(self) -> str:
        return self.var("ansible_connection")

    @property
    def become(self) -> bool:
        return self.var("ansible_become")

    @property
    def python(self) -> str:
        # A local host with no interpreter named runs the controller's own: that is the
        # Python that has mlx when `make demo` runs from a virtualenv.
        if not self.is_set("mlxops_python") and self.connection == "local":
            return sys.executable
        return self.var("mlxops_python")

    @property
    def root(self) -> str:
        # A node path: `~` is the node's home, so it is left for the node to expand.
        return self.var("mlxops_root")

    @property
    def slots(self) -> int:
        return self.var("mlxops_slots")

    @property
    def ip(self) -> str:
        return self.var("mlxops_ip") or self.address

    @property
    def env(self) -> dict[str, str]:
        return dict(self.var("mlxops_env"))

    def local_path(self, name: str) -> Path | None:
        """A controller path: ``~`` expands, a relative one is relative to the inventory."""
        value = self.var(name)
        if not value:
            return None
        return self.base_dir / os.path.expanduser(value)

    def check_local_files(self) -> None:
        """Refuse, naming the file and key, what would fail on this controller only once
        connecting: an SSH key that is not there. (A missing known_hosts file is only
        empty: ``mlxops trust`` creates it.)"""
        if self.connection == "local":
            return  # no SSH, no key
        key = self.key_file
        if key is not None and not key.is_file():
            path, where = self.origin("ansible_ssh_private_key_file")
            what = "is a directory" if key.is_dir() else "no such file"
            raise bad_input(path, where, f"{what}: {key}")


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

    def select(self, pattern: str | None = None, source: str = "--limit", *,
               check_files: bool = True) -> list[Host]:
        """Hosts matching an Ansible host pattern (``--limit``), in inventory order.

        ``None`` means all hosts. ``source`` names where the pattern came from, for errors
        (``--limit``, or ``job.yml: hosts``). A plain name that is neither a host nor a
        group, or a pattern that selects nothing, is a :class:`~mlxops.errors.UserError`;
        so is a selected host whose SSH key file is missing (checked here, not at load, so
        that an inventory shared by several controllers loads where some keys are absent;
        ``check_files=False`` for a command that never connects, such as ``hostfile``).
        """
        if pattern is None:
            hosts = list(self.hosts.values())
        else:
            hosts = [self.hosts[n] for n in patterns.select(self, pattern, source)]
        for host in hosts if check_files else ():
            host.check_local_files()
        return hosts

    def group_hosts(self, group: str) -> list[str]:
        """Names of the hosts in a group or any of its descendants, in inventory order."""
        return [h.name for h in self.hosts.values() if group == "all" or group in h.groups]

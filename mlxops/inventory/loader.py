"""Load an Ansible YAML inventory, with group_vars/ and host_vars/ beside it.

The result matches ``ansible-inventory -i FILE --list``
(tests/unit/inventory/test_inventory_ansible.py checks it): same hosts, same group
membership, same resolved variables. Where Ansible only warns (an unknown group key, a
host named like a group, a duplicate key) mlxops refuses, because a silently ignored line
in an inventory is a misconfigured cluster.

Ansible's precedence, lowest first (``combine_vars`` with ``hash_behaviour=replace``, so
each variable is replaced as a whole, never deep-merged):

1. the inventory file's ``all`` vars, then its vars of every other group of the host,
   shallow groups before deep ones, same depth by ``ansible_group_priority`` then name;
2. ``group_vars/all``, then ``group_vars/<group>`` in the same group order;
3. the inventory file's host vars, then ``host_vars/<host>``.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from mlxops.errors import bad_input
from mlxops.inventory import variables
from mlxops.inventory.model import Group, Host, Inventory
from mlxops.yamlfile import join_key, read_yaml

GROUP_KEYS = ("hosts", "vars", "children")
# Names that also work unquoted in host patterns and as file names in group_vars/.
_GROUP_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]*$")
_HOST_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")
# Ansible's host ranges: mac[1:3], mac[01:10], node-[a:c], with an optional :step.
_RANGE = re.compile(r"^(.*?)\[([0-9]+|[a-z]):([0-9]+|[a-z])(?::([0-9]+))?\](.*)$")
_VARS_EXTENSIONS = ("", ".yml", ".yaml", ".json")


def load_inventory(path: str | os.PathLike[str]) -> Inventory:
    """Load and validate an inventory; any problem is one-line :class:`UserError`."""
    path = Path(path)
    data = read_yaml(path, "an inventory file")
    if data is None:
        raise bad_input(path, None, "empty inventory: no hosts defined")
    if not isinstance(data, dict):
        raise bad_input(path, None, f"must be a mapping of groups (e.g. 'all:'), got {_kind(data)}")
    builder = _Builder(path)
    for name, body in data.items():
        builder.group(name, body, key=str(name), parent=None)
    return builder.finish()


# --- reading files ------------------------------------------------------------------------

# Where a variable's value was written: the file and the key path in it, for messages about
# a value that can only be judged once the inventory is whole (or a host is selected).
Origin = tuple[Path, str]


def _vars_files(directory: Path, name: str) -> list[Path]:
    """Ansible's find_vars_files: NAME, NAME.yml, NAME.yaml or NAME.json, first found wins;
    a directory contributes all its files (recursively, sorted, hidden ones skipped)."""
    for ext in _VARS_EXTENSIONS:
        candidate = directory / f"{name}{ext}"
        if candidate.is_dir():
            return _dir_vars_files(candidate)
        if candidate.exists():
            return [candidate]
    return []


def _dir_vars_files(directory: Path) -> list[Path]:
    found: list[Path] = []
    for entry in sorted(directory.iterdir(), key=lambda p: p.name):
        if entry.name.startswith(".") or entry.name.endswith("~"):
            continue
        if entry.is_dir() and not entry.suffix:
            found.extend(_dir_vars_files(entry))
        elif entry.is_file() and entry.suffix in _VARS_EXTENSIONS:
            found.append(entry)
    return found


@dataclass
class _Vars:
    """Variables of one layer, each with where it was written."""

    values: dict[str, Any] = field(default_factory=dict)
    origins: dict[str, Origin] = field(default_factory=dict)

    def update(self, path: Path, key: str | None, data: dict[str, Any]) -> None:
        for name, value in data.items():
            self.values[name] = value
            self.origins[name] = (path, join_key(key, name))


def _load_vars_files(directory: Path, name: str) -> _Vars:
    merged = _Vars()
    for file in _vars_files(directory, name):
        data = read_yaml(file, "a vars file")
        if data is None:
            continue
        if not isinstance(data, dict):
            raise bad_input(file, None, f"must be a mapping of variables, got {_kind(data)}")
        merged.update(file, None, _checked_vars(file, None, data))
    return merged


# --- validation helpers -------------------------------------------------------------------


def _kind(value: Any) -> str:
    if isinstance(value, list):
        return "a list"
    if isinstance(value, str):
        return f"the string {value!r}"
    return f"{type(value).__name__} {value!r}"


def _checked_vars(path: Path, key: str | None, data: dict[Any, Any]) -> dict[str, Any]:
    """Validate a mapping of variables where it is written; return it unchanged."""
    for name, value in data.items():
        if not isinstance(name, str) or not name.isidentifier():
            raise bad_input(path, join_key(key, name), "not a valid variable name")
        try:
            variables.check(name, value)
        except variables.Invalid as exc:
            where = join_key(join_key(key, name), exc.subkey) if exc.subkey else join_key(key, name)
            raise bad_input(path, where, exc.problem) from None
    return data


def _expand_host(pattern: str) -> list[str]:
    """``mac[1:3]`` -> mac1, mac2, mac3 (Ansible's ranges; leading zeros keep the width)."""
    m = _RANGE.match(pattern)
    if not m:
        return [pattern]
    head, beg, end, step, tail = m.groups()
    stride = int(step or 1)
    if beg.isdigit() and end.isdigit():
        width = len(beg) if beg.startswith("0") else 0
        items = [str(i).zfill(width) for i in range(int(beg), int(end) + 1, stride)]
    elif beg.isalpha() and end.isalpha():
        items = [chr(i) for i in range(ord(beg), ord(end) + 1, stride)]
    else:
        raise ValueError("a range mixes letters and numbers")
    if not items:
        raise ValueError("an empty range")
    return [name for item in items for name in _expand_host(f"{head}{item}{tail}")]


# --- building -----------------------------------------------------------------------------


@dataclass
class _GroupDraft:
    key: str  # where it is first defined, for errors
    hosts: list[str] = field(default_factory=list)
    children: list[str] = field(default_factory=list)
    parents: list[str] = field(default_factory=list)
    vars: _Vars = field(default_factory=_Vars)
    priority: int = 1


@dataclass
class _HostDraft:
    key: str
    groups: list[str] = field(default_factory=list)  # direct memberships
    vars: _Vars = field(default_factory=_Vars)


class _Builder:
    def __init__(self, path: Path) -> None:
        self.path = path
        # Ansible always has these two; `ungrouped` is the first child of `all`.
        self.groups: dict[str, _GroupDraft] = {
            "all": _GroupDraft("all", children=["ungrouped"]),
            "ungrouped": _GroupDraft("ungrouped", parents=["all"]),
        }
        self.hosts: dict[str, _HostDraft] = {}

    # -- the YAML tree

    def group(self, name: Any, body: Any, key: str, parent: str | None) -> None:
        if not isinstance(name, str) or not _GROUP_NAME.match(name):
            raise bad_input(self.path, key, "bad group name: use letters, digits, '_' and '-'")
        draft = self.groups.setdefault(name, _GroupDraft(key))
        if parent is not None:
            self._link(parent, name, key)
        if body is None:
            return
        if not isinstance(body, dict):
            raise bad_input(self.path, key,
                            f"a group must be a mapping of hosts/vars/children, got {_kind(body)}")
        # File order, as Ansible: it decides the order hosts are first seen in.
        for section, value in body.items():
            where = join_key(key, section)
            if section not in GROUP_KEYS:
                raise bad_input(self.path, where,
                                "unknown group key: a group has only hosts, vars and children")
            value = self._section(where, section, value)
            if section == "vars":
                self._group_vars(draft, where, value)
            elif section == "children":
                for child, child_body in value.items():
                    self.group(child, child_body, join_key(where, child), parent=name)
            else:
                for pattern, host_vars in value.items():
                    self._host(name, pattern, host_vars, join_key(where, pattern))

    def _section(self, key: str, section: str, value: Any) -> dict[Any, Any]:
        if value is None:
            return {}
        if isinstance(value, str) and section != "vars":
            return {value: None}  # Ansible's shorthand `hosts: mac1`
        if not isinstance(value, dict):
            what = "variables" if section == "vars" else f"{section} names (name: ...)"
            raise bad_input(self.path, key, f"must be a mapping of {what}, got {_kind(value)}")
        return value

    def _group_vars(self, draft: _GroupDraft, key: str, data: dict[Any, Any]) -> None:
        data = dict(_checked_vars(self.path, key, data))
        if "ansible_group_priority" in data:
            draft.priority = data.pop("ansible_group_priority")  # Ansible keeps it apart
        draft.vars.update(self.path, key, data)  # a group defined twice: later keys win

    def _link(self, parent: str, child: str, key: str) -> None:
        if child == "all":
            raise bad_input(self.path, key, "'all' contains every group; it cannot be a child")
        if child == parent or child in self._ancestors(parent):
            raise bad_input(self.path, key,
                            f"group {child!r} would be its own ancestor (a cycle of children)")
        if child not in self.groups[parent].children:
            self.groups[parent].children.append(child)
            self.groups[child].parents.append(parent)

    def _ancestors(self, name: str) -> set[str]:
        seen: set[str] = set()
        todo = list(self.groups[name].parents)
        while todo:
            parent = todo.pop()
            if parent not in seen:
                seen.add(parent)
                todo.extend(self.groups[parent].parents)
        return seen

    def _host(self, group: str, pattern: Any, host_vars: Any, key: str) -> None:
        if not isinstance(pattern, str):
            raise bad_input(self.path, key, f"bad host name {pattern!r}: must be a string")
        try:
            names = _expand_host(pattern)
        except ValueError as exc:
            raise bad_input(self.path, key, f"bad host range: {exc}") from None
        if host_vars is None:
            host_vars = {}
        if not isinstance(host_vars, dict):
            raise bad_input(self.path, key,
                            f"host vars must be a mapping (or empty), got {_kind(host_vars)}")
        _checked_vars(self.path, key, host_vars)
        for name in names:
            if not _HOST_NAME.match(name):
                raise bad_input(self.path, key, _bad_host_problem(name))
            draft = self.hosts.setdefault(name, _HostDraft(key))
            if group not in draft.groups:
                draft.groups.append(group)
                self.groups[group].hosts.append(name)
            draft.vars.update(self.path, key, host_vars)  # listed twice: later keys win

    # -- after the tree

    def finish(self) -> Inventory:
        if not self.hosts:
            raise bad_input(self.path, None, "empty inventory: no hosts defined")
        for name, draft in self.hosts.items():
            if name in self.groups:
                raise bad_input(self.path, draft.key,
                                f"host {name!r} has the same name as a group; rename one")
        self._reconcile()
        depths = self._depths()
        base = self.path.parent
        group_files = {g: _load_vars_files(base / "group_vars", g) for g in self.groups}
        groups = {
            name: Group(name, tuple(d.hosts), tuple(d.children), tuple(d.parents),
                        MappingProxyType({**d.vars.values, **group_files[name].values}),
                        depths[name], d.priority)
            for name, d in self.groups.items()
        }
        hosts = {}
        for name in self.hosts:
            member_of = self._host_groups(name)
            order = sorted((groups[g] for g in member_of if g != "all"),
                           key=lambda g: (g.depth, g.priority, g.name))
            layers = [self.groups["all"].vars, *(self.groups[g.name].vars for g in order),
                      group_files["all"], *(group_files[g.name] for g in order),
                      self.hosts[name].vars, _load_vars_files(base / "host_vars", name)]
            resolved: dict[str, Any] = {}
            origins: dict[str, Origin] = {}
            for layer in layers:
                resolved.update(layer.values)
                origins.update(layer.origins)
            hosts[name] = Host(name, MappingProxyType(resolved),
                               tuple(sorted(member_of - {"all"})), base,
                               MappingProxyType(origins))
        for host in hosts.values():
            self._check_peers(host, hosts)
            self._check_supervisor(host, hosts)
        hosts = self._in_ring_order(hosts, [self.groups["all"].vars, group_files["all"]])
        return Inventory(self.path, MappingProxyType(hosts), MappingProxyType(groups))

    def _in_ring_order(self, hosts: dict[str, Host], all_layers: list[_Vars]
                       ) -> dict[str, Host]:
        """``mlxops_ring_order`` decides the inventory's host order, and so every rank
        order: the hosts it lists first, in its order, then the others in file order. One
        order for the whole inventory, so it is only read where ``all``'s vars are."""
        name = "mlxops_ring_order"
        at_all = [layer.origins[name] for layer in all_layers if name in layer.values]
        for host in hosts.values():
            if host.is_set(name) and host.origin(name) not in at_all:
                path, key = host.origin(name)
                raise bad_input(path, key, "set it under all: vars or in group_vars/all (one "
                                           "ring order for the whole inventory), not for "
                                           "a group or a host")
        if not at_all:
            return hosts
        path, key = at_all[-1]  # the one in effect: group_vars/all wins over the file's
        order = next(iter(hosts.values())).var(name)
        for i, listed in enumerate(order):
            if listed not in hosts:
                raise bad_input(path, join_key(key, i), f"no host named {listed!r} in "
                                                        f"{self.path}")
        return {n: hosts[n] for n in variables.ring_ordered(list(hosts), order)}

    def _check_peers(self, host: Host, hosts: dict[str, Host]) -> None:
        """``mlxops_rdma`` names peers: each must be a host of this inventory."""
        for peer in host.var("mlxops_rdma") or {}:
            if peer not in hosts:
                path, key = host.origins["mlxops_rdma"]
                raise bad_input(path, join_key(key, peer),
                                f"no host named {peer!r} in {self.path} (mlxops_rdma maps "
                                "peer hosts to the RDMA device that reaches them)")

    def _check_supervisor(self, host: Host, hosts: dict[str, Host]) -> None:
        """``mlxops_supervisor`` names a host of this inventory (or ``controller``)."""
        name = host.var("mlxops_supervisor")
        if name is not None and name != "controller" and name not in hosts:
            path, key = host.origins["mlxops_supervisor"]
            raise bad_input(path, key, f"no host named {name!r} in {self.path} (the host "
                                       "that supervises the jobs, or 'controller')")

    def _reconcile(self) -> None:
        """Ansible's reconcile_inventory: parentless groups go under `all`; hosts in no
        group but `all` go to `ungrouped` (and leave it if they are in another group)."""
        for name, draft in self.groups.items():
            if name != "all" and not draft.parents:
                self._link("all", name, draft.key)
        ungrouped = self.groups["ungrouped"]
        for name, host in self.hosts.items():
            others = set(host.groups) - {"all", "ungrouped"}
            if others and name in ungrouped.hosts:
                ungrouped.hosts.remove(name)
                host.groups.remove("ungrouped")
            elif not others and "ungrouped" not in host.groups:
                ungrouped.hosts.append(name)
                host.groups.append("ungrouped")

    def _depths(self) -> dict[str, int]:
        """Longest path from `all`, as Ansible's Group.depth."""
        depths: dict[str, int] = {}

        def depth(name: str) -> int:
            if name not in depths:
                parents = self.groups[name].parents
                depths[name] = 1 + max(map(depth, parents)) if parents else 0
            return depths[name]

        for name in self.groups:
            depth(name)
        return depths

    def _host_groups(self, name: str) -> set[str]:
        direct = self.hosts[name].groups
        result = set(direct)
        for group in direct:
            result |= self._ancestors(group)
        return result


def _bad_host_problem(name: str) -> str:
    if ":" in name:
        return f"bad host name {name!r}: set ansible_port (or ansible_host) instead of a ':'"
    return f"bad host name {name!r}: use letters, digits, '.', '_' and '-'"

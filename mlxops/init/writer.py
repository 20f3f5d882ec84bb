"""The inventory ``mlxops init`` writes, and its re-run: add what is new, keep the rest.

Policy. The file is Ansible's YAML inventory (docs/inventory.md), edited through
ruamel.yaml's round-trip mode, which keeps every comment, key order and quoting the user
wrote. A host already in the file (by its name, or by an ``ansible_host`` equal to the
new one's address) is left as it is, values and comments; a new host goes under
``all.children.<chip family>.hosts`` with a comment line saying what was found (chip,
memory, macOS build) and one after ``mlxops_ip`` saying which link it is on. ``all.vars``
keys given on the command line (user, key, known_hosts) are added only where absent.
Nothing is written here but through :func:`write_atomic` (a temporary file renamed over
the target): an interrupted run leaves the old file whole.
"""

from __future__ import annotations

import difflib
import io
import os
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlxops.init.links import DataAddress

HEADER = ("Written by `mlxops init`; edit freely: a re-run adds new Macs and keeps what\n"
          "is here, comments included. Ansible reads it too: ansible-inventory -i FILE --list")


@dataclass(frozen=True)
class NewHost:
    """One host as init writes it."""

    name: str
    address: str                 # ansible_host
    user: str | None             # ansible_user (None: all.vars' or ssh's own)
    family: str                  # its group: the chip family (:func:`chip_family`)
    data: DataAddress            # mlxops_ip and why
    python: str | None           # mlxops_python: an interpreter with mlx, if one was found
    slots: int
    summary: str                 # "Apple M1 Pro, 32 GiB, macOS 14.4.1 (23E224)"
    become: bool = False         # a Mac where sudo -n works: ansible_become: true


def chip_family(chip: str | None, system: str | None, arch: str | None) -> str:
    """A group name from the chip: ``Apple M2 Ultra`` -> ``m2_ultra``; a node without an
    Apple chip (a Linux sandbox node) -> ``linux_x86_64``."""
    m = re.match(r"Apple (M\d+)(?: (Pro|Max|Ultra))?", chip or "")
    if m:
        return "_".join(p.lower() for p in m.groups() if p)
    return re.sub(r"[^a-z0-9_]", "_", f"{system or 'unknown'}_{arch or ''}".lower()).strip("_")


def _yaml():
    from ruamel.yaml import YAML  # the writer's own dependency, loaded when init runs

    yaml = YAML()  # round-trip: comments, order and quotes kept
    yaml.indent(mapping=2, sequence=4, offset=2)
    yaml.width = 100
    return yaml


def load(text: str | None):
    """The document to edit: ``text`` parsed round-trip, or a new one with the header."""
    from ruamel.yaml.comments import CommentedMap

    doc = _yaml().load(text) if text and text.strip() else None
    if doc is None:
        doc = CommentedMap()
        doc.yaml_set_start_comment(HEADER)
    return doc


def _child(parent, key: str):
    from ruamel.yaml.comments import CommentedMap

    if parent.get(key) is None:
        parent[key] = CommentedMap()
    return parent[key]


def _groups(body: Any) -> Iterator[Mapping]:
    """Every group body under ``body`` (``all`` itself included), depth first."""
    if not isinstance(body, Mapping):
        return
    yield body
    for child in (body.get("children") or {}).values():
        yield from _groups(child)


def existing_hosts(doc: Any) -> dict[str, str]:
    """``{host name: address}`` of every host in the document (the address is its
    ``ansible_host``, else its name)."""
    found: dict[str, str] = {}
    top = doc.get("all") if isinstance(doc, Mapping) else None
    for group in _groups(top):
        for name, body in (group.get("hosts") or {}).items():
            address = body.get("ansible_host") if isinstance(body, Mapping) else None
            found.setdefault(str(name), str(address or name))
    return found


def merge(doc: Any, hosts: Sequence[NewHost], common: Mapping[str, Any]) -> list[str]:
    """Add ``hosts`` not yet in ``doc`` and the ``common`` vars it lacks; returns the
    names added. Nothing already there is changed."""
    from ruamel.yaml.comments import CommentedMap

    known = existing_hosts(doc)
    addresses = set(known.values())
    top = _child(doc, "all")
    if common:
        top_vars = _child(top, "vars")
        for key, value in common.items():
            if value is not None and key not in top_vars:
                top_vars[key] = value
    added = []
    for host in hosts:
        if host.name in known or host.address in addresses:
            continue
        group = _child(_child(top, "children"), host.family)
        group_hosts = _child(group, "hosts")
        body = CommentedMap(entry(host))
        if host.become:
            body.yaml_add_eol_comment("sudo -n works here: provision sets the wired limit "
                                      "and sleep", "ansible_become")
        group_hosts[host.name] = body
        # all: / children: / <family>: / hosts: / <host>: -- the host's key at column 8
        group_hosts.yaml_set_comment_before_after_key(host.name, before=host.summary,
                                                      indent=8)
        if host.data.ip:
            body.yaml_add_eol_comment(host.data.comment(), "mlxops_ip")
        else:
            body.yaml_add_eol_comment(host.data.comment(), "ansible_host")
        added.append(host.name)
        addresses.add(host.address)
    return added


def entry(host: NewHost) -> dict[str, Any]:
    """The variables a new host is written with, in the file's order (its comments are
    :func:`merge`'s)."""
    body: dict[str, Any] = {"ansible_host": host.address}
    if host.user:
        body["ansible_user"] = host.user
    if host.data.ip:
        body["mlxops_ip"] = host.data.ip
    if host.python:
        body["mlxops_python"] = host.python
    body["mlxops_slots"] = host.slots
    if host.become:
        body["ansible_become"] = True
    return body


def dump(doc: Any) -> str:
    out = io.StringIO()
    _yaml().dump(doc, out)
    return out.getvalue()


def diff(old: str, new: str, path: Path) -> str:
    """A unified diff of ``old`` -> ``new``, named after ``path`` (empty: no change)."""
    return "".join(difflib.unified_diff(old.splitlines(keepends=True),
                                        new.splitlines(keepends=True),
                                        f"{path} (now)", f"{path} (init)"))


def write_atomic(path: Path, text: str) -> None:
    """``text`` into ``path``: a temporary file beside it, renamed over it."""
    tmp = path.with_name(f".{path.name}.init{os.getpid()}")
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)

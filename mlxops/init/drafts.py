"""The draft inventory init connects by: the existing file, the command line's ``all.vars``
and the candidates, as the loader every command uses sees them.

Policy. The hosts init tries are :class:`~mlxops.inventory.Host` records as every command
gets them (user, key, known_hosts file, interpreter, root: what ``Connector`` opens by),
and a bad file or value is refused (exit 2, naming the output file) before a host is
touched. The draft is the existing document with the command line's ``all.vars`` merged
in (:func:`~mlxops.init.writer.merge`: only what the file lacks) and each candidate as a
host of a group ``init_draft`` with what init knows of it (:func:`~mlxops.init.writer.entry`:
``ansible_host``, ``ansible_user``); it is written to a hidden ``.NAME.init-draft.yml``
beside the output (so relative paths, ``group_vars/`` and ``host_vars/`` resolve as they
will) and loaded by :func:`~mlxops.inventory.load_inventory`, then removed.

One host at a time. ``mlxops init --all --accept-new-host-keys`` starts a host's work when
its mDNS answer comes (:mod:`mlxops.init.pipeline`), so a host is drafted alone, the
moment it is added: the file plus that one host (a host's variables depend on the file and
on itself only; the file's own references, ``mlxops_rdma`` peers and the supervisor, name
its own hosts). The round-trip document (ruamel: ~40 ms of CPU a parse and a dump on this
machine) is made once; each draft is the plain data the loader read of it plus the host,
written by PyYAML's emitter (the data has no tag or merge key left: ``parse_yaml`` refuses
the one and resolves the other): ~1 ms with the load (0.6 ms a host for 16 in turn,
load ~15).

Names: a candidate is named when it is added (:func:`~mlxops.init.hosts.inventory_name`:
its label, made unique against the file's hosts and those added before it), so two labels
that only differ in what a name cannot hold ("Studio 1", "Studio-1") are told apart in the
order they were added; the written inventory's names are given again from the facts, in
the candidates' sorted order (:mod:`mlxops.init.flow`).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from mlxops.errors import UserError
from mlxops.init import writer
from mlxops.init.hosts import Candidate, inventory_name
from mlxops.init.links import DataAddress

GROUP = "init_draft"
_BLANK = DataAddress(None, None, None, None, ())


class Drafts:
    """The file's hosts and the candidates added so far; thread-safe."""

    def __init__(self, output: Path, old_text: str, common: Mapping[str, Any]) -> None:
        import mlxops.inventory  # noqa: F401 - imported now, not by the first host heard
        from mlxops.yamlfile import parse_yaml

        doc = writer.load(old_text)
        writer.merge(doc, [], common)
        self.output = output
        self.known = writer.existing_hosts(doc)  # the file's hosts: {name: address}
        self._data = parse_yaml(writer.dump(doc), output) or {}
        self._addresses = set(self.known.values())
        self.fresh: dict[str, Candidate] = {}  # draft name -> candidate, as added
        self._lock = threading.Lock()
        self._base = None

    def add(self, candidate: Candidate) -> str | None:
        """``candidate``'s draft name; None when its address is the file's already (left
        as the user has it) or was added before."""
        with self._lock:
            if candidate.address in self._addresses or candidate.address in self.known:
                return None
            self._addresses.add(candidate.address)
            name = inventory_name(None, candidate.label, [*self.known, *self.fresh])
            self.fresh[name] = candidate
            return name

    def base(self):
        """The file's own hosts as loaded with the command line's vars (None: none)."""
        if self.known and self._base is None:
            self._base = self.load(())
        return self._base

    def host(self, name: str):
        """One host of the draft: the file's, or an added one loaded beside the file's."""
        if name in self.known:
            return self.base().hosts[name]
        return self.load((name,)).hosts[name]

    def load(self, names: Iterable[str] | None = None):
        """The draft: the file's hosts and the added ``names`` in that order (None: every
        one added, in the order added)."""
        import yaml

        from mlxops.inventory import load_inventory

        with self._lock:
            names = list(self.fresh if names is None else names)
            data = dict(self._data)  # copied along the path the hosts go in
            top = data["all"] = dict(data.get("all") or {})
            children = top["children"] = dict(top.get("children") or {})
            group = children[GROUP] = dict(children.get(GROUP) or {})
            hosts = group["hosts"] = dict(group.get("hosts") or {})
            for name in names:
                c = self.fresh[name]
                hosts[name] = writer.entry(writer.NewHost(name, c.address, c.user, GROUP,
                                                          _BLANK, None, 1, "draft"))
            if not hosts:
                del children[GROUP]
            dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
            draft = self.output.with_name(f".{self.output.name}.init-draft.yml")
            try:
                draft.write_text(yaml.dump(data, Dumper=dumper, sort_keys=False))
                return load_inventory(draft)
            except UserError as exc:
                raise UserError(str(exc).replace(str(draft), str(self.output))) from None
            finally:
                draft.unlink(missing_ok=True)

"""What ``mlxops check`` checks, and against what: worked out before any connection.

The hosts (the inventory's, narrowed by ``--limit``; with ``--job``, the job's hosts), the
backend, each host's ring ports, and what the nodes should hold: the hostfiles and the code
bundle exactly as ``mlxops provision`` (or the job's pre-flight) would make them, from the
same functions. Every problem here is bad input (exit 2), found before any host is touched.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mlxops import render
from mlxops.errors import UserError, bad_input
from mlxops.ignore import Ignore
from mlxops.inventory import Host, Inventory, load_inventory
from mlxops.inventory.backend import hosts_backend
from mlxops.jobs.code import code_bundle
from mlxops.jobs.content import Content
from mlxops.jobs.placement import place_ranks
from mlxops.jobs.spec import JobSpec, load_job
from mlxops.jobs.workloads import Planner
from mlxops.node import protocol
from mlxops.paths import playbooks_dir
from mlxops.playbook import load_playbook
from mlxops.sync import bundle
from mlxops.tasks.hostfiles import render_all
from mlxops.transport import ConnectOptions

GB = 1024**3


@dataclass(frozen=True)
class Target:
    """The hosts to check and what they should look like."""

    inventory: Inventory
    hosts: tuple[Host, ...]              # checked, in inventory (rank) order
    planned: tuple[Host, ...] = ()       # the job's hosts (ranks are placed over them)
    job: JobSpec | None = None
    backend: str = protocol.DEFAULT_BACKEND
    ports: Mapping[str, tuple[int, ...]] = field(default_factory=dict)  # ring ports per host
    base_port: int = render.DEFAULT_BASE_PORT  # the first rank's ring port
    world: int = 0                       # ranks of the job (or of the checked hosts)
    options: ConnectOptions = field(default_factory=ConnectOptions)
    forks: int | None = None
    # The job's memory and disk plan (its workload's, inputs read on the controller), and
    # the directories pre-flight places on every node (a model, its data) by their sizes.
    planner: Planner | None = None
    placed: tuple[Content, ...] = ()

    @property
    def names(self) -> list[str]:
        return [h.name for h in self.hosts]

    @property
    def first(self) -> str:
        """The host with rank 0 (an mpi job's launcher)."""
        return self.hosts[0].name

    def host(self, name: str) -> Host:
        return self.inventory.hosts[name]

    @functools.cached_property
    def hostfile_sets(self) -> list[tuple[str, tuple[Host, ...]]]:
        """Each set of hosts provision may have been run on, named: the whole inventory,
        the job's hosts, the checked ones (``--limit``); a set listed once."""
        sets = {"the inventory": tuple(self.inventory.hosts.values())}
        if self.job is not None:
            sets[f"the hosts of {self.job.path.name}"] = self.planned
        sets["the checked hosts"] = self.hosts
        out, seen = [], set()
        for which, hosts in sets.items():
            names = tuple(h.name for h in hosts)
            if names not in seen:
                seen.add(names)
                out.append((which, hosts))
        return out

    @functools.cached_property
    def hostfiles(self) -> list[tuple[str, dict[str, str]]] | str:
        """What the ``hostfiles`` task writes, ``[(for which hosts, {backend: text})]``, for
        each of :attr:`hostfile_sets`. Or why none can be rendered."""
        choices, errors = [], []
        for which, hosts in self.hostfile_sets:
            try:
                choices.append((which, render_all(list(hosts), self.inventory.path)))
            except (UserError, ValueError) as exc:
                errors.append(str(exc))
        return choices or errors[0]

    @functools.cached_property
    def code(self) -> tuple[dict[str, Path], list[str], Ignore]:
        """``(files, roots, ignore)`` of ``<root>/code``: the ``sync`` task's bundle, or the
        job's (with its workdir) as its pre-flight syncs it."""
        return code_bundle(self.job) if self.job is not None else bundle()

    @functools.cached_property
    def macos_args(self) -> dict[str, Any]:
        """The ``macos`` task's arguments in the bundled provision playbook (the wired
        memory share, sleep): what provision would set."""
        play = load_playbook(playbooks_dir() / "provision.yml")
        task = next((t for t in play.tasks if t.spec.name == "macos"), None)
        return dict(task.args) if task is not None else {}


def load_target(inventory_path: str | Path, *, limit: str | None = None,
                job_path: str | Path | None = None,
                options: ConnectOptions | None = None, forks: int | None = None) -> Target:
    """Read and validate everything ``mlxops check`` is given; UserError on bad input."""
    inventory = load_inventory(inventory_path)
    job = load_job(job_path) if job_path else None
    planner, placed = None, ()
    if job is not None:
        checked_inventory = Path(inventory.path).resolve()
        if job.inventory != checked_inventory:
            raise bad_input(job.path, "inventory", f"names {job.inventory}, not the inventory "
                                                   f"being checked ({checked_inventory})")
        planned = inventory.select(job.hosts, source=f"{job.path}: hosts")
        if limit:
            chosen = {h.name for h in inventory.select(limit, source="--limit")}
            hosts = [h for h in planned if h.name in chosen]
            if not hosts:
                raise bad_input("--limit", None, f"{limit!r} selects none of the hosts of "
                                                 f"{job.path.name}")
        else:
            hosts = planned
        backend, base_port = job.backend, job.base_port
        planner = job.workload.planner(job.path)  # a model's files read now (bad input)
        placed = tuple(job.workload.listed())
    else:
        planned = hosts = inventory.select(limit, source="--limit")
        backend, base_port = hosts_backend(hosts, inventory.path), render.DEFAULT_BASE_PORT
    ports: dict[str, list[int]] = {h.name: [] for h in hosts}
    if backend == protocol.RING:
        # Ranks are placed over every host of the job (or of the check), as launch does.
        for rank in place_ranks(planned, base_port):
            if rank.host in ports:
                ports[rank.host].append(rank.port)
    return Target(inventory=inventory, hosts=tuple(hosts), planned=tuple(planned), job=job,
                  backend=backend, base_port=base_port,
                  ports={n: tuple(p) for n, p in ports.items()},
                  world=sum(h.slots for h in planned),
                  options=options or ConnectOptions(), forks=forks,
                  planner=planner, placed=placed)



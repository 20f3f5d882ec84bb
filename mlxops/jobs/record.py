"""The controller's record of a job: where its ranks run, its state, its restarts.

Kept as ``<controller home>/jobs/<name>/record.json`` (written atomically), so that
``status``, ``logs``, ``stop``, ``watch`` and ``resume`` work from any later shell, and a
controller killed mid-run loses nothing: the ranks run detached on the nodes.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from mlxops.errors import MlxopsError, UserError
from mlxops.inventory import load_inventory
from mlxops.jobs.placement import NodePaths, Rank
from mlxops.node.protocol import RUNNING
from mlxops.paths import controller_home


@dataclass
class HostRecord:
    name: str
    root: str          # absolute mlxops_root on the node
    python: str        # absolute interpreter on the node

    def paths(self, job: str) -> NodePaths:
        return NodePaths(self.root, job)


@dataclass
class JobRecord:
    name: str
    job_file: str
    inventory: str
    backend: str
    hosts: list[HostRecord]
    ranks: list[Rank]
    state: str = RUNNING
    attempt: int = 1
    steps: int | None = None               # the trainer's total steps, when known
    stall_timeout: float = 60.0            # from the job file's restart: section
    max_restarts: int = 3
    stop_grace: float = 5.0
    poll_interval: float = 0.0             # 0: derived from stall_timeout
    exclude_unreachable: bool = False      # restarts may go on without hosts that are down
    excluded: list[str] = field(default_factory=list)
    restarts: list[dict[str, Any]] = field(default_factory=list)
    # Hosts left behind while unreachable (restart.exclude_unreachable): their ranks may
    # still run there; stop and the watchdog kill them once the host answers again.
    stray: list[HostRecord] = field(default_factory=list)
    created: float = field(default_factory=time.time)
    updated: float = field(default_factory=time.time)
    message: str = ""

    @property
    def world_size(self) -> int:
        return len(self.ranks)

    def host(self, name: str) -> HostRecord:
        return next(h for h in [*self.hosts, *self.stray] if h.name == name)

    def ranks_on(self, host: str) -> list[Rank]:
        return [r for r in self.ranks if r.host == host]

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["ranks"] = [r.to_dict() for r in self.ranks]
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> JobRecord:
        data = dict(data)
        data["hosts"] = [HostRecord(**h) for h in data["hosts"]]
        data["stray"] = [HostRecord(**h) for h in data.get("stray", [])]
        data["ranks"] = [Rank(**r) for r in data["ranks"]]
        return cls(**data)

    def save(self) -> None:
        self.updated = time.time()
        path = record_path(self.name)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".record.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(self.to_dict(), indent=1))
        os.replace(tmp, path)


def job_dir(name: str) -> Path:
    return controller_home() / "jobs" / name


def record_path(name: str) -> Path:
    return job_dir(name) / "record.json"


def load_record(name: str) -> JobRecord:
    path = record_path(name)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        known = ", ".join(list_jobs()) or "none"
        raise UserError(f"no job named {name!r} (known jobs: {known}); start one with "
                        "'mlxops launch JOB.yml'") from None
    except (OSError, ValueError) as exc:
        raise MlxopsError(f"{path}: unreadable job record: {exc}") from None
    return JobRecord.from_dict(data)


def list_jobs() -> list[str]:
    root = controller_home() / "jobs"
    if not root.is_dir():
        return []
    return sorted(p.name for p in root.iterdir() if (p / "record.json").is_file())


@contextmanager
def supervisor_lock(name: str) -> Iterator[bool]:
    """One watchdog per job: yields False when another process already supervises it."""
    path = job_dir(name) / "watch.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        handle.write(f"{os.getpid()}\n")
        handle.flush()
        try:
            yield True
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def inventory_hosts(record: JobRecord) -> dict:
    """The job's hosts as the inventory describes them now (for connecting)."""
    inventory = load_inventory(record.inventory)
    missing = [h.name for h in record.hosts if h.name not in inventory.hosts]
    if missing:
        raise UserError(f"{record.inventory}: host {missing[0]!r} of job {record.name!r} is no "
                        "longer in the inventory")
    return {h.name: inventory.hosts[h.name] for h in [*record.hosts, *record.stray]
            if h.name in inventory.hosts}

"""The controller's record of a job: where its ranks run, its state, its restarts.

Kept as ``<controller home>/jobs/<name>/record.json``, so that ``status``, ``logs``,
``stop``, ``watch`` and ``resume`` work from any later shell, and a controller killed
mid-run loses nothing: the ranks run detached on the nodes.

Two processes write it: the watchdog (restarts, the end of the job) and ``mlxops stop``.
Every write is atomic (a temporary file renamed over it) and serialised by an ``flock`` on
``record.lock`` beside it (not the one-watchdog lock, ``watch.lock``); a change to the
record is a read-modify-write under that lock (:func:`update`). A user's stop is never
undone by a writer that has not seen it: ``stop`` stamps ``stopped_at`` under the lock, and
:meth:`JobRecord.save` of a record of the same job with another ``stopped_at`` (a watchdog
that was restarting the job meanwhile) is refused with :class:`JobStopped`.

The record keeps the job as launched (the job file's contents, parsed): a restart
rebuilds it from there (:meth:`JobRecord.job_spec`), whatever became of the file since.
What the job runs is held typed (:attr:`JobRecord.workload`, :mod:`mlxops.jobs.workloads`);
on disk it stays where the job file has it, under its kind's key of ``job``
(``"job": {"serve": {...}, ...}``), and reads back into the same type.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path, PurePath
from typing import Any

from mlxops.errors import MlxopsError, UserError
from mlxops.filelock import exclusive
from mlxops.inventory import load_inventory
from mlxops.jobs import workloads
from mlxops.jobs.data import DataSpec
from mlxops.jobs.jobdirs import job_dir, list_jobs, record_path
from mlxops.jobs.placement import NodePaths, Rank
from mlxops.jobs.spec import JobSpec, RestartPolicy
from mlxops.jobs.workloads import Workload
from mlxops.node.protocol import FINISHED, RUNNING, STOPPED
from mlxops.notify import config as notify_config

#: JobSpec fields the record keeps as fields of its own; ``JobRecord.job`` holds the rest.
_SPEC_IN_RECORD = {"path": "job_file", "name": "name", "inventory": "inventory",
                   "backend": "backend", "restart": "restart", "stop_grace": "stop_grace"}
_SPEC_PATHS = ("workdir",)  # JobSpec fields that are Paths (kept as strings)


class JobStopped(MlxopsError):
    """``mlxops stop`` stopped the job after this record was read: the stop wins.

    ``record`` is the record that was not written (for a restart: the new attempt's, whose
    ranks the watchdog must now stop).
    """

    def __init__(self, record: JobRecord):
        super().__init__(f"job {record.name!r} was stopped (mlxops stop) meanwhile")
        self.record = record


@dataclass
class HostRecord:
    name: str
    root: str          # absolute mlxops_root on the node
    python: str        # absolute interpreter on the node

    def paths(self, job: str) -> NodePaths:
        return NodePaths(self.root, job)


@dataclass(frozen=True)
class SupervisorRecord:
    """The job's watchdog on a node (:mod:`mlxops.jobs.supervisor`): its host, its
    directory there (absolute) and how it was started (setsid, systemd or launchd)."""

    host: str
    dir: str
    method: str

    @classmethod
    def from_dict(cls, data: Any) -> SupervisorRecord:
        if not isinstance(data, dict) or not all(isinstance(data.get(f), str)
                                                 for f in ("host", "dir", "method")):
            raise ValueError(f"supervisor: not a mapping of host, dir and method: {data!r}")
        return cls(data["host"], data["dir"], data["method"])


@dataclass(frozen=True)
class Restart:
    """One restart by the watchdog: when, why, and the attempt it ended."""

    time: float        # seconds since the epoch
    reason: str        # the problem it restarted on ("rank 1 on mac2 exited with code 137")
    attempt: int       # the attempt that was stopped (the next one is attempt + 1)

    @classmethod
    def from_dict(cls, data: Any, where: str = "restart") -> Restart:
        """ValueError naming ``where`` and the field that is missing or of the wrong kind."""
        if not isinstance(data, dict):
            raise ValueError(f"{where}: not a mapping: {data!r}")
        for f, kind in (("time", (int, float)), ("reason", str), ("attempt", int)):
            if f not in data:
                raise ValueError(f"{where}: missing field {f!r}")
            if not isinstance(data[f], kind) or isinstance(data[f], bool):
                raise ValueError(f"{where}: field {f!r}: unexpected value {data[f]!r}")
        return cls(float(data["time"]), data["reason"], data["attempt"])


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
    restart: RestartPolicy = field(default_factory=RestartPolicy)  # the job's restart:
    stop_grace: float = 5.0
    # The rest of the job as launched (hosts pattern, workdir, env, port, ...): what a
    # restart needs. Launch always writes it; None only in a record built in memory without
    # one (the unit tests'), which job_spec() refuses. Its kind's section is moved into
    # `workload` when the record is made (__post_init__) and back on disk by to_dict.
    job: dict[str, Any] | None = None
    excluded: list[str] = field(default_factory=list)
    restarts: list[Restart] = field(default_factory=list)
    # Hosts left behind while unreachable (restart.exclude_unreachable): their ranks may
    # still run there; stop and the watchdog kill them once the host answers again.
    stray: list[HostRecord] = field(default_factory=list)
    created: float = field(default_factory=time.time)   # the job's, kept across attempts
    updated: float = field(default_factory=time.time)
    message: str = ""
    stopped_at: float | None = None        # the last `mlxops stop` (see the module doc)
    workload: Workload | None = None       # what the job runs, as launched (typed)
    fast_synch: bool = False               # its ranks run with MLX_METAL_FAST_SYNCH=1
    # The watchdog on a node that supervises the job; None: the controller does.
    supervisor: SupervisorRecord | None = None
    # Hosts whose ranks survived SIGKILL (a wedged GPU, kernel-held memory): only a reboot
    # frees them, so no attempt of this job is placed there again (restart, resume).
    needs_reboot: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.job is not None:
            found, self.job = workloads.from_record(self.job)
            self.workload = found or self.workload

    @property
    def world_size(self) -> int:
        return len(self.ranks)

    def host(self, name: str) -> HostRecord:
        return next(h for h in [*self.hosts, *self.stray] if h.name == name)

    def ranks_on(self, host: str) -> list[Rank]:
        return [r for r in self.ranks if r.host == host]

    def job_spec(self) -> JobSpec:
        """The job as it was launched."""
        if self.job is None:
            raise MlxopsError(f"{record_path(self.name)}: the record keeps no copy of the job "
                              "(key 'job')")
        if self.workload is None:
            raise MlxopsError(f"{record_path(self.name)}: the record keeps no workload of the "
                              f"job (one of {', '.join(workloads.KINDS)} in 'job')")
        rest = dict(self.job)
        for key in _SPEC_PATHS:
            if rest.get(key) is not None:
                rest[key] = Path(rest[key])
        # Each section back into the type the job file was parsed into (mlxops.jobs.spec).
        try:
            if rest.get("data") is not None:
                rest["data"] = DataSpec.from_dict(rest["data"])
            rest["notify"] = notify_config.parse_section(rest.get("notify"))
        except (ValueError, KeyError, TypeError) as exc:
            raise MlxopsError(f"{record_path(self.name)}: unreadable job record: "
                              f"{exc}") from None
        return JobSpec(path=Path(self.job_file), name=self.name, inventory=Path(self.inventory),
                       workload=self.workload, backend=self.backend, restart=self.restart,
                       stop_grace=self.stop_grace, **rest)

    def to_dict(self) -> dict[str, Any]:
        workload = self.workload
        self.workload = None    # not asdict()'s to copy: it goes under its kind's key
        try:
            data = asdict(self)
        finally:
            self.workload = workload
        del data["workload"]
        if data["job"] is not None and workload is not None:
            data["job"][workload.kind] = workload.to_record()
        data["ranks"] = [r.to_dict() for r in self.ranks]
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> JobRecord:
        data = dict(data)
        data["hosts"] = [HostRecord(**h) for h in data["hosts"]]
        data["stray"] = [HostRecord(**h) for h in data.get("stray", [])]
        data["ranks"] = [Rank(**r) for r in data["ranks"]]
        data["restarts"] = [Restart.from_dict(r, f"restarts[{i}]")
                            for i, r in enumerate(data.get("restarts", []))]
        data["restart"] = RestartPolicy(**data["restart"])
        if data.get("supervisor") is not None:
            data["supervisor"] = SupervisorRecord.from_dict(data["supervisor"])
        return cls(**data)

    def save(self) -> None:
        """Write this record as the job's, atomically, under the record lock.

        Refused with :class:`JobStopped` when ``mlxops stop`` stopped this job since this
        record (or the one it continues) was read: a stale writer must not undo a stop.
        A record of another launch of the name (``launch --fresh``) replaces it.
        """
        with _locked(self.name):
            current = _read(self.name)
            if current is not None and current.created == self.created \
                    and current.stopped_at != self.stopped_at:
                raise JobStopped(self)
            self._write()

    def _write(self) -> None:
        """Atomic: a temporary file beside it, renamed over it. The caller holds the lock."""
        self.updated = time.time()
        path = record_path(self.name)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".record.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w") as handle:
                handle.write(json.dumps(self.to_dict(), indent=1))
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise


def launched_job(spec: JobSpec) -> dict[str, Any]:
    """What a record keeps of a job (:attr:`JobRecord.job` on disk): every field the record
    has not already, the workload under its kind's key."""
    out: dict[str, Any] = {}
    for f in fields(JobSpec):
        if f.name not in _SPEC_IN_RECORD:
            value = getattr(spec, f.name)
            if isinstance(value, PurePath):
                value = str(value)
            elif isinstance(value, (DataSpec, notify_config.NotifySection)):
                value = value.to_dict()
            if isinstance(value, Workload):
                out[value.kind] = value.to_record()
            else:
                out[f.name] = value
    return json.loads(json.dumps(out))  # a copy, as it will read back


def _read(name: str) -> JobRecord | None:
    path = record_path(name)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise MlxopsError(f"{path}: unreadable job record: {exc}") from None
    try:
        return JobRecord.from_dict(data)
    except ValueError as exc:  # a field named by its reader
        raise MlxopsError(f"{path}: unreadable job record: {exc}") from None
    except (KeyError, TypeError, AttributeError) as exc:
        raise MlxopsError(f"{path}: unreadable job record: {type(exc).__name__}: {exc}"
                          ) from None


def load_record(name: str) -> JobRecord:
    record = _read(name)
    if record is None:
        known = ", ".join(list_jobs()) or "none"
        raise UserError(f"no job named {name!r} (known jobs: {known}); start one with "
                        "'mlxops launch JOB.yml'")
    return record


def update(name: str, change: Callable[[JobRecord], None]) -> JobRecord:
    """Read-modify-write the job's record under its lock; returns the record as written.

    ``change`` edits the current record in place; if it raises, nothing is written.
    """
    with _locked(name):
        record = load_record(name)
        change(record)
        record._write()
    return record


def mark_stopped(name: str) -> JobRecord:
    """The user's stop, recorded before any rank is signalled: STOPPED (a finished job stays
    finished) and ``stopped_at``, which no stale writer may overwrite."""
    def stop(record: JobRecord) -> None:
        if record.state != FINISHED:
            record.state = STOPPED
        record.stopped_at = time.time()

    return update(name, stop)


@contextmanager
def _locked(name: str) -> Iterator[None]:
    """The record lock: held only for one read-modify-write, never across SSH work.

    Not re-entrant (an flock per open file): nothing under it takes it again.
    """
    with exclusive(job_dir(name) / "record.lock"):
        yield


@contextmanager
def supervisor_lock(name: str) -> Iterator[bool]:
    """One watchdog per job: yields False when another process already supervises it."""
    with exclusive(job_dir(name) / "watch.lock", wait=False, note_pid=True) as held:
        yield held


def inventory_hosts(record: JobRecord) -> dict:
    """The job's hosts as the inventory describes them now (for connecting)."""
    inventory = load_inventory(record.inventory)
    missing = [h.name for h in record.hosts if h.name not in inventory.hosts]
    if missing:
        raise UserError(f"{record.inventory}: host {missing[0]!r} of job {record.name!r} is no "
                        "longer in the inventory")
    hosts = {h.name: inventory.hosts[h.name] for h in [*record.hosts, *record.stray]
             if h.name in inventory.hosts}
    for host in hosts.values():
        host.check_local_files()  # a key file gone since launch: exit 2, not 3 per host
    return hosts

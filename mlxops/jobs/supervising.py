"""The controller's side of a job supervised on a node: check, ship, start, ask, stop, fetch.

The rules are :mod:`mlxops.jobs.supervisor`'s; this module carries them out over SSH.

- Before any rank starts (:func:`prepare`): the supervisor host answers, has the venv the
  ``supervisor`` provision task makes (every module the controller's code imports), and a
  way to run detached (launchd, systemd, setsid). Else one line, nothing started.
- Once the ranks run (:func:`start`): one archive to ``<mlxops_root>/supervisor``: the
  controller's own ``mlxops`` package (``lib/``: the watchdog's code, not a copy of it),
  the job's record and timeline (``home/jobs/NAME/``), the inventory as that host must read
  it (``jobs/NAME/inventory.yml``: its own key, :data:`~mlxops.jobs.supervisor.KEY_FILE`, and
  ``known_hosts`` holding the keys this controller verified for the job's hosts), then the
  detached start; it is started once its lease is held.
- The supervisor's files are the job's truth while it supervises: :func:`fetch` copies its
  job directory (record, timeline, metrics mirror) back into the controller's before a
  command reads it; the record keeps the controller's inventory path and ``supervisor``.
"""

from __future__ import annotations

import base64
import io
import json
import os
import posixpath
import tarfile
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import yaml

from mlxops import events, paths, shell
from mlxops.errors import MlxopsError, UserError
from mlxops.inventory import load_inventory
from mlxops.jobs import supervisor as rules
from mlxops.jobs.jobdirs import job_dir
from mlxops.jobs.record import JobRecord, SupervisorRecord, load_record, update
from mlxops.jobs.spec import JobSpec
from mlxops.node.protocol import FAILED
from mlxops.transport import Connector, HostUnreachable

START_WAIT = 30.0   # seconds for a started watchdog to take its lease
#: Host variables that are controller paths: the supervisor's copy sets its own or none.
_LOCAL_PATHS = ("ansible_ssh_private_key_file", "mlxops_known_hosts", "mlxops_wheelhouse")


@dataclass(frozen=True)
class Lease:
    """Who holds a job's supervisor lease on its host (``reachable`` False: not known)."""

    host: str
    held: bool
    pid: int | None
    reachable: bool = True
    reason: str = ""

    def line(self) -> str:
        if not self.reachable:
            return f"supervised by {self.host}: not known ({self.reason})"
        if self.held:
            return f"supervised by {self.host} (pid {self.pid})"
        return f"supervisor on {self.host} is not running"


def _check_command(host: Any) -> str:
    d = shell.path_word(f"{host.root.rstrip('/')}/{rules.SITE_DIR}")
    imports = ",".join(rules.IMPORTS)
    python = shell.quote(rules.Site("", ".", "").python)
    return (f"mkdir -p {d} && cd {d} && pwd && ({rules.METHOD_COMMAND}) && "
            f"if [ -x {python} ] && {python} -c 'import {imports}' "
            ">/dev/null 2>&1; then echo env-ok; else echo env-missing; fi")


def prepare(spec: JobSpec, hosts: list, connector: Connector) -> SupervisorRecord | None:
    """The job's supervisor site, checked; None when the controller supervises.
    Raises (one line, before any rank starts) on bad input or a host not ready."""
    inventory = load_inventory(spec.inventory)
    host = rules.supervisor_of(spec.path, spec.supervisor, hosts, inventory)
    if host is None:
        return None
    if spec.workdir is not None:
        raise UserError(f"{spec.path}: supervisor: a job with workdir: is supervised by the "
                        "controller only (the supervisor host has no copy of the workdir)")
    host.check_local_files()
    try:
        done = connector.connect(host).run(_check_command(host), timeout=60)
    except HostUnreachable as exc:
        raise MlxopsError(f"supervisor {host.name}: unreachable: {exc.reason}") from None
    lines = done.stdout.split()
    if not done.ok or len(lines) != 3:
        raise MlxopsError(f"supervisor {host.name}: {done.error_line()}")
    where, method, env = lines
    if env != "env-ok":
        raise MlxopsError(f"supervisor {host.name}: no mlxops node environment for the "
                          f"supervisor in {where}/venv (needs {', '.join(rules.IMPORTS)}): "
                          "run 'mlxops provision INVENTORY --tags supervisor'")
    if method not in rules.METHODS:
        raise MlxopsError(f"supervisor {host.name}: no way to run it detached (launchd, "
                          "systemd-run or setsid)")
    return SupervisorRecord(host.name, where, method)


def site(record: JobRecord) -> rules.Site:
    assert record.supervisor is not None
    return rules.Site(record.supervisor.host, record.supervisor.dir, record.name)


def _host(record: JobRecord) -> Any:
    assert record.supervisor is not None
    inventory = load_inventory(record.inventory)
    if record.supervisor.host not in inventory.hosts:
        raise UserError(f"{record.inventory}: supervisor {record.supervisor.host!r} of job "
                        f"{record.name!r} is no longer in the inventory")
    return inventory.hosts[record.supervisor.host]


def supervisor_inventory(inventory: Any, where: rules.Site) -> str:
    """The inventory as the supervisor host reads it: every host with its resolved
    variables, its groups as flat groups (the job's host pattern selects the same hosts),
    what all hosts share under ``all: vars`` (``mlxops_ring_order`` must be there), the
    supervisor's own key and known_hosts instead of the controller's paths."""
    hosts = list(inventory.hosts.values())
    own = {"ansible_ssh_private_key_file": rules.KEY_FILE,
           "mlxops_known_hosts": where.known_hosts}
    resolved = []
    for host in hosts:
        values = {k: v for k, v in host.vars.items() if k not in _LOCAL_PATHS}
        resolved.append({**values, **own})
    shared = {k: v for k, v in resolved[0].items() if all(r.get(k) == v for r in resolved)}
    groups: dict[str, list[str]] = {}
    for host in hosts:
        for group in host.groups:
            if group != "ungrouped":
                groups.setdefault(group, []).append(host.name)
    doc = {"all": {
        "vars": shared,
        "hosts": {h.name: ({k: v for k, v in r.items() if k not in shared} or None)
                  for h, r in zip(hosts, resolved, strict=True)},
        "children": {g: {"hosts": {n: None for n in names}} for g, names in groups.items()},
    }}
    if not groups:
        del doc["all"]["children"]
    return yaml.safe_dump(json.loads(json.dumps(doc)), sort_keys=False)


def _known_hosts(record: JobRecord, connector: Connector, hosts: list) -> str:
    """The keys this controller verified for each host, as the supervisor names them."""
    entries = []
    for host in hosts:
        conn = connector.connect(host)
        name = conn.host_key_name
        entries += [(name, kind, key.get_base64())
                    for kind, key in conn.known_hosts.keys_for(name).items()]
    return rules.known_hosts_lines(entries)


def _package_files() -> dict[str, Path]:
    """The controller's mlxops package (and its data directories when they sit beside it,
    in a checkout), by their names under the job's ``lib/``."""
    package = Path(rules.__file__).resolve().parents[1]
    out: dict[str, Path] = {}
    tops = [(package, "mlxops")]
    for data in (paths.templates_dir(), paths.playbooks_dir()):
        if package not in data.parents:
            tops.append((data, data.name))
    for top, name in tops:
        for path in sorted(top.rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc":
                out[f"{name}/{path.relative_to(top)}"] = path
    return out


def start(record: JobRecord, connector: Connector, where: SupervisorRecord) -> JobRecord:
    """Ship what the supervisor needs and start it detached; the record, which now names
    it, once its lease is held. Raises with the supervisor's log when it does not start."""
    record = update(record.name, lambda current: setattr(current, "supervisor", where))
    spot = site(record)
    host = _host(record)
    inventory = load_inventory(record.inventory)
    reach = [inventory.hosts[h.name] for h in [*record.hosts, *record.stray]
             if h.name in inventory.hosts]
    if host.name not in {h.name for h in reach}:
        reach.append(host)
    theirs = replace(record, inventory=spot.inventory)
    files = {
        f"jobs/{record.name}/inventory.yml": supervisor_inventory(inventory, spot).encode(),
        "known_hosts": _known_hosts(record, connector, reach).encode(),
        f"home/jobs/{record.name}/record.json": json.dumps(theirs.to_dict(), indent=1).encode(),
    }
    timeline = events.path(record.name)
    if timeline.is_file():
        files[f"home/jobs/{record.name}/{timeline.name}"] = timeline.read_bytes()
    lib = posixpath.relpath(spot.lib, spot.dir)
    entries = [*(_entry(f"{lib}/{n}", p) for n, p in _package_files().items()),
               *(_entry(n, data) for n, data in files.items())]
    d = shell.quote(spot.dir)
    conn = connector.connect(host)
    done = conn.run(f"umask 077; mkdir -p {d} && rm -rf {shell.quote(spot.lib)} && "
                    f"tar -xf - -C {d}", stdin=_tar(entries), timeout=120)
    if not done.ok:
        raise MlxopsError(f"supervisor {host.name}: shipping it: {done.error_line()}")
    done = conn.run(rules.start_command(spot, where.method),
                    stdin=rules.start_stdin(spot, where.method), timeout=60)
    if not done.ok:
        raise MlxopsError(f"supervisor {host.name}: starting it: {done.error_line()}")
    deadline = time.monotonic() + START_WAIT
    while not (seen := lease(record, connector)).held:
        if time.monotonic() > deadline:
            tail = conn.run(shell.join(["tail", "-n", "5", spot.log]), timeout=30).stdout
            raise MlxopsError(f"supervisor {host.name}: did not start within {START_WAIT:.0f}s"
                              f" ({seen.reason or 'no lease'}); its log: {tail.strip()!r}")
        time.sleep(0.5)
    return record


def _entry(name: str, data: bytes | Path) -> Any:
    from mlxops.archive import Entry

    return Entry(name, data, 0o600 if isinstance(data, bytes) else None)


def _tar(entries: list) -> bytes:
    from mlxops.archive import write_bytes

    return write_bytes(entries)


def lease(record: JobRecord, connector: Connector) -> Lease:
    """Who holds the job's lease on its supervisor host, asked now."""
    assert record.supervisor is not None
    name = record.supervisor.host
    try:
        host = _host(record)
        done = connector.connect(host).run(
            (rules.lease_command(host.python, site(record))), timeout=60)
    except HostUnreachable as exc:
        return Lease(name, False, None, reachable=False, reason=exc.reason)
    if not done.ok:
        return Lease(name, False, None, reachable=False, reason=done.error_line())
    answer = json.loads(done.stdout.strip().splitlines()[-1])
    return Lease(name, bool(answer["held"]), answer["pid"])


def stop(record: JobRecord, connector: Connector, grace: float = 10.0) -> Lease:
    """End the job's supervisor (its service manager first, then the lease's holder);
    the lease as it is afterwards (not held, unless it could not be stopped)."""
    host = _host(record)
    done = connector.connect(host).run(
        (rules.stop_command(host.python, site(record),
                                          record.supervisor.method, grace)),
        timeout=grace + 60)
    if not done.ok:
        raise MlxopsError(f"supervisor {host.name}: stopping it: {done.error_line()}")
    answer = json.loads(done.stdout.strip().splitlines()[-1])
    return Lease(host.name, bool(answer["held"]), answer["pid"])


def fetch(record: JobRecord, connector: Connector) -> JobRecord:
    """Copy the supervisor's job directory into the controller's; the record as it is
    now (the controller's, unchanged, when the supervisor host cannot be reached)."""
    if record.supervisor is None:
        return record
    spot = site(record)
    try:
        done = connector.connect(_host(record)).run((
            f"cd {shell.quote(spot.job_dir)} && tar -cf - --exclude '*.lock' . | base64"),
            timeout=120)
    except HostUnreachable:
        return record
    if not done.ok:
        return record
    return _take(record, base64.b64decode("".join(done.stdout.split())))  # text on the wire


def _take(record: JobRecord, archive: bytes) -> JobRecord:
    """Install the fetched files: the record under its lock (keeping the controller's
    inventory, job file and supervisor), the rest each replaced atomically."""
    local = job_dir(record.name)
    theirs: dict[str, Any] | None = None
    with tempfile.TemporaryDirectory(dir=local) as tmp, \
            tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(tmp, filter="data")
        for path in Path(tmp).iterdir():
            if not path.is_file() or path.name.endswith(".lock"):
                continue
            if path.name == "record.json":
                theirs = json.loads(path.read_text())
            else:
                os.replace(path, local / path.name)
    if theirs is None:
        return load_record(record.name)

    def take(current: JobRecord) -> None:
        if theirs.get("created") != current.created:
            return  # another launch of the name: not this record's
        keep = {"inventory": current.inventory, "job_file": current.job_file,
                "supervisor": current.supervisor, "stopped_at": current.stopped_at,
                "state": current.state}
        fresh = JobRecord.from_dict(theirs)
        vars(current).update(vars(fresh))
        current.inventory, current.job_file = keep["inventory"], keep["job_file"]
        current.supervisor = keep["supervisor"]
        if keep["stopped_at"] is not None and (fresh.stopped_at or 0) < keep["stopped_at"]:
            # A user's stop recorded here after the supervisor last wrote: it stands.
            current.stopped_at, current.state = keep["stopped_at"], keep["state"]

    return update(record.name, take)


def launch_job(spec: JobSpec, connector: Connector, *, on_started: Any = lambda _: None,
               **options: Any) -> JobRecord:
    """:func:`mlxops.jobs.launch.launch`, with the job's supervisor checked before and
    started after (``on_started`` hears the record in between: the timeline's event goes
    with the record the supervisor gets). A supervisor that does not start leaves nothing
    of the job running (its ranks are stopped, the job failed)."""
    from mlxops.jobs.launch import launch
    from mlxops.jobs.selection import select_hosts
    from mlxops.jobs.stop import stop_job

    where = prepare(spec, select_hosts(spec, options.get("exclude", ())), connector)
    record = launch(spec, connector, **options)
    on_started(record)
    if where is None:
        if record.supervisor is not None:  # resumed under the controller's supervision
            record = update(record.name, lambda current: setattr(current, "supervisor", None))
        return record
    try:
        return start(record, connector, where)
    except MlxopsError:
        stop_job(record, connector, grace=1.0, mark_stopped=False)
        update(record.name, lambda current: setattr(current, "state", FAILED))
        raise


def retire(record: JobRecord, connector: Connector) -> JobRecord:
    """Before a resume or a stop: the supervisor's files fetched, then the supervisor
    stopped (so it restarts nothing meanwhile), then fetched again (its last words)."""
    if record.supervisor is None:
        return record
    record = fetch(record, connector)
    left = stop(record, connector)
    if left.held:
        raise MlxopsError(f"supervisor {left.host}: pid {left.pid} survived SIGKILL")
    return fetch(record, connector)

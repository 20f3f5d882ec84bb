"""Helpers shared by the job integration tests: node-side run files, records, metrics."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import yaml

from mlxops import shell
from mlxops.errors import UserError
from mlxops.inventory import variables
from mlxops.jobs.logs import fetch, prefixed
from mlxops.jobs.record import JobRecord, inventory_hosts, load_record
from mlxops.jobs.status import JobStatus, job_status
from mlxops.jobs.watch import supervise
from mlxops.monitor.mirror import Feeder
from mlxops.node import protocol
from mlxops.node.protocol import RUNNING, STALLED
from mlxops.node.protocol.metrics import read_lines
from mlxops.transport import run_parallel


def run_dir(sandbox, node: str, name: str) -> Path:
    """The job's run directory on a node, as this machine sees it: ``runs/<name>`` under
    the default ``mlxops_root`` (the sandbox inventory sets none), both spelt by the code
    that places it (the inventory's variable, the node protocol's layout)."""
    root = variables.default("mlxops_root")
    assert root.startswith("~/"), root  # the node's home, as the sandbox mounts it
    return Path(sandbox.node_home(node)) / root[2:] / protocol.run_path(name)


def inventory_with_slots(sandbox, tmp_path: Path, slots: dict[str, int]) -> Path:
    """The sandbox inventory with ``mlxops_slots`` set on some nodes, written to tmp_path."""
    doc = yaml.safe_load(sandbox.inventory_path.read_text())
    for node, n in slots.items():
        doc["all"]["children"]["sandbox"]["hosts"][node]["mlxops_slots"] = n
    path = tmp_path / "inventory.yml"
    path.write_text(yaml.safe_dump(doc))
    return path


def losses(sandbox, name: str) -> dict[int, float]:
    """step -> loss from rank 0's metrics (node1); a re-done step keeps its last value."""
    text = (run_dir(sandbox, "node1", name) / protocol.METRICS).read_text()
    return {rec.step: rec.loss for rec in read_lines(text)}


def heartbeat_steps(record: JobRecord, connector) -> int | None:
    """The lowest step the ranks' heartbeats (``progress/rank-<r>.json``) name, read with
    one ``cat`` a host: no Python on the nodes. None while a rank has written none (or a
    host did not answer). A heartbeat of an attempt before is read too: a caller confirms
    with a ``status``, which leaves those out."""
    hosts = inventory_hosts(record)

    def work(host) -> list[int | None]:
        paths = record.host(host.name).paths(record.name)
        files = [paths.run_file(protocol.progress_file(r.rank))
                 for r in record.ranks_on(host.name)]
        got = connector.connect(host).run(
            "; ".join(f"{{ cat {shell.quote(f)} 2>/dev/null; echo; }}" for f in files),
            timeout=30)
        steps = []
        for line in got.stdout.splitlines()[:len(files)]:
            try:
                steps.append(protocol.Progress.from_dict(json.loads(line)).step)
            except (ValueError, TypeError, KeyError, protocol.ProtocolError):
                steps.append(None)
        return steps + [None] * (len(files) - len(steps))

    results = run_parallel([hosts[h.name] for h in record.hosts], work)
    answered = results.succeeded_values()
    steps = [s for h in record.hosts for s in answered.get(h.name, [None])]
    return None if None in steps else min(steps)


#: Every this many looks, wait_for_step asks the nodes' ``status`` (a job that ended).
STATUS_EVERY = 5


def wait_for_step(record, connector, step: int, timeout: float = 90) -> None:
    """Until every rank reached ``step``; a job that ended first fails with its logs.

    A look every second, most of them the heartbeats alone (:func:`heartbeat_steps`, a
    ``cat`` on each host); every :data:`STATUS_EVERY`-th look, and once the heartbeats say
    ``step``, a ``status`` on every host (a Python start on each node, on this machine's
    cores where the ranks train), which says whether the job still runs and leaves an
    attempt's old heartbeats out. Status alone at every look had been a large share of
    the suite's node commands."""
    deadline = time.monotonic() + timeout
    looks = 0
    while time.monotonic() < deadline:
        looks += 1
        ask = looks % STATUS_EVERY == 1
        if not ask:
            seen = heartbeat_steps(record, connector)
            ask = seen is not None and seen >= step
        if ask:
            status = job_status(record, connector)
            if status.state not in (RUNNING, STALLED):
                logs = "\n".join(prefixed(fetch(record, connector, {})))
                raise AssertionError(f"{status.to_dict()}\n{logs[-3000:]}")
            if (status.step or 0) >= step:
                return
        time.sleep(1.0)
    raise AssertionError(f"job {record.name} did not reach step {step}")


def wait_for_record(name: str, timeout: float = 60) -> JobRecord:
    """The job's record, once a launch in another process has written it."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return load_record(name)
        except UserError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


class BackgroundWatchdog:
    """``supervise`` in a thread, as a `mlxops watch` beside the test would run it."""

    def __init__(self, record: JobRecord, connector, feed_interval: float | None = None
                 ) -> None:
        self.events: list[str] = []
        self.times: list[float] = []  # time.monotonic() of each event, for reports
        self._outcome: dict = {}
        # as `mlxops watch` feeds the mirror; a test that waits for the feeds may ask
        # for them sooner than every Feeder.INTERVAL seconds
        self._feed_interval = feed_interval
        self._thread = threading.Thread(target=self._run, args=(record, connector), daemon=True)
        self._thread.start()

    def _run(self, record: JobRecord, connector) -> None:
        try:
            feeder = Feeder(record.name, connector) if self._feed_interval is None \
                else Feeder(record.name, connector, interval=self._feed_interval)
            self._outcome["status"] = supervise(record, connector, on_status=feeder.on_status,
                                                on_event=self._event)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the test's thread
            self._outcome["error"] = exc

    def _event(self, text: str) -> None:
        self.times.append(time.monotonic())
        self.events.append(text)

    def result(self, timeout: float) -> JobStatus:
        """The watchdog's final status; its exception, if it raised one."""
        self._thread.join(timeout=timeout)
        if self._thread.is_alive():
            raise AssertionError(f"the watchdog still runs after {timeout}s: {self.events}")
        if "error" in self._outcome:
            raise self._outcome["error"]
        return self._outcome["status"]


class Hold:
    """A job held at a step on every node, however fast or slow the machine is: the
    trainer's ``MLXOPS_TRAINER_HOLD`` hook (mlxops/trainer/hooks.py), whose file is
    ``~/.hold-<name>`` in each node's home. Put :attr:`env` in the job's ``env:``;
    :meth:`at` holds the ranks after that step (held ranks go on to it), :meth:`release`
    lets them run to the end. A context manager: released on exit, however the test ends.

    A test that acts on a running job (stop it, kill a rank, put a node to sleep) holds it
    first, where a step count "that will not be reached yet" raced the machine's speed."""

    def __init__(self, sandbox, name: str, hosts: str | list[str], at: int | None = None):
        self._sandbox = sandbox
        self._rel = f".hold-{name}"
        self._hosts = hosts.split(",") if isinstance(hosts, str) else list(hosts)
        self.env = {"MLXOPS_TRAINER_HOLD": f"~/{self._rel}"}
        if at is not None:
            self.at(at)

    def at(self, step: int) -> None:
        for node in self._hosts:
            path = Path(self._sandbox.node_home(node)) / self._rel
            tmp = path.with_name(path.name + ".tmp")
            tmp.write_text(f"{step}\n")
            tmp.chmod(0o644)
            tmp.replace(path)  # whole: a rank never reads half a number

    def release(self) -> None:
        for node in self._hosts:
            (Path(self._sandbox.node_home(node)) / self._rel).unlink(missing_ok=True)

    def __enter__(self) -> Hold:
        return self

    def __exit__(self, *exc) -> None:
        self.release()

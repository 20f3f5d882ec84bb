"""Feeding the metrics mirror: one ``sample`` round trip per host of a job, in parallel.

Fed while a job is followed or watched (the watchdog's loop, :class:`Feeder`), and on
demand (``mlxops monitor``, the dashboard, ``mlxops report --refresh``). ``monitor``,
``dashboard`` and ``report`` read only the mirror, so they keep working once the cluster is
gone. Its files: :mod:`mlxops.monitor.files`.

Rank 0's ``metrics.jsonl`` is tailed by byte offset. The trainer rewrites it when it
resumes (dropping the steps it will redo), and a restart without a host may move rank 0
to another node whose file starts at the resumed step: either way the node's file is read
again from 0 and the mirror keeps its own lines before the first step of the new file
(:func:`merge_reset`). A new launch of the same name (``launch --fresh``) starts the
mirror over.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from mlxops import events
from mlxops.filelock import exclusive
from mlxops.jobs.record import JobRecord, inventory_hosts, load_record
from mlxops.jobs.status import JobStatus, classify
from mlxops.monitor import alerts, files
from mlxops.monitor.data import Mirror, MirrorReader, columns
from mlxops.monitor.files import METRICS, SAMPLES, MirrorState
from mlxops.monitor.plateau import PlateauEvents
from mlxops.node import protocol
from mlxops.node.protocol import ENDED_STATES
from mlxops.node.protocol.metrics import SERIES, step_of
from mlxops.transport import Connector, Results, nodecmd, run_parallel

INTERVAL = 5.0                 # seconds between the watchdog's feeds (a problem feeds at once)
SAMPLES_MAX_BYTES = 16 << 20   # then the older samples are thinned (:func:`thin`)


@contextmanager
def _feeding(name: str) -> Iterator[bool]:
    """One feeder per job at a time; yields False when another one is at it now."""
    with exclusive(files.path(name, files.LOCK), wait=False) as held:
        yield held


def merge_reset(kept: str, fresh: str) -> str:
    """The mirror's metrics after the node's file was read again from 0: the mirror's own
    lines before the first step of ``fresh`` (none when ``fresh`` starts at the first
    step), then ``fresh``."""
    new = files.parse_lines(fresh)
    first = step_of(new[0]) if new else None
    if first is None:
        return kept if not fresh.strip() else fresh
    before = [line for line in kept.splitlines(keepends=True)
              if _step(line) is not None and _step(line) < first]
    return "".join(before) + fresh


def _step(line: str) -> int | None:
    try:
        doc = json.loads(line)
    except ValueError:
        return None
    return step_of(doc) if isinstance(doc, dict) else None


def thin(target: Path, max_bytes: int = SAMPLES_MAX_BYTES) -> bool:
    """Keep a long run's samples bounded: past ``max_bytes``, every second line of the
    older three quarters goes (the recent quarter stays whole). True when it thinned."""
    try:
        if target.stat().st_size <= max_bytes:
            return False
        lines = target.read_text().splitlines(keepends=True)
    except OSError:
        return False
    cut = len(lines) * 3 // 4
    files.write_atomic(target, "".join(lines[:cut:2] + lines[cut:]))
    return True


def _rank0_host(record: JobRecord) -> str | None:
    zero = next((r for r in record.ranks if r.rank == 0), None)
    return zero.host if zero else None


def _node_figures(answer: protocol.SampleAnswer) -> dict[str, Any]:
    gpu = answer.gpu.to_dict() if answer.gpu else None
    return {"memory_used": answer.memory_used, "memory_total": answer.memory_total,
            "load": answer.load, "cpus": answer.cpus, "gpu": gpu}


def sample_line(status: JobStatus, nodes: dict[str, dict[str, Any]], now: float
                ) -> dict[str, Any]:
    """One line of ``samples.jsonl``."""
    ranks = [{"rank": r.rank, "host": r.host, "state": r.state, "step": r.step,
              "loss": r.loss, "tokens_per_sec": r.tokens_per_sec,
              "heartbeat_age": None if r.heartbeat_age is None else round(r.heartbeat_age, 2)}
             for r in status.ranks]
    line = {"time": round(now, 3), "state": status.state, "attempt": status.attempt,
            "step": status.step, "ranks": ranks, "nodes": nodes}
    return line | status.live()  # a probed job's figures (jobs/serveprobe.py)


def feed(record: JobRecord, connector: Connector, *, status: JobStatus | None = None,
         hosts: dict[str, Any] | None = None) -> Results | None:
    """Look at the job's hosts once and add what they say to the mirror. ``status``: the
    job's status just polled (the watchdog's), else the nodes' answers give it.

    Returns each host's result (a host that does not answer is recorded as such in the
    mirror too); None when another process was feeding this mirror at that moment (nothing
    done). Only a bug raises.
    """
    with _feeding(record.name) as held:
        if not held:
            return None
        return _feed(record, connector, status, hosts or inventory_hosts(record))


def _feed(record: JobRecord, connector: Connector, status: JobStatus | None,
          hosts: dict[str, Any]) -> Results:
    name = record.name
    state = files.read_state(name)
    if state.created != record.created:
        # Another launch of this name (or the first feed): start the mirror over.
        for file in (METRICS, SAMPLES):
            files.path(name, file).unlink(missing_ok=True)
        state = MirrorState(created=record.created, generation=state.generation + 1)
    tail_host = _rank0_host(record)
    moved = tail_host != state.host

    def work(host) -> protocol.SampleAnswer:
        h = record.host(host.name)
        paths = h.paths(name)
        tails_metrics = host.name == tail_host
        args = protocol.sample_args(
            paths.run_dir, status=status is None,
            metrics_from=(0 if moved else state.offset) if tails_metrics else None,
            metrics_inode=None if moved or not tails_metrics else state.inode)
        return nodecmd.run_node(connector.connect(host), h.python, paths.code, args, timeout=30)

    results = run_parallel([hosts[h.name] for h in record.hosts if h.name in hosts], work)
    answers = results.succeeded_values()
    failed = {host: r.message for host, r in results.items() if not r.succeeded}
    if status is None:
        status = classify(record, {h: a.status for h, a in answers.items() if a.status},
                          failed)
    chunk = answers[tail_host].metrics if tail_host in answers else None
    metrics = files.path(name, METRICS)
    if chunk is not None:
        if chunk.reset or moved:
            old = metrics.read_text() if metrics.exists() else ""
            files.write_atomic(metrics, merge_reset(old, chunk.text))
            state.generation += 1
        else:
            files.append_lines(metrics, chunk.text)
        state.host, state.offset, state.inode = tail_host, chunk.offset, chunk.inode
    nodes: dict[str, dict[str, Any]] = {h: _node_figures(a) for h, a in answers.items()}
    nodes.update({h: {"error": why} for h, why in failed.items()})
    now = time.time()
    samples = files.path(name, SAMPLES)
    files.append_lines(samples, json.dumps(sample_line(status, nodes, now)) + "\n")
    thin(samples)
    state.updated = now
    files.write_state(name, state)
    return results


class Feeder:
    """The watchdog's feeds: at most every ``interval`` seconds, and at once when the job
    ended or has a problem (the last lines before a restart or the end are kept).

    :meth:`on_status` is the watchdog's status hook (``supervise(on_status=...)``): the
    watchdog knows nothing of the monitor, whoever starts it passes the feeder in. A feed
    runs in a thread of its own: it asks every host, and a host that does not answer (a
    Mac asleep) costs a timeout the watchdog must not wait for, least of all when it has
    a problem to act on. Only the feed at the end of the job (finished, stopped) waits for
    one under way and runs in the watchdog's thread; whoever ends the watchdog otherwise
    calls :meth:`wait` for the last one.
    """

    def __init__(self, name: str, connector: Connector, interval: float = INTERVAL) -> None:
        self.name = name
        self.connector = connector
        self.interval = interval
        self._last = 0.0
        self._hosts: dict[str, Any] | None = None
        self._alerts = AlertEvents(name)
        self._plateau = PlateauEvents(name)
        self._thread: threading.Thread | None = None
        self._bug: BaseException | None = None

    def _due(self, status: JobStatus) -> bool:
        now = time.monotonic()
        urgent = status.state in ENDED_STATES or status.problem is not None
        if not urgent and now - self._last < self.interval:
            return False
        self._last = now
        return True

    def on_status(self, status: JobStatus) -> None:
        """Feed from the status the watchdog just polled, with the job's record as it
        is now (a restart rewrites it) and its hosts as the inventory had them at the
        first feed (as the watchdog connects to them)."""
        if self._bug is not None:
            raise self._bug
        if not self._due(status):
            return
        at_end = status.state in ENDED_STATES and status.problem is None
        busy = self._thread is not None and self._thread.is_alive()
        if busy and not at_end:
            return  # the last one is still at it (the same lines): this one is left out
        if at_end:
            self.wait()
            self._feed(status)
            return
        self._thread = threading.Thread(target=self._feed_quietly, args=(status,),
                                        daemon=True, name=f"mlxops-feed-{self.name}")
        self._thread.start()

    def wait(self) -> None:
        """Until the feed under way is done; a bug it met is raised here."""
        if self._thread is not None:
            self._thread.join()
        if self._bug is not None:
            raise self._bug

    def _feed(self, status: JobStatus) -> None:
        record = load_record(self.name)
        if self._hosts is None:
            self._hosts = inventory_hosts(record)
        if feed(record, self.connector, status=status, hosts=self._hosts) is not None:
            mirror = self._alerts.look(record)
            self._plateau.look(mirror.metrics, record.workload, record.attempt)

    def _feed_quietly(self, status: JobStatus) -> None:
        try:
            self._feed(status)
        except Exception as exc:  # noqa: BLE001 - raised in the watchdog's thread, next call
            self._bug = exc


class AlertEvents:
    """Puts an ``alert`` event on the job's timeline when one of its alerts appears: once
    per alert (its kind, host and rank) while it lasts; one that clears and comes back is
    a new event. What is an alert is :func:`mlxops.monitor.alerts.evaluate`'s, as the
    monitor, the dashboard and the report show it."""

    def __init__(self, name: str) -> None:
        self._mirror = MirrorReader(name)
        self._active: set[tuple[Any, ...]] = set()

    def look(self, record: JobRecord) -> Mirror:
        """Read the mirror, put its new alerts on the timeline; the mirror as read."""
        mirror = self._mirror.read()
        last = mirror.samples[-1] if mirror.samples else None
        cols = columns(mirror.metrics, SERIES)
        limits = alerts.thresholds(record.job, record.workload)
        found = alerts.evaluate(limits, last, cols["tokens_per_sec"], cols)
        now = {(a["kind"], a.get("host"), a.get("rank")): a for a in found}
        new = [a for key, a in now.items() if key not in self._active]
        self._active = set(now)
        for alert in new:
            events.record(record.name, events.ALERT, alert["message"], attempt=record.attempt,
                          alert=alert["kind"], host=alert.get("host"), rank=alert.get("rank"))
        return mirror

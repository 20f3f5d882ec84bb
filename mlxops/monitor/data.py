"""A job's mirror as one document: what ``mlxops report --json`` prints, what the report
and the dashboard draw, what the terminal monitor shows (docs/formats.md,
"mlxops report --json").

Series are columns (``{"step": [...], "loss": [...]}``): compact in a page, and every
chart reads them the same way. :func:`decimate` thins them for a page; ``--json`` keeps
every line.
"""

from __future__ import annotations

import bisect
import itertools
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from mlxops import events
from mlxops.events import Event
from mlxops.jobs.record import JobRecord, load_record
from mlxops.jobs.workloads import KINDS, Workload
from mlxops.monitor import alerts, files
from mlxops.monitor.files import METRICS, SAMPLES, JsonlTail, MirrorState
from mlxops.node.protocol import ENDED_STATES
from mlxops.node.protocol.metrics import SERIES, MetricsLine, read_lines

SPLIT_LINES = 20   # the compute / all-reduce split is of the last lines: how the run goes now


@dataclass
class Mirror:
    """A job's mirror as read now."""

    record: JobRecord
    metrics: list[MetricsLine]
    samples: list[dict[str, Any]]
    state: MirrorState
    events: list[Event] = field(default_factory=list)   # the job's timeline (mlxops.events)


class MirrorReader:
    """Reads a job's mirror again and again, parsing only what was added (the dashboard's
    and the live monitor's polls)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._metrics = JsonlTail(files.path(name, METRICS), read_lines)
        self._samples = JsonlTail(files.path(name, SAMPLES))

    def read(self) -> Mirror:
        record = load_record(self.name)
        state = files.read_state(self.name)
        if state.created is not None and state.created != record.created:
            # A new launch of the name that nothing fed yet: the files are the old run's.
            return Mirror(record, [], [], MirrorState(), events.read(self.name))
        return Mirror(record, self._metrics.read(), self._samples.read(), state,
                      events.read(self.name))


def columns(lines: Sequence[MetricsLine], names: Sequence[str]) -> dict[str, list[Any]]:
    return {n: [getattr(line, n) for line in lines] for n in names}


def decimate(cols: dict[str, list[Any]], points: int | None,
             always: str | None = None) -> dict[str, list[Any]]:
    """At most ``points`` rows, evenly spread, the first and the last always kept; and
    every row whose ``always`` column has a value (the sparse validation losses, which an
    even spread would mostly drop)."""
    n = len(next(iter(cols.values()), []))
    if not points or n <= max(2, points):
        return cols
    points = max(2, points)
    keep = sorted({round(i * (n - 1) / (points - 1)) for i in range(points)}
                  | {i for i, v in enumerate(cols.get(always) or []) if v is not None})
    return {k: [v[i] for i in keep] for k, v in cols.items()}


def _numbers(values: Sequence[Any]) -> list[float]:
    return [v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]


def _state(record: JobRecord, last: dict[str, Any] | None) -> str:
    """The record's word when it says the job ended (a stop, the watchdog's verdict), else
    the last look's."""
    if record.state in ENDED_STATES or not last:
        return record.state
    return last.get("state") or record.state


def step_at(metrics: Sequence[MetricsLine]) -> Callable[[float], int | None]:
    """``when -> the highest step logged at or before it`` (None before the first line):
    where something that happened at ``when`` sits on the curves."""
    times = [m.time for m in metrics]
    best: list[int] = list(itertools.accumulate((m.step for m in metrics), max))
    if times != sorted(times):  # lines out of time order (clocks moved): read them all
        return lambda when: max((m.step for m in metrics if m.time <= when), default=None)
    return lambda when: best[i - 1] if (i := bisect.bisect_right(times, when)) else None


def restarts(record: JobRecord, metrics: Sequence[MetricsLine]) -> list[dict[str, Any]]:
    """The record's restarts, each with the last step logged before it."""
    at = step_at(metrics)
    return [{**asdict(r), "step": at(r.time)} for r in record.restarts]


def timeline(found: Sequence[Event], metrics: Sequence[MetricsLine]) -> list[dict[str, Any]]:
    """The job's events, each with the last step logged before it, as the dashboard and
    the report mark them."""
    at = step_at(metrics)
    return [{**event.to_dict(), "step": at(event.time)} for event in found]


def _ranks(samples: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every rank as the last look saw it, with its tokens/s over the looks."""
    history: dict[int, dict[str, list[Any]]] = {}
    for s in samples:
        for r in s.get("ranks", []):
            h = history.setdefault(r["rank"], {"time": [], "tokens_per_sec": [], "step": []})
            h["time"].append(s["time"])
            h["tokens_per_sec"].append(r.get("tokens_per_sec"))
            h["step"].append(r.get("step"))
    last = samples[-1].get("ranks", []) if samples else []
    return [{**r, "history": history.get(r["rank"], {})} for r in last]


def _nodes(record: JobRecord, samples: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every node as the last look saw it, with memory and load over the looks."""
    order = [h.name for h in record.hosts]
    history: dict[str, dict[str, list[Any]]] = {}
    latest: dict[str, dict[str, Any]] = {}
    for s in samples:
        for host, node in (s.get("nodes") or {}).items():
            if host not in order:
                order.append(host)
            latest[host] = {**node, "time": s["time"]}
            if "error" in node:
                continue
            h = history.setdefault(host, {"time": [], "memory_used": [], "load": [],
                                          "gpu_utilization": []})
            h["time"].append(s["time"])
            h["memory_used"].append(node.get("memory_used"))
            h["load"].append((node.get("load") or [None])[0])
            h["gpu_utilization"].append((node.get("gpu") or {}).get("utilization"))
    out = []
    for host in order:
        node = latest.get(host)
        if node is None:
            continue
        h = history.get(host, {})
        total = node.get("memory_total")
        used = _numbers(h.get("memory_used", []))
        out.append({
            "host": host, "time": node["time"], "error": node.get("error"),
            "memory_used": node.get("memory_used"), "memory_total": total,
            "memory_peak_share": max(used) / total if used and total else None,
            "load": node.get("load"), "cpus": node.get("cpus"), "gpu": node.get("gpu"),
            "history": h})
    return out


def summary(record: JobRecord, metrics: Sequence[MetricsLine],
            last: dict[str, Any] | None) -> dict[str, Any]:
    losses = [m.loss for m in metrics]
    tps = [m.tokens_per_sec for m in metrics]
    recent = metrics[-SPLIT_LINES:]
    compute = sum(m.compute_time for m in recent)
    comm = sum(m.comm_time for m in recent)
    times = _numbers([m.time for m in metrics] + [(last or {}).get("time")])
    step = (last or {}).get("step")
    if step is None and metrics:
        step = metrics[-1].step
    evals = [(m.step, m.val_loss) for m in metrics if m.val_loss is not None]
    best = min(evals, key=lambda e: e[1], default=(None, None))
    return {
        "step": step, "steps": record.steps,
        "loss_first": losses[0] if losses else None,
        "loss_last": losses[-1] if losses else None,
        "loss_min": min(losses) if losses else None,
        "val_loss_last": evals[-1][1] if evals else None,
        "val_loss_min": best[1], "val_loss_best_step": best[0],
        "tokens_per_sec": tps[-1] if tps else None,
        "tokens_per_sec_median": statistics.median(tps) if tps else None,
        "compute_time": compute / len(recent) if recent else None,
        "comm_time": comm / len(recent) if recent else None,
        "compute_share": compute / (compute + comm) if compute + comm > 0 else None,
        "peak_memory": max((m.peak_memory for m in metrics), default=None),
        "elapsed": max(times) - record.created if times else None,
        "restarts": len(record.restarts),
    }


def job_info(record: JobRecord) -> dict[str, Any]:
    job = record.job or {}
    return {"backend": record.backend, "hosts": [h.name for h in record.hosts],
            "world_size": record.world_size, "steps": record.steps,
            "attempt": record.attempt, "created": record.created, "updated": record.updated,
            "message": record.message, "job_file": record.job_file,
            "inventory": record.inventory, "excluded": record.excluded,
            # what it runs: its kind, and its section under the kind's key (others null)
            "kind": record.workload.kind if record.workload else None,
            **dict.fromkeys(KINDS), **_workload(record.workload),
            "restart": {"max_restarts": record.restart.max_restarts,
                        "stall_timeout": record.restart.stall_timeout},
            "alerts": alerts.thresholds(job, record.workload)}


def _workload(workload: Workload | None) -> dict[str, Any]:
    return {} if workload is None else {workload.kind: workload.to_record()}


def serving(samples: Sequence[dict[str, Any]], points: int | None = None
            ) -> dict[str, Any] | None:
    """A serve job's figures (jobs/serveprobe.py: requests from the server's log, latency
    from the watchdog's probe, tokens/s from its canary): the last, and their history.

    The server's log counts the requests of one attempt (a restarted server starts at 0):
    ``requests_total`` adds up the attempts, each attempt's last count before the next
    began plus the current one's, so the dashboard's counter and curve never fall back
    at a restart."""
    rows = [s for s in samples if s.get("serve")]
    if not rows:
        return None
    history: dict[str, list[Any]] = {"time": [s["time"] for s in rows],
                                     "attempt": [s.get("attempt") for s in rows]}
    for name in ("requests", "tokens_per_sec", "latency"):
        history[name] = [s["serve"].get(name) for s in rows]
    ended: dict[Any, int] = {}   # attempt -> its last count seen
    totals: list[int | None] = []
    for attempt, count in zip(history["attempt"], history["requests"], strict=True):
        if count is None:
            totals.append(None)
            continue
        ended[attempt] = count
        totals.append(sum(ended.values()))
    history["requests_total"] = totals
    total = next((t for t in reversed(totals) if t is not None), None)
    return {"last": rows[-1]["serve"], "requests_total": total,
            "history": decimate(history, points)}


def document(mirror: Mirror, *, points: int | None = None, now: float | None = None,
             extras: dict[str, Any] | None = None) -> dict[str, Any]:
    """The job document. ``points``: thin each series to about that many rows (pages);
    ``extras``: more top-level fields (the report's plan and bench)."""
    record, metrics, samples = mirror.record, mirror.metrics, mirror.samples
    last = samples[-1] if samples else None
    limits = alerts.thresholds(record.job, record.workload)
    cols = columns(metrics, SERIES)
    ranks = _ranks(samples)
    nodes = _nodes(record, samples)
    if points:
        for item in ranks + nodes:
            item["history"] = decimate(item["history"], points)
    return {
        "name": record.name,
        "generated": time.time() if now is None else now,
        "state": _state(record, last),
        "updated": mirror.state.updated,
        "mirror_generation": mirror.state.generation,
        "job": job_info(record),
        "summary": summary(record, metrics, last),
        "metrics": decimate(cols, points, always="val_loss"),
        "metrics_lines": len(metrics),
        "restarts": restarts(record, metrics),
        "events": timeline(mirror.events, metrics),
        "ranks": ranks,
        "nodes": nodes,
        "alerts": alerts.evaluate(limits, last, cols["tokens_per_sec"], cols),
        "serve": serving(samples, points),
        **(extras or {}),
    }

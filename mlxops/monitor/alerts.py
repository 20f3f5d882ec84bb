"""Alerts: what is past the thresholds of the job file's ``alerts:`` (docs/job-file.md).

Pure functions of the mirror's last sample and its metrics, so the monitor, the dashboard
and the report flag the same things:

* ``memory_share``: a node's memory in use over its total is above it;
* ``tokens_per_sec_drop``: the global tokens/s of the last three metrics lines (their
  median) fell below ``1 - drop`` times the median of up to 50 lines before them;
* ``heartbeat_age``: a running rank's heartbeat is older than it (seconds), before the
  watchdog's ``stall_timeout`` calls it stalled;
* ``val_loss_rise``: the validation loss rose more than this fraction above its best while
  the training loss fell (the rule is trainer/validation.py's, shared with the trainer).
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from mlxops.jobs.spec import ALERT_DEFAULTS
from mlxops.jobs.workloads import Workload
from mlxops.node.protocol import RUNNING, STALLED
from mlxops.trainer.validation import overfitting

RECENT, BASELINE = 3, 50   # metrics lines: the "now" and the "usual" of tokens/s


def thresholds(job: Mapping[str, Any] | None, workload: Workload | None = None
               ) -> dict[str, float]:
    """The job's thresholds (as launched), defaults for what it does not set. The
    ``heartbeat_age`` of a workload that writes none is off (a server: the watchdog's
    probe is its liveness, jobs/serveprobe.py), so the age only says how long it has run."""
    given = (job or {}).get("alerts") or {}
    found = {key: float(given.get(key, default)) for key, default in ALERT_DEFAULTS.items()}
    if workload is not None and not workload.heartbeats:
        found["heartbeat_age"] = 0.0
    return found


def tokens_drop(tokens_per_sec: Sequence[float | None], drop: float
                ) -> tuple[float, float] | None:
    """``(now, usual)`` tokens/s when now fell below ``(1 - drop) * usual``, else None."""
    values = [v for v in tokens_per_sec if isinstance(v, (int, float))]
    if not drop or len(values) < RECENT * 2:
        return None
    now = statistics.median(values[-RECENT:])
    usual = statistics.median(values[-RECENT - BASELINE:-RECENT])
    return (now, usual) if usual > 0 and now < (1 - drop) * usual else None


def val_rise(metrics: Mapping[str, Sequence[Any]], rise: float) -> str | None:
    """The over-fitting alert's message from the metrics' columns (``step``, ``loss``,
    ``val_loss``; lines without a validation loss have None there), or None."""
    steps, losses = metrics.get("step", []), metrics.get("loss", [])
    vals = metrics.get("val_loss") or [None] * len(steps)
    evaluations = [(s, v) for s, v in zip(steps, vals, strict=True) if v is not None]
    found = overfitting(evaluations, list(zip(steps, losses, strict=True)), rise)
    return found.message() + f" (alert at +{rise:.0%})" if found else None


def evaluate(limits: Mapping[str, float], sample: Mapping[str, Any] | None,
             tokens_per_sec: Sequence[float | None],
             metrics: Mapping[str, Sequence[Any]] | None = None) -> list[dict[str, Any]]:
    """The alerts of a running job: ``{kind, message, host?, rank?}``, most urgent first.
    ``metrics``: the metrics' columns, for the validation alert."""
    if not sample or sample.get("state") not in (RUNNING, STALLED):
        return []
    found: list[dict[str, Any]] = []
    limit = limits.get("heartbeat_age", 0)
    for r in sample.get("ranks", []):
        age = r.get("heartbeat_age")
        if limit and r.get("state") in (RUNNING, STALLED) and age is not None and age > limit:
            found.append({"kind": "heartbeat_age", "rank": r["rank"], "host": r["host"],
                          "message": f"rank {r['rank']} on {r['host']}: no heartbeat for "
                                     f"{age:.0f}s (alert at {limit:g}s)"})
    share = limits.get("memory_share", 0)
    for host, node in (sample.get("nodes") or {}).items():
        used, total = node.get("memory_used"), node.get("memory_total")
        if share and used is not None and total and used / total > share:
            found.append({"kind": "memory_share", "host": host,
                          "message": f"{host}: memory {used / total:.0%} in use "
                                     f"(alert at {share:.0%})"})
    drop = tokens_drop(tokens_per_sec, limits.get("tokens_per_sec_drop", 0))
    if drop:
        now, usual = drop
        found.append({"kind": "tokens_per_sec_drop",
                      "message": f"tokens/s {now:,.0f}, down {1 - now / usual:.0%} from "
                                 f"{usual:,.0f} (alert at "
                                 f"{limits['tokens_per_sec_drop']:.0%})"})
    rising = val_rise(metrics or {}, limits.get("val_loss_rise", 0))
    if rising:
        found.append({"kind": "val_loss_rise", "message": rising})
    return found

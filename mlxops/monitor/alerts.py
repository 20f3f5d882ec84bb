"""Alerts: what is past the thresholds of the job file's ``alerts:`` (docs/job-file.md).

Pure functions of the mirror's last sample and its metrics, so the monitor, the dashboard
and the report flag the same things:

* ``memory_share``: a node's memory in use over its total is above it;
* ``tokens_per_sec_drop``: the global tokens/s of the last three metrics lines (their
  median) fell below ``1 - drop`` times the median of up to 50 lines before them;
* ``heartbeat_age``: a running rank's heartbeat is older than it (seconds), before the
  watchdog's ``stall_timeout`` calls it stalled.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from mlxops.jobs.spec import ALERT_DEFAULTS
from mlxops.node.protocol import RUNNING, STALLED

RECENT, BASELINE = 3, 50   # metrics lines: the "now" and the "usual" of tokens/s


def thresholds(job: Mapping[str, Any] | None) -> dict[str, float]:
    """The job's thresholds (as launched), defaults for what it does not set."""
    given = (job or {}).get("alerts") or {}
    return {key: float(given.get(key, default)) for key, default in ALERT_DEFAULTS.items()}


def tokens_drop(tokens_per_sec: Sequence[float | None], drop: float
                ) -> tuple[float, float] | None:
    """``(now, usual)`` tokens/s when now fell below ``(1 - drop) * usual``, else None."""
    values = [v for v in tokens_per_sec if isinstance(v, (int, float))]
    if not drop or len(values) < RECENT * 2:
        return None
    now = statistics.median(values[-RECENT:])
    usual = statistics.median(values[-RECENT - BASELINE:-RECENT])
    return (now, usual) if usual > 0 and now < (1 - drop) * usual else None


def evaluate(limits: Mapping[str, float], sample: Mapping[str, Any] | None,
             tokens_per_sec: Sequence[float | None]) -> list[dict[str, Any]]:
    """The alerts of a running job: ``{kind, message, host?, rank?}``, most urgent first."""
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
    return found

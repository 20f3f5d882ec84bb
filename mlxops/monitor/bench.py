"""The last ``mlxops bench`` result, as the dashboard and the report show it.

Read from the files ``mlxops bench`` saves, ``~/.mlxops/bench/<YYYYmmdd-HHMMSS>.json``
(their shape: docs/formats.md, "mlxops bench --json"). Tolerant on purpose: no bench yet,
an unreadable file or a field missing is shown as absent, never an error, because a bench
is an extra beside a run.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

from mlxops.paths import controller_home


def bench_dir() -> Path:
    return controller_home() / "bench"


def _saved() -> list[tuple[Path, dict[str, Any]]]:
    """Every readable result, newest first (the file name is its time)."""
    directory = bench_dir()
    if not directory.is_dir():
        return []
    out = []
    for path in sorted(directory.glob("*.json"), reverse=True):
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(doc, dict) and isinstance(doc.get("pairs"), list):
            out.append((path, doc))
    return out


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) \
        else None


def summary(path: Path, doc: dict[str, Any]) -> dict[str, Any]:
    """What a page shows of one result: links, all-reduce sweep, ring, findings."""
    pairs = [p for p in doc.get("pairs", []) if isinstance(p, dict)]
    rates = [x for x in (_number(p.get("bandwidth_gbps")) for p in pairs) if x is not None]
    slowest = min((p for p in pairs if _number(p.get("bandwidth_gbps")) is not None),
                  key=lambda p: p["bandwidth_gbps"], default=None)
    ring = doc.get("ring") if isinstance(doc.get("ring"), dict) else {}
    info = doc.get("allreduce_info") if isinstance(doc.get("allreduce_info"), dict) else {}
    allreduce = [{"bytes": a.get("bytes"), "time_us": _number(a.get("time_us")),
                  "busbw_gbps": _number(a.get("busbw_gbps")), "wrong": a.get("wrong")}
                 for a in doc.get("allreduce", []) if isinstance(a, dict)]
    return {
        "file": str(path),
        "time": _number(doc.get("time")),
        "hosts": [h for h in doc.get("hosts", []) if isinstance(h, str)],
        "pairs": len(pairs),
        "bandwidth_gbps": {"min": min(rates, default=None), "max": max(rates, default=None),
                           "median": statistics.median(rates) if rates else None},
        "slowest": None if slowest is None else {
            "src": slowest.get("src"), "dst": slowest.get("dst"),
            "gbps": slowest["bandwidth_gbps"]},
        "allreduce": allreduce,
        "avg_busbw_gbps": _number(info.get("avg_busbw_gbps")),
        "ring": {"order": ring.get("order"), "bottleneck_gbps": _number(
            ring.get("bottleneck_gbps"))} if ring.get("order") else None,
        "findings": [f["message"] for f in doc.get("findings", [])
                     if isinstance(f, dict) and isinstance(f.get("message"), str)],
    }


def latest_doc() -> dict[str, Any] | None:
    """The newest result as ``mlxops bench`` saved it (its links, for ``/metrics``)."""
    saved = _saved()
    return saved[0][1] if saved else None


def latest(hosts: list[str] | None = None) -> dict[str, Any] | None:
    """The newest result; with ``hosts``, the newest that measured all of them."""
    for path, doc in _saved():
        measured = set(doc.get("hosts") or [])
        if hosts is None or set(hosts) <= measured:
            return summary(path, doc)
    return None

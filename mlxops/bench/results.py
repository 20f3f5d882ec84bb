"""What a bench found, as ``--json`` prints it and ``~/.mlxops/bench/<time>.json`` keeps it
(docs/formats.md, "mlxops bench --json"), and what later commands read back from it: the
ring order (``mlxops hostfile --order``) and the all-reduce and all_gather fits
(``mlxops plan``).

Units: bandwidth in Gbit/s, decimal (1e9 bit/s) everywhere, all-reduce bandwidths too;
latency and times in microseconds; sizes in bytes. Hosts by inventory name.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from mlxops.errors import bad_input
from mlxops.paths import controller_home

VERSION = 1
BUSBW_FROM = 1 << 20          # --min-busbw and the summary average sizes from 1 MiB up
GRADIENT_GROUP = 32 << 20     # nn.average_gradients all-reduces in groups of ~32 MiB


def bench_dir() -> Path:
    return controller_home() / "bench"


@dataclass
class PairResult:
    """One direction of one pair: ``src`` sends, ``dst`` receives (and counts)."""

    src: str
    dst: str
    latency_us: dict[str, float] | None = None   # min, median, p90, p99, max (round trip)
    streams: dict[str, float] = field(default_factory=dict)  # "1": Gbit/s, "4": Gbit/s
    bidir_gbps: float | None = None    # this direction while the other also ran (ring links)
    tool: str = "mlxops"
    error: str | None = None

    @property
    def bandwidth_gbps(self) -> float | None:
        """The best of the stream counts: what the link carries."""
        return max(self.streams.values()) if self.streams else None

    def to_dict(self) -> dict[str, Any]:
        return {"src": self.src, "dst": self.dst, "latency_us": self.latency_us,
                "bandwidth_gbps": self.bandwidth_gbps, "streams": self.streams,
                "bidir_gbps": self.bidir_gbps, "tool": self.tool, "error": self.error}


@dataclass
class LoopbackResult:
    host: str
    latency_us: dict[str, float] | None = None
    bandwidth_gbps: float | None = None
    error: str | None = None


@dataclass
class AllreduceRow:
    """One size of the collective sweep (``all_sum``; ``all_gather`` rows too)."""

    bytes: int                    # summed; an all_gather's: gathered (all ranks' blocks)
    time_us: float                # per call, the slowest rank's average
    algbw_gbps: float             # bytes / time
    busbw_gbps: float             # algbw * 2(n-1)/n; an all_gather's: algbw * (n-1)/n
    wrong: int                    # elements not n(n+1)/2, summed over ranks
    iterations: int


@dataclass
class RingResult:
    order: list[str]
    bottleneck_gbps: float | None         # its slowest link (min of both directions)
    exact: bool
    bound_gbps: float | None              # no ring's slowest link is faster
    inventory_bottleneck_gbps: float | None   # the inventory order's, for comparison
    bidir_bottleneck_gbps: float | None = None  # slowest link, both directions at once (sum)
    measured: str = "all"                 # "all" pairs searched, or "ring" (inventory order)


@dataclass
class BenchResult:
    inventory: str
    hosts: list[str]
    options: dict[str, Any]
    time: float = field(default_factory=time.time)
    pairs: list[PairResult] = field(default_factory=list)
    loopback: list[LoopbackResult] = field(default_factory=list)
    allreduce: list[AllreduceRow] = field(default_factory=list)
    allreduce_info: dict[str, Any] = field(default_factory=dict)
    all_gather: list[AllreduceRow] = field(default_factory=list)  # fit: allreduce_info's
    ring: RingResult | None = None
    findings: list[dict[str, Any]] = field(default_factory=list)
    unreachable: dict[str, str] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)

    def pair(self, src: str, dst: str) -> PairResult | None:
        return next((p for p in self.pairs if p.src == src and p.dst == dst), None)

    def to_dict(self) -> dict[str, Any]:
        return {"version": VERSION, "time": self.time, "inventory": self.inventory,
                "hosts": self.hosts, "options": self.options,
                "pairs": [p.to_dict() for p in self.pairs],
                "loopback": [asdict(x) for x in self.loopback],
                "allreduce": [asdict(r) for r in self.allreduce],
                "allreduce_info": self.allreduce_info,
                "all_gather": [asdict(r) for r in self.all_gather],
                "ring": asdict(self.ring) if self.ring else None,
                "findings": self.findings, "unreachable": self.unreachable,
                "failures": self.failures, "seconds": self.seconds}


def allreduce_rows(per_rank: list[list[dict[str, Any]]], ranks: int,
                   factor: Callable[[int], float] | None = None) -> list[AllreduceRow]:
    """nccl-tests' figures from every rank's results: time is the slowest rank's; the
    bus bandwidth by ``factor`` (the all-reduce's :func:`bus_factor`; an all_gather's
    :func:`gather_factor`)."""
    factor = factor or bus_factor
    rows = []
    for sizes in zip(*per_rank, strict=True):
        size = sizes[0]["bytes"]
        t = max(s["time_us"] for s in sizes)
        algbw = size * 8 / (t / 1e6) / 1e9 if t > 0 else 0.0
        rows.append(AllreduceRow(bytes=size, time_us=t, algbw_gbps=algbw,
                                 busbw_gbps=algbw * factor(ranks),
                                 wrong=sum(s["wrong"] for s in sizes),
                                 iterations=sizes[0]["iterations"]))
    return rows


def bus_factor(ranks: int) -> float:
    """nccl-tests' all-reduce bus factor 2(n-1)/n: what each link carries per byte."""
    return 2 * (ranks - 1) / ranks if ranks > 0 else 0.0


def gather_factor(ranks: int) -> float:
    """nccl-tests' all_gather bus factor (n-1)/n: what each link carries per byte gathered."""
    return (ranks - 1) / ranks if ranks > 0 else 0.0


def average_busbw(rows: list[AllreduceRow]) -> float | None:
    big = [r.busbw_gbps for r in rows if r.bytes >= BUSBW_FROM]
    return sum(big) / len(big) if big else None


def fit(rows: list[AllreduceRow]) -> dict[str, float] | None:
    """t(S) = a + b*S by least squares on relative error (weights 1/t^2, so the small sizes
    fix ``a`` and the large ones ``b``); ``a`` is kept >= 0. None below two sizes."""
    pts = [(float(r.bytes), r.time_us) for r in rows if r.time_us > 0]
    if len({x for x, _ in pts}) < 2:
        return None
    weighted = [(1 / (y * y), x, y) for x, y in pts]
    sw = sum(w for w, _, _ in weighted)
    sx = sum(w * x for w, x, _ in weighted)
    sy = sum(w * y for w, _, y in weighted)
    sxx = sum(w * x * x for w, x, _ in weighted)
    sxy = sum(w * x * y for w, x, y in weighted)
    b = (sw * sxy - sx * sy) / (sw * sxx - sx * sx)
    a = (sy - b * sx) / sw
    if a < 0:
        a, b = 0.0, sxy / sxx
    return {"a_us": a, "b_us_per_byte": max(b, 0.0)}


def predict_us(info: dict[str, Any], nbytes: int, world: int) -> float | None:
    """All-reduce time of ``nbytes`` (a step's gradients) over ``world`` ranks from a bench's
    fit: one ``a`` per 32 MiB group (as nn.average_gradients sends them), and ``b`` scaled
    by the bus factor of ``world`` against the bench's own ranks."""
    params, ranks = info.get("fit"), info.get("ranks")
    if not params or not ranks or ranks < 2 or world < 2:
        return 0.0 if world < 2 else None
    groups = max(1, math.ceil(nbytes / GRADIENT_GROUP))
    scale = bus_factor(world) / bus_factor(ranks)
    return groups * params["a_us"] + params["b_us_per_byte"] * nbytes * scale


def all_gather_us(info: dict[str, Any], nbytes: int, world: int) -> float | None:
    """ZeRO-1's ``all_gather`` of ``nbytes`` gathered (the weights, every step) over
    ``world`` ranks, from a bench's ``allreduce_info`` (its ranks ``m``).

    From the bench's own all_gather sweep (``all_gather_fit``: ``t(S) = a + b S`` fitted
    as the all-reduce's, :func:`fit`, ``S`` the bytes gathered): a ring all_gather is one
    call (one ``a``) whose every link carries ``S (n - 1) / n``, so at ``world = n``

        t = a + b S g(n) / g(m),   g(n) = (n - 1) / n   (nccl-tests' all_gather factor)

    The all-reduce's fit is not used for it where that sweep exists: measured, it predicted
    1.1 to 1.6 times the gather on a quiet machine, up to 3.6 times under load
    (benchmarks/README.md, "zero.py"); the gather's own fit, 0.78 to 1.02 of it. A bench
    saved before the gather sweep (no ``all_gather_fit``) still predicts, from its
    all-reduce fit at half its bus factor: ``a + b S g(n) / (2 g(m))``
    (:func:`gather_source` says which). None without a fit; 0 on one rank."""
    ranks = info.get("ranks")
    if world < 2:
        return 0.0
    if not ranks or ranks < 2:
        return None
    if info.get("all_gather_fit"):
        params, scale = info["all_gather_fit"], gather_factor(world) / gather_factor(ranks)
    elif info.get("fit"):
        params, scale = info["fit"], gather_factor(world) / bus_factor(ranks)
    else:
        return None
    return params["a_us"] + params["b_us_per_byte"] * nbytes * scale


def gather_source(info: dict[str, Any]) -> str | None:
    """Which sweep :func:`all_gather_us` predicts from: ``all_gather`` (the bench's own),
    ``all_sum`` (a bench saved before it had one), None (no fit)."""
    if info.get("all_gather_fit"):
        return "all_gather"
    return "all_sum" if info.get("fit") else None


# --- files -------------------------------------------------------------------------------


def save(result: BenchResult) -> Path:
    """``~/.mlxops/bench/<YYYYmmdd-HHMMSS>.json`` (atomic; never overwrites another)."""
    directory = bench_dir()
    directory.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(result.time))
    path, n = directory / f"{stamp}.json", 1
    while path.exists():
        n += 1
        path = directory / f"{stamp}-{n}.json"
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".bench.", suffix=".tmp")
    with os.fdopen(fd, "w") as handle:
        handle.write(json.dumps(result.to_dict(), indent=1) + "\n")
    os.replace(tmp, path)
    return path


def load(path: str | Path) -> dict[str, Any]:
    """A saved result (or a ``--json`` output) as a document; bad input names the file."""
    path = Path(path)
    try:
        doc = json.loads(path.read_text())
    except OSError as exc:
        raise bad_input(path, None, f"cannot read: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise bad_input(path, None, f"not JSON: {exc}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("pairs"), list):
        raise bad_input(path, None, "not an mlxops bench result (no 'pairs')")
    return doc


def ring_order(path: str | Path) -> list[str]:
    """The ring order a saved result chose."""
    doc = load(path)
    order = (doc.get("ring") or {}).get("order")
    if not isinstance(order, list) or not order or not all(isinstance(h, str) for h in order):
        raise bad_input(path, "ring.order", "no ring order in this result (was it run "
                                            "with --pairs ring, or on one host?)")
    return order


def latest_for(hosts: list[str]) -> tuple[Path, dict[str, Any]] | None:
    """The newest saved result of exactly these hosts that has an all-reduce fit."""
    directory = bench_dir()
    if not directory.is_dir():
        return None
    for path in sorted(directory.glob("*.json"), key=lambda p: p.stat().st_mtime,
                       reverse=True):
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        info = doc.get("allreduce_info") if isinstance(doc, dict) else None
        if isinstance(info, dict) and info.get("fit") and \
                sorted(doc.get("hosts") or []) == sorted(hosts):
            return path, doc
    return None

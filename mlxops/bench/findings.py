"""What to make of a bench's figures: the lines printed under its tables, and ``findings``
in its JSON (docs/formats.md). Each finding is ``{"kind", "message", ...details}``.

* ``slow_host``: a host whose median link is well below the typical host's (its cable,
  port, NIC or Wi-Fi, not the links' other ends); ``slow_link``: a link well below the
  median of the links no slow host explains;
* ``asymmetric``: one direction of a pair well below the other (duplex mismatch, a
  congested uplink, power saving);
* ``high_latency``: a pair whose median round trip is far above the others';
* ``loopback``: each host's floor, its round trip and bandwidth to itself: what its own
  stack adds to every latency and the most its streams can carry; ``host_bound``: links
  that reach that ceiling measure the hosts, not the network;
* ``ring``: the ring order with the fastest slowest link, against the inventory's order;
* ``allreduce``: the measured bus bandwidth against what the ring's links carry both ways,
  and ``wrong`` when a sum was not n(n+1)/2.
"""

from __future__ import annotations

import statistics
from typing import Any

from mlxops.bench.results import BenchResult, average_busbw
from mlxops.inventory.variables import ring_order_line

SLOW = 0.75            # a link (a host) below this share of the median one is slow
ASYMMETRIC = 0.75      # one direction below this share of the other
HIGH_LATENCY = 2.0     # a round trip above twice the median ...
HIGH_LATENCY_US = 50.0  # ... and at least this much above it
HOST_BOUND = 0.8       # a link at this share of its hosts' loopback rate
SAME_RING = 0.95       # the inventory order within 5% of the best: as good


def _g(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.3g}"


def findings(result: BenchResult) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    out += _slow(result)
    out += _asymmetric(result)
    out += _latency(result)
    out += _loopback(result)
    out += _ring(result)
    out += _allreduce(result)
    return out


def _first(result: BenchResult, p) -> bool:
    """One direction of each pair: from the host earlier in the inventory."""
    return result.hosts.index(p.src) < result.hosts.index(p.dst)


def _measured(result: BenchResult) -> list:
    return [p for p in result.pairs if p.bandwidth_gbps is not None]


def _slow(result: BenchResult) -> list[dict[str, Any]]:
    """Slow hosts first, against the median host (each host's median link): with few hosts
    one slow host drags down half the links, and the median link with them. Then slow links
    among the rest, against their own median."""
    pairs = _measured(result)
    if len(pairs) < 2:
        return []
    own = {}
    for host in result.hosts:
        links = [p.bandwidth_gbps for p in pairs if host in (p.src, p.dst)]
        if len(links) >= 2:
            own[host] = (statistics.median(links), len(links))
    typical = statistics.median(m for m, _ in own.values()) if own else 0.0
    out: list[dict[str, Any]] = []
    slow_hosts = []
    for host, (median, count) in own.items():
        if median < SLOW * typical:
            slow_hosts.append(host)
            out.append({
                "kind": "slow_host", "host": host, "median_gbps": median,
                "typical_gbps": typical, "links": count,
                "message": f"{host}: its links are slow (median {_g(median)} Gbit/s, the "
                           f"typical host's {_g(typical)}): look at {host}'s cable, port, "
                           "adapter or Wi-Fi first"})
    rest = [p for p in pairs if p.src not in slow_hosts and p.dst not in slow_hosts]
    if len(rest) < 2:
        return out
    median = statistics.median(p.bandwidth_gbps for p in rest)
    for p in rest:
        if p.bandwidth_gbps < SLOW * median:
            out.append({"kind": "slow_link", "src": p.src, "dst": p.dst,
                        "gbps": p.bandwidth_gbps, "median_gbps": median,
                        "message": f"{p.src} -> {p.dst}: {_g(p.bandwidth_gbps)} Gbit/s, below "
                                   f"{SLOW:.0%} of the median link ({_g(median)})"})
    return out


def _asymmetric(result: BenchResult) -> list[dict[str, Any]]:
    out = []
    for p in _measured(result):
        back = result.pair(p.dst, p.src)
        if back is None or back.bandwidth_gbps is None or not _first(result, p):
            continue
        lo, hi = sorted((p.bandwidth_gbps, back.bandwidth_gbps))
        if hi > 0 and lo < ASYMMETRIC * hi:
            out.append({"kind": "asymmetric", "hosts": [p.src, p.dst],
                        "gbps": [p.bandwidth_gbps, back.bandwidth_gbps],
                        "message": f"{p.src} -> {p.dst} {_g(p.bandwidth_gbps)} Gbit/s but "
                                   f"{p.dst} -> {p.src} {_g(back.bandwidth_gbps)}: one "
                                   "direction is held back (duplex, a shared uplink, power "
                                   "saving)"})
    return out


def _latency(result: BenchResult) -> list[dict[str, Any]]:
    pairs = [p for p in result.pairs if p.latency_us and _first(result, p)]
    if len(pairs) < 2:
        return []
    median = statistics.median(p.latency_us["median"] for p in pairs)
    out = []
    for p in pairs:
        rtt = p.latency_us["median"]
        if rtt > HIGH_LATENCY * median and rtt - median > HIGH_LATENCY_US:
            out.append({"kind": "high_latency", "hosts": [p.src, p.dst], "median_us": rtt,
                        "all_median_us": median,
                        "message": f"{p.src} <-> {p.dst}: round trip {rtt:.0f} us, the median "
                                   f"link's is {median:.0f} us (a hop more? Wi-Fi?)"})
    return out


def _loopback(result: BenchResult) -> list[dict[str, Any]]:
    out = []
    ceiling = {}
    for lb in result.loopback:
        if lb.error or lb.latency_us is None:
            continue
        ceiling[lb.host] = lb.bandwidth_gbps
        out.append({"kind": "loopback", "host": lb.host,
                    "latency_us": lb.latency_us["median"], "bandwidth_gbps": lb.bandwidth_gbps,
                    "message": f"{lb.host}: loopback floor {lb.latency_us['median']:.0f} us "
                               f"round trip, {_g(lb.bandwidth_gbps)} Gbit/s"})
    bound = [p for p in _measured(result)
             if ceiling.get(p.src) and ceiling.get(p.dst)
             and p.bandwidth_gbps >= HOST_BOUND * min(ceiling[p.src], ceiling[p.dst])]
    if bound:
        out.append({"kind": "host_bound", "links": [[p.src, p.dst] for p in bound],
                    "message": f"{len(bound)} link(s) run at {HOST_BOUND:.0%}+ of their "
                               "hosts' loopback rate: those figures measure the hosts (CPU, "
                               "the measuring streams), not the network; compare --iperf3"})
    return out


def _ring(result: BenchResult) -> list[dict[str, Any]]:
    ring = result.ring
    if ring is None or len(ring.order) < 2:
        return []
    path = " -> ".join([*ring.order, ring.order[0]] if len(ring.order) > 2 else ring.order)
    if ring.measured == "ring":
        return [{"kind": "ring", "order": ring.order, "bottleneck_gbps": ring.bottleneck_gbps,
                 "message": f"ring (inventory order, only its links measured): {path}; "
                            f"slowest link {_g(ring.bottleneck_gbps)} Gbit/s"}]
    how = "optimal" if ring.exact else (
        f"heuristic, at most {_g((ring.bound_gbps or 0) - (ring.bottleneck_gbps or 0))} "
        "Gbit/s below the best possible")
    inv = ring.inventory_bottleneck_gbps
    if inv is not None and ring.bottleneck_gbps and inv >= SAME_RING * ring.bottleneck_gbps:
        advice = f"the inventory's order is as good ({_g(inv)} Gbit/s)"
    else:
        advice = (f"the inventory's order: {_g(inv)} Gbit/s; {ring_order_line(ring.order)} "
                  "under all: vars in the inventory makes jobs, provision and check use the "
                  "best one ('mlxops bench --apply' writes it into the nodes' hostfiles now)")
    return [{"kind": "ring", "order": ring.order, "bottleneck_gbps": ring.bottleneck_gbps,
             "inventory_bottleneck_gbps": inv, "exact": ring.exact,
             "message": f"best ring: {path}; slowest link {_g(ring.bottleneck_gbps)} Gbit/s "
                        f"({how}); {advice}"}]


def _allreduce(result: BenchResult) -> list[dict[str, Any]]:
    rows = result.allreduce
    if not rows:
        return []
    out = []
    wrong = sum(r.wrong for r in rows)
    if wrong:
        sizes = [r.bytes for r in rows if r.wrong]
        out.append({"kind": "wrong", "elements": wrong, "sizes": sizes,
                    "message": f"all-reduce: {wrong} element(s) of the sums were wrong "
                               f"(sizes {sizes}): do not train on this cluster until that "
                               "is understood"})
    busbw = average_busbw(rows)
    both = result.ring.bidir_bottleneck_gbps if result.ring else None
    if busbw is not None:
        against = (f" = {busbw / both:.0%} of the ring's slowest link both ways "
                   f"({_g(both)} Gbit/s)") if both else ""
        out.append({"kind": "allreduce", "avg_busbw_gbps": busbw, "ring_bidir_gbps": both,
                    "message": f"all-reduce: average busbw {_g(busbw)} Gbit/s over sizes "
                               f">= 1 MiB{against}"})
    return out

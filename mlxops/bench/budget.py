"""The bench's time budget: ``mlxops bench`` at its defaults ends within ``--budget``
seconds (30) whatever the links' speed; ``--thorough`` measures as long as it takes.

A bandwidth run lasts a fixed time whatever the link (its receiver counts the bytes of a
fixed window), and a time-boxed latency measurement too, so the network phases' time is
known before they start. With ``R`` rounds (the loopback round, the pair rounds, the
ring's rounds both ways), ``R_lat`` of them measuring latency, and ``K`` bandwidth runs in
all on one client (2 x the stream counts per pair round, 1 per loopback and ring round):

    T_net = R * ROUND_COST + R_lat * LATENCY_SECONDS + K * (s + o)

where ``ROUND_COST`` is what one round costs beside its runs (SSH, the helper's start, its
connections: 0.5 s on the idle 2-core sandbox; the bench uses what starting its servers,
one such round, took when that was more: 1.6 s with other test runs sharing the cores).
The network phases get ``NET_SHARE`` of the budget, so each run gets

    s + o = (NET_SHARE * B - R * ROUND_COST - R_lat * LATENCY_SECONDS) / K

split ``o = s / 2`` (a third left out for TCP's slow start), and at least ``MIN_SECONDS``
measured: below that a window holds too few bytes of a fast link to be within 10% of
iperf3. Eight hosts at B = 30: 10 rounds, K = 17, s = 0.32 s, o = 0.16 s. So a slow link
does not make the pair rounds longer, only a larger cluster does (``MIN_SECONDS`` then
wins over the budget, and the bench says by how much it expects to run over).

The all-reduce sweep gets what is left when it starts, less ``SWEEP_START`` for its ranks
to start (MLX's import, the ring's connections) and ``SWEEP_END`` to stop them and clean
up (at least ``MIN_SWEEP``); its ranks stop growing the size once the next one's least
work would not fit its share (``mlxops/node/allreduce.py``), and the largest size
reached is reported. Those
costs are fixed: on a busy machine they, not the links, decide whether 30 s holds.
"""

from __future__ import annotations

from dataclasses import replace

from mlxops.bench.measure import Settings
from mlxops.bench.schedule import disjoint_rounds, ring_edges

DEFAULT_BUDGET = 30.0
#: Stream counts at the defaults (``--thorough``: 1 and 4, today's full sweep).
BUDGET_STREAMS = (4,)
NET_SHARE = 0.5
ROUND_COST = 0.5
LATENCY_SECONDS = 0.25
MIN_SECONDS = 0.25
SWEEP_START = 4.0
SWEEP_END = 2.0
#: The sweep always gets this long: its small sizes (latency) take about that.
MIN_SWEEP = 3.0


def pair_rounds(hosts: int, ring_only: bool) -> int:
    """Rounds of disjoint pairs: every pair (round robin), or only the ring's links."""
    if hosts < 2:
        return 0
    if ring_only:
        return len(disjoint_rounds(ring_edges(list(range(hosts)))))
    return hosts - 1 if hosts % 2 == 0 else hosts


def _shape(hosts: int, streams: int, ring_only: bool) -> tuple[int, int, int]:
    """(rounds, rounds measuring latency, bandwidth runs) of the network phases."""
    pairs = pair_rounds(hosts, ring_only)
    ring = pair_rounds(hosts, True) if hosts > 1 else 0
    return 1 + pairs + ring, 1 + pairs, streams * 2 * pairs + 1 + ring


def network_seconds(hosts: int, settings: Settings, *, ring_only: bool = False,
                    round_cost: float = ROUND_COST) -> float:
    """``T_net`` above: what the network phases should take with ``settings``."""
    rounds, latency_rounds, runs = _shape(hosts, len(settings.streams), ring_only)
    latency = settings.latency_seconds or LATENCY_SECONDS
    return (rounds * round_cost + latency_rounds * latency
            + runs * (settings.seconds + settings.omit))


def plan(budget: float, hosts: int, base: Settings, *, ring_only: bool = False,
         round_cost: float = ROUND_COST) -> Settings:
    """``base`` with the ``seconds``, ``omit`` and latency time box the budget allows;
    ``round_cost``: what a round of node commands was measured to cost (the bench's start
    of its servers), when more than ``ROUND_COST``."""
    round_cost = max(round_cost, ROUND_COST)
    rounds, latency_rounds, runs = _shape(hosts, len(base.streams), ring_only)
    left = NET_SHARE * budget - rounds * round_cost - latency_rounds * LATENCY_SECONDS
    seconds = min(base.seconds, max(MIN_SECONDS, left / runs * 2 / 3))
    return replace(base, seconds=round(seconds, 3), omit=round(seconds / 2, 3),
                   latency_seconds=LATENCY_SECONDS)


def sweep_budget(budget: float, elapsed: float) -> float:
    """Seconds the all-reduce ranks may spend on their sweep, ``elapsed`` into the bench."""
    return max(MIN_SWEEP, budget - elapsed - SWEEP_START - SWEEP_END)

"""The ring order whose slowest link is as fast as possible: a bottleneck travelling-salesman
problem over the measured link speeds.

A ring order is good when its slowest link is fast: an all-reduce over a ring moves at the
pace of its slowest link. So: maximise the minimum edge weight over Hamiltonian cycles.

Exact up to :data:`EXACT_MAX` hosts: a threshold search over the distinct link speeds
(binary, between a heuristic ring's bottleneck, always reachable, and an upper bound),
where each step asks whether the links at least that fast hold a Hamiltonian cycle,
answered by a bitmask DP over subsets (2^(n-1) * (n-1) steps). Beyond, the same threshold
search with a randomised rotation-extension (Posa) search for the cycle, and the answer
says how far it may be from the optimum: its gap to the bound.

The bound: no ring beats the bottleneck spanning tree (a ring minus one link is a spanning
path, so the ring's slowest link is at most the maximum spanning tree's slowest link), nor
any host's second-fastest link (a ring uses two links of every host).

Among rings with the optimal bottleneck, a 2-opt polish prefers the one whose sorted link
speeds are lexicographically largest: the slow links appear only where they must.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

EXACT_MAX = 16
HEURISTIC_TRIES = 200      # rotation-extension restarts per threshold (beyond EXACT_MAX)
POLISH_ROUNDS = 50

Weights = Sequence[Sequence[float]]   # symmetric; w[i][j] is the link i-j's speed


@dataclass(frozen=True)
class Ring:
    order: list[int]          # host indices; the ring closes from the last to the first
    bottleneck: float         # the slowest link's weight (inf for fewer than 2 hosts)
    exact: bool               # proven optimal
    bound: float              # no ring's bottleneck exceeds this

    @property
    def gap(self) -> float:
        return self.bound - self.bottleneck


def ring_bottleneck(order: Sequence[int], w: Weights) -> float:
    n = len(order)
    if n < 2:
        return float("inf")
    links = [(order[i], order[(i + 1) % n]) for i in range(n if n > 2 else 1)]
    return min(w[a][b] for a, b in links)


def upper_bound(w: Weights) -> float:
    """The bottleneck spanning tree's value, capped by every host's second-fastest link."""
    n = len(w)
    if n < 2:
        return float("inf")
    # Prim's algorithm on the maximum spanning tree: its slowest edge is the value.
    best = [float("-inf")] * n
    seen = [False] * n
    best[0] = float("inf")
    tree_min = float("inf")
    for _ in range(n):
        i = max((v for v in range(n) if not seen[v]), key=lambda v: best[v])
        seen[i] = True
        tree_min = min(tree_min, best[i])
        for j in range(n):
            if not seen[j] and w[i][j] > best[j]:
                best[j] = w[i][j]
    if n == 2:
        return tree_min
    second = min(sorted((w[i][j] for j in range(n) if j != i), reverse=True)[1]
                 for i in range(n))
    return min(tree_min, second)


def hamiltonian_cycle(adj: Sequence[int]) -> list[int] | None:
    """A Hamiltonian cycle of the graph with neighbour bitmasks ``adj`` (n >= 3), or None.

    dp[mask]: the bitmask of hosts v such that a path from host 0 through exactly the
    hosts of ``mask`` (over hosts 1..n-1) ends at v.
    """
    n = len(adj)
    if any(bin(a).count("1") < 2 for a in adj):
        return None
    # Bits over hosts 1..n-1: host v is bit v-1.
    nb = [(adj[v] >> 1) for v in range(n)]
    start = nb[0]
    full = (1 << (n - 1)) - 1
    dp = [0] * (full + 1)
    for mask in range(1, full + 1):
        ends = 0
        rest = mask
        while rest:
            bit = rest & -rest
            rest ^= bit
            prev = mask ^ bit
            v = bit.bit_length()  # host index of this bit
            if (start & bit) if prev == 0 else (dp[prev] & nb[v]):
                ends |= bit
        dp[mask] = ends
    last = dp[full] & start
    if not last:
        return None
    path = []
    mask, bit = full, last & -last
    while True:
        v = bit.bit_length()
        path.append(v)
        prev = mask ^ bit
        if prev == 0:
            break
        cand = dp[prev] & nb[v]
        mask, bit = prev, cand & -cand
    return [0, *reversed(path)]


def _posa(adj: Sequence[int], rng: random.Random, steps: int) -> list[int] | None:
    """Rotation-extension: grow a path, rotating it when its end is stuck; a cycle once it
    covers every host and its ends meet."""
    n = len(adj)
    path = [rng.randrange(n)]
    on = {path[0]}
    for _ in range(steps):
        end = path[-1]
        fresh = [u for u in range(n) if adj[end] >> u & 1 and u not in on]
        if fresh:
            u = rng.choice(fresh)
            path.append(u)
            on.add(u)
            continue
        if len(path) == n and adj[end] >> path[0] & 1:
            return path
        pivots = [i for i in range(len(path) - 2) if adj[end] >> path[i] & 1]
        if not pivots:
            return None
        i = rng.choice(pivots)
        path[i + 1:] = reversed(path[i + 1:])
    return None


def _cycle_at(w: Weights, threshold: float, exact: bool, rng: random.Random
              ) -> list[int] | None:
    n = len(w)
    adj = [sum(1 << j for j in range(n) if j != i and w[i][j] >= threshold) for i in range(n)]
    if exact:
        return hamiltonian_cycle(adj)
    if any(bin(a).count("1") < 2 for a in adj):
        return None
    for _ in range(HEURISTIC_TRIES):
        found = _posa(adj, rng, steps=20 * n * n)
        if found:
            return found
    return None


def _greedy(w: Weights) -> list[int]:
    """Nearest-fastest neighbour from host 0: a first ring (a lower bound)."""
    n = len(w)
    order, left = [0], set(range(1, n))
    while left:
        nxt = max(left, key=lambda j: w[order[-1]][j])
        order.append(nxt)
        left.remove(nxt)
    return order


def _key(order: Sequence[int], w: Weights) -> list[float]:
    n = len(order)
    return sorted(w[order[i]][order[(i + 1) % n]] for i in range(n))


def polish(order: list[int], w: Weights) -> list[int]:
    """2-opt moves that make the sorted link speeds lexicographically larger (never the
    bottleneck smaller): the slowest links only where they must be."""
    n = len(order)
    if n < 4:
        return order
    best = _key(order, w)
    for _ in range(POLISH_ROUNDS):
        improved = False
        for i, j in itertools.combinations(range(1, n), 2):
            cand = order[:i] + order[i:j + 1][::-1] + order[j + 1:]
            key = _key(cand, w)
            if key > best:
                order, best, improved = cand, key, True
        if not improved:
            break
    return order


def best_ring(w: Weights, *, exact_max: int = EXACT_MAX, seed: int = 0) -> Ring:
    """The ring (host indices) that maximises its slowest link."""
    n = len(w)
    if n < 3:
        order = list(range(n))
        b = ring_bottleneck(order, w)
        return Ring(order, b, True, b)
    bound = upper_bound(w)
    exact = n <= exact_max
    rng = random.Random(seed)
    order = polish(_greedy(w), w)
    low = ring_bottleneck(order, w)
    # Thresholds worth asking about: the distinct speeds above the ring in hand, up to
    # the bound. Binary search: a cycle at t means one at every lower t.
    levels = sorted({w[i][j] for i in range(n) for j in range(i + 1, n)
                     if low < w[i][j] <= bound})
    lo, hi = 0, len(levels) - 1
    while lo <= hi:
        mid = (lo + hi) // 2
        found = _cycle_at(w, levels[mid], exact, rng)
        if found:
            order, lo = found, mid + 1
        else:
            hi = mid - 1
    order = polish(order, w)
    b = ring_bottleneck(order, w)
    return Ring(_canonical(order), b, exact or b >= bound, bound)


def _canonical(order: list[int]) -> list[int]:
    """The same ring starting at host 0, turning towards the lower-numbered neighbour: one
    way to write each ring, so equal rings compare equal."""
    i = order.index(0)
    order = order[i:] + order[:i]
    if len(order) > 2 and order[-1] < order[1]:
        order = [order[0], *reversed(order[1:])]
    return order


def symmetric(n: int, weight: Callable[[int, int], float]) -> list[list[float]]:
    """An n x n symmetric matrix of ``weight(i, j)`` for i < j (0 on the diagonal)."""
    w = [[0.0] * n for _ in range(n)]
    for i in range(n):
        for j in range(i + 1, n):
            w[i][j] = w[j][i] = weight(i, j)
    return w

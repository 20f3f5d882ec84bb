"""Who measures with whom, when: rounds of disjoint pairs, so a round's pairs run at once
without sharing a node.

Every pair of hosts: the round-robin tournament's circle method. Host 0 stays put, the
others rotate one place per round; each round pairs the i-th host with the i-th from the
other end. n even: n-1 rounds of n/2 pairs; n odd: a bye makes it n rounds of (n-1)/2.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

T = TypeVar("T")
Pair = tuple[T, T]


def round_robin(items: Sequence[T]) -> list[list[tuple[T, T]]]:
    """Every unordered pair of ``items`` exactly once, in rounds where no item appears
    twice. Within a pair, the first runs the client (both directions are measured)."""
    xs: list[T | None] = list(items)
    if len(xs) < 2:
        return []
    if len(xs) % 2:
        xs.append(None)  # the bye: whoever meets it sits the round out
    m = len(xs)
    rounds = []
    for _ in range(m - 1):
        pairs = []
        for i in range(m // 2):
            a, b = xs[i], xs[m - 1 - i]
            if a is None or b is None:
                continue
            pairs.append((a, b))
        rounds.append(pairs)
        xs = [xs[0], xs[-1], *xs[1:-1]]
    return rounds


def ring_edges(order: Sequence[T]) -> list[tuple[T, T]]:
    """The links of a ring in this order: each host and the next, the last and the first
    (two hosts: one link; one host: none)."""
    n = len(order)
    if n < 2:
        return []
    if n == 2:
        return [(order[0], order[1])]
    return [(order[i], order[(i + 1) % n]) for i in range(n)]


def disjoint_rounds(pairs: Sequence[tuple[T, T]]) -> list[list[tuple[T, T]]]:
    """``pairs`` in rounds where no item appears twice (greedy, in order: a ring's links
    take two rounds, three when the ring is odd)."""
    rounds: list[list[tuple[T, T]]] = []
    busy: list[set[T]] = []
    for a, b in pairs:
        for i, used in enumerate(busy):
            if a not in used and b not in used:
                rounds[i].append((a, b))
                used.update((a, b))
                break
        else:
            rounds.append([(a, b)])
            busy.append({a, b})
    return rounds

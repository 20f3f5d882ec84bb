"""The ring order: the bottleneck travelling-salesman search against brute force."""

from __future__ import annotations

import itertools
import random
import time

import pytest

from mlxops.bench.ring import (
    best_ring,
    hamiltonian_cycle,
    ring_bottleneck,
    symmetric,
    upper_bound,
)


def brute_force(w) -> float:
    n = len(w)
    return max(ring_bottleneck([0, *p], w) for p in itertools.permutations(range(1, n)))


def random_matrix(n: int, rng: random.Random, levels: int | None = None):
    if levels:  # few distinct speeds: many ties, as real links of one kind have
        return symmetric(n, lambda i, j: float(rng.randint(1, levels)))
    return symmetric(n, lambda i, j: rng.uniform(0.1, 10.0))


def is_ring(order, n):
    return sorted(order) == list(range(n))


@pytest.mark.parametrize("n", range(3, 10))
@pytest.mark.parametrize("seed", range(12))
def test_the_exact_search_matches_brute_force(n, seed):
    rng = random.Random(n * 100 + seed)
    w = random_matrix(n, rng, levels=4 if seed % 2 else None)
    ring = best_ring(w)
    assert is_ring(ring.order, n)
    assert ring.exact
    assert ring.bottleneck == ring_bottleneck(ring.order, w) == brute_force(w)
    assert ring.bottleneck <= ring.bound


@pytest.mark.parametrize("n", range(5, 10))
def test_the_heuristic_finds_the_optimum_on_small_matrices_and_states_its_bound(n):
    rng = random.Random(n)
    for _ in range(5):
        w = random_matrix(n, rng)
        ring = best_ring(w, exact_max=0)
        assert is_ring(ring.order, n)
        assert ring.bottleneck == ring_bottleneck(ring.order, w)
        assert ring.bottleneck <= brute_force(w) <= ring.bound
        assert ring.gap == ring.bound - ring.bottleneck >= 0


def test_one_slow_host_is_used_only_where_it_must_be():
    # Host 3 is slow on every link; one other link (0-1) is a bit slow too.
    n = 8
    w = symmetric(n, lambda i, j: 1.0 if 3 in (i, j) else (3.0 if {i, j} == {0, 1} else 4.0))
    ring = best_ring(w)
    nxt = ring.order[1:] + ring.order[:1]
    speeds = sorted(w[a][b] for a, b in zip(ring.order, nxt, strict=True))
    assert speeds[:2] == [1.0, 1.0] and speeds[2:] == [4.0] * 6


def test_a_host_with_one_fast_link_bounds_the_ring():
    w = symmetric(5, lambda i, j: 1.0 if 4 in (i, j) and {i, j} != {0, 4} else 9.0)
    assert upper_bound(w) == 1.0
    assert best_ring(w).bottleneck == 1.0


def test_no_hamiltonian_cycle_in_a_star_or_two_triangles():
    star = [0b11110, 0b00001, 0b00001, 0b00001, 0b00001]
    assert hamiltonian_cycle(star) is None
    # Two triangles joined by one edge (2-3): no cycle visits all six.
    edges = [(0, 1), (1, 2), (0, 2), (3, 4), (4, 5), (3, 5), (2, 3)]
    adj = [0] * 6
    for a, b in edges:
        adj[a] |= 1 << b
        adj[b] |= 1 << a
    assert hamiltonian_cycle(adj) is None
    adj[0] |= 1 << 5
    adj[5] |= 1
    cycle = hamiltonian_cycle(adj)
    assert cycle is not None and sorted(cycle) == list(range(6))
    assert all(adj[a] >> b & 1 for a, b in zip(cycle, cycle[1:] + cycle[:1], strict=True))


@pytest.mark.parametrize("n", [0, 1, 2])
def test_tiny_rings(n):
    w = symmetric(n, lambda i, j: 5.0)
    ring = best_ring(w)
    assert ring.order == list(range(n))
    assert ring.bottleneck == (5.0 if n == 2 else float("inf"))


def test_sixteen_hosts_are_exact_in_seconds_and_twenty_are_heuristic():
    rng = random.Random(16)
    w = random_matrix(16, rng)
    start = time.monotonic()
    ring = best_ring(w)
    assert ring.exact and is_ring(ring.order, 16)
    assert time.monotonic() - start < 30
    w20 = random_matrix(20, rng, levels=6)
    ring20 = best_ring(w20)
    assert is_ring(ring20.order, 20) and ring20.bottleneck <= ring20.bound

"""The bench's schedule: every pair once, no host twice in a round (circle method)."""

from __future__ import annotations

import itertools

import pytest

from mlxops.bench.schedule import disjoint_rounds, ring_edges, round_robin


@pytest.mark.parametrize("n", range(2, 18))
def test_round_robin_covers_every_pair_once_and_no_host_twice_in_a_round(n):
    hosts = [f"h{i}" for i in range(n)]
    rounds = round_robin(hosts)
    assert len(rounds) == (n - 1 if n % 2 == 0 else n)
    seen = [frozenset(p) for r in rounds for p in r]
    assert len(seen) == len(set(seen))
    assert set(seen) == {frozenset(p) for p in itertools.combinations(hosts, 2)}
    for r in rounds:
        members = [h for pair in r for h in pair]
        assert len(members) == len(set(members)), r
        assert len(r) == n // 2


def test_fewer_than_two_hosts_have_no_pairs():
    assert round_robin([]) == [] and round_robin(["a"]) == []


@pytest.mark.parametrize("n,rounds", [(2, 1), (3, 3), (4, 2), (5, 3), (8, 2), (9, 3)])
def test_a_rings_links_in_disjoint_rounds(n, rounds):
    order = list(range(n))
    edges = ring_edges(order)
    assert len(edges) == (1 if n == 2 else n)
    got = disjoint_rounds(edges)
    assert len(got) == rounds
    assert sorted(p for r in got for p in r) == sorted(edges)
    for r in got:
        members = [h for pair in r for h in pair]
        assert len(members) == len(set(members))

"""The bench's time budget: the plan of the network phases (its arithmetic, in
mlxops/bench/budget.py's docstring), the latency time box on the node, and the all-reduce
sweep that stops growing (a one-rank group: the decision, not the speed)."""

from __future__ import annotations

import mlx.core as mx
import pytest
from bench_server import server  # noqa: F401 - the fixture: a bench server in a thread

from mlxops.bench import budget
from mlxops.bench.measure import Settings
from mlxops.bench.run import parse_sizes
from mlxops.node import protocol
from mlxops.node.allreduce import sweep
from mlxops.node.netclient import measure_latency
from mlxops.node.protocol import bench as benchproto


@pytest.mark.parametrize("hosts", [2, 4, 8])
def test_the_network_phases_take_their_share_of_the_budget(hosts):
    planned = budget.plan(30.0, hosts, Settings(streams=budget.BUDGET_STREAMS))
    assert planned.seconds >= budget.MIN_SECONDS and planned.omit == pytest.approx(
        planned.seconds / 2, abs=1e-3)
    assert planned.latency_seconds == budget.LATENCY_SECONDS
    took = budget.network_seconds(hosts, planned)
    assert took == pytest.approx(budget.NET_SHARE * 30.0, abs=0.05)


def test_eight_hosts_at_30_s_as_the_docstring_says():
    planned = budget.plan(30.0, 8, Settings(streams=(4,)))
    assert (planned.seconds, planned.omit) == (0.314, 0.157)
    assert budget.pair_rounds(8, False) == 7 and budget.pair_rounds(8, True) == 2


def test_a_larger_cluster_keeps_the_shortest_useful_run_and_says_it_runs_over():
    planned = budget.plan(30.0, 16, Settings(streams=(4,)))
    assert planned.seconds == budget.MIN_SECONDS
    assert budget.network_seconds(16, planned) > budget.NET_SHARE * 30.0


def test_the_plan_never_lengthens_a_run_beyond_what_was_asked():
    planned = budget.plan(600.0, 2, Settings(streams=(4,), seconds=1.0))
    assert planned.seconds == 1.0


def test_the_sweep_gets_what_is_left_but_never_nothing():
    assert budget.sweep_budget(30.0, 10.0) == 30.0 - 10.0 - budget.SWEEP_START - budget.SWEEP_END
    assert budget.sweep_budget(30.0, 40.0) == budget.MIN_SWEEP


def test_a_time_boxed_latency_takes_at_least_its_minimum_of_round_trips(server):  # noqa: F811
    boxed = measure_latency("127.0.0.1", server, seconds=1e-9)
    assert boxed.count == benchproto.LATENCY_MIN_ROUNDS
    whole = measure_latency("127.0.0.1", server, seconds=0)
    assert whole.count == benchproto.LATENCY_ROUNDS


def test_the_node_parses_the_time_box_the_controller_asks_for():
    argv = benchproto.client_args(peer="10.0.0.3", port=1, latency=True, modes=["up"],
                                  streams=[4], seconds=0.3, omit=0.15, latency_seconds=0.25)
    assert protocol.parser().parse_args(argv).latency_seconds == 0.25
    unboxed = benchproto.client_args(peer="10.0.0.3", port=1, latency=True, modes=["up"],
                                     streams=[4], seconds=0.3, omit=0.15)
    assert "--latency-seconds" not in unboxed


def test_the_sweep_stops_growing_when_the_next_size_would_not_fit():
    group = mx.distributed.init()   # one rank: no peers, the same decisions
    sizes = list(parse_sizes("4K..64K"))
    beats: list[int] = []
    every = sweep(sizes, group, target=0.001, min_iters=1, max_iters=2, beat=beats.append)
    # each size: all_sum ("results"), then all_gather of that size (one rank: its block)
    assert [r["bytes"] for r in every["results"]] == sizes
    assert [r["bytes"] for r in every["all_gather"]] == sizes
    stopped = sweep(sizes, group, target=0.001, min_iters=1, max_iters=2, beat=beats.append,
                    budget=1e-6)
    for rows in stopped.values():   # the largest size reached: the first, for both
        assert [r["bytes"] for r in rows] == sizes[:1]
    assert all(r["wrong"] == 0 for got in (every, stopped) for rows in got.values()
               for r in rows)


def test_a_slow_round_measured_shortens_the_runs_not_the_budget():
    idle = budget.plan(30.0, 8, Settings(streams=(4,)))
    busy = budget.plan(30.0, 8, Settings(streams=(4,)), round_cost=0.6)
    assert budget.MIN_SECONDS <= busy.seconds < idle.seconds
    assert budget.network_seconds(8, busy, round_cost=0.6) == pytest.approx(15.0, abs=0.05)
    # Measured faster than the floor: the floor stands.
    assert budget.plan(30.0, 8, Settings(streams=(4,)), round_cost=0.1) == idle

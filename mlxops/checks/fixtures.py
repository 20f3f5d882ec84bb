"""The fixtures the checks (and users' checks) get, beside testinfra's ``host``.

A module of fixtures, registered by :class:`~mlxops.checks.plugin.MlxopsPlugin` (pytest
wants fixtures at module level); each finds the session's plugin in the config's stash.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from mlxops.checks.cluster import Cluster
    from mlxops.checks.plugin import MlxopsPlugin
    from mlxops.checks.state import NodeState

PLUGIN: pytest.StashKey[MlxopsPlugin] = pytest.StashKey()


def _plugin(request: pytest.FixtureRequest) -> MlxopsPlugin:
    return request.config.stash[PLUGIN]


@pytest.fixture(scope="session")
def cluster(request: pytest.FixtureRequest) -> Cluster:
    """Every checked host's state (read once, in parallel) and the check's target."""
    return _plugin(request).read_hosts()


@pytest.fixture
def node(host: Any, cluster: Cluster) -> NodeState:
    """The state of the host this test runs for (``host`` is testinfra's)."""
    return cluster.state(host.backend.get_hostname())


@pytest.fixture(scope="session")
def ring_reach(cluster: Cluster) -> Cluster:
    """``cluster`` once every pair of hosts tried each other's ring ports."""
    if not cluster.reached:
        cluster.probe_reach()
    return cluster


@pytest.fixture(scope="session")
def all_sum(ring_reach: Cluster) -> Cluster:
    """``cluster`` once one real ``all_sum`` ran across every rank (after the reach test:
    a pair that cannot connect would only hang it until its stall timeout)."""
    if ring_reach.all_sum is None and not ring_reach.all_sum_skipped:
        ring_reach.run_all_sum()
    return ring_reach


@pytest.fixture(scope="session")
def collectives(all_sum: Cluster) -> Cluster:
    """``cluster`` once the collectives check ran across every rank (after the all_sum:
    a cluster whose all_sum fails has its problem named there)."""
    if all_sum.collectives is None and not (all_sum.collectives_skipped
                                            or all_sum.collectives_error):
        all_sum.run_collectives()
    return all_sum


@pytest.fixture(autouse=True)
def _mlxops_host_reachable(request: pytest.FixtureRequest) -> None:
    """A test of a host that could not be read errors (or skips, host key untrusted)."""
    _plugin(request).before_test(request.node)

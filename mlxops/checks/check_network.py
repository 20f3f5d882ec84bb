"""The data path of a job of several hosts: on a Mac, the link its data address
(``mlxops_ip``, else ``ansible_host``) is on, by :mod:`mlxops.datalink`'s rule: not Wi-Fi,
and not SSH's slower link while a Thunderbolt port has an address."""

from __future__ import annotations

from mlxops.checks import when
from mlxops.datalink import data_link_finding


def _several_macs(cluster, node) -> bool:
    return len(cluster.target.planned or cluster.target.hosts) > 1 and \
        node.system in ("Darwin", None)


@when(_several_macs)
def check_data_link(node, cluster):
    """The data address is on a fast link: which one, and the faster one there is."""
    finding = data_link_finding(node.facts, node.host.ip, node.host.address)
    if finding:
        raise node.fail(*finding)

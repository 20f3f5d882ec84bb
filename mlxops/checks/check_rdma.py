"""For a jaccl (or jaccl-ring) job or inventory, on each Mac: RDMA over Thunderbolt ready
for the devices its ``mlxops_rdma`` names towards the other hosts. The rule and its
reasons are :mod:`mlxops.rdmaready`'s; a failure is one line per problem, naming the
device and the fix."""

from __future__ import annotations

from mlxops.checks import when
from mlxops.node import protocol
from mlxops.rdmaready import rdma_findings, wanted_devices


def _jaccl_mac(cluster, node) -> bool:
    return (cluster.target.backend in protocol.JACCL_BACKENDS
            and node.system in ("Darwin", None))


@when(_jaccl_mac)
def check_rdma(node, cluster):
    """RDMA enabled, each device of ``mlxops_rdma`` present with its port active, not held
    by the Thunderbolt Bridge, on a Thunderbolt 5 cable, with the limits the job needs."""
    hosts = cluster.target.planned or cluster.target.hosts
    peers = [h.name for h in hosts if h.name != node.name]
    findings = rdma_findings(node.facts, wanted_devices(node.host.var("mlxops_rdma"), peers))
    if findings:
        raise node.fail("; ".join(f.line for f in findings))

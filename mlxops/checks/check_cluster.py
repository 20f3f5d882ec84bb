"""Across the hosts: the same mlx, Python and macOS build; mlx-lm where it is needed;
every pair reaching the other on
the ring ports; mpirun at the same path when the backend is mpi; one real ``all_sum``
across every rank; the collectives a job trusts with data (all of them without
``--job``) answering right. Each is asserted per host,
so the table and JUnit name the host that differs."""

from __future__ import annotations

from dataclasses import replace

import pytest

from mlxops.checks import when
from mlxops.node import protocol
from mlxops.readiness import (
    HostSaid,
    Versions,
    agreement,
    backend_findings,
    findings_of,
    joined,
    mlx_lm_findings,
    mlx_lm_pin,
    mlx_lm_pin_source,
    mpi_findings,
    pinned_version,
)


def _several(cluster, node) -> bool:
    return len(cluster.target.hosts) > 1


def _versions(state) -> Versions:
    """A host's versions for the interpreter jobs run, its mlx its pin: an mlx that is not
    its pin is check_mlx's finding; here, pins that differ."""
    return replace(Versions.from_facts(state.name, state.facts),
                   mlx=pinned_version(state.host))


@when(_several)
def check_versions_agree(node, cluster):
    """mlx, Python (major.minor) and macOS build are the same as on the other hosts."""
    nodes = [_versions(s) for s in cluster.answered()]
    if len(nodes) < 2:
        pytest.skip("no other host answered to compare with")
    agreed = agreement(nodes, pinned_version(cluster.target.hosts[0]))
    findings = findings_of(agreed.findings, node.name)
    if findings:
        raise node.fail(*joined(findings))


def _needs_mlx_lm(cluster, node) -> bool:
    """The inventory asks for mlx-lm on the host, or the checked job runs mlx-lm's code."""
    job = cluster.target.job
    return ((job is not None and job.needs_mlx_lm)
            or node.host.var("mlxops_mlx_lm") is not False)


@when(_needs_mlx_lm)
def check_mlx_lm(node, cluster):
    """The interpreter jobs run has mlx-lm at its pin (``mlxops_mlx_lm: <version>``, else
    the controller's), the same as on the other hosts that need it."""
    if not node.interpreter.version:
        pytest.skip("no interpreter (see check_interpreter)")
    needing = [s for s in cluster.answered() if _needs_mlx_lm(cluster, s)]
    nodes = [Versions.from_facts(s.name, s.facts) for s in needing]
    findings = findings_of(mlx_lm_findings(nodes, mlx_lm_pin(node.host),
                                           mlx_lm_pin_source(node.host)), node.name)
    if findings:
        raise node.fail(*joined(findings))


def _ring(cluster, node) -> bool:
    return len(cluster.target.hosts) > 1 and bool(cluster.target.ports.get(node.name))


@when(_ring)
def check_ring_reach(node, ring_reach):
    """This host and every other reach each other's ``mlxops_ip`` on the ring ports (both
    directions, every port), tested by listening and connecting on the nodes themselves."""
    cluster = ring_reach
    answer = node.need(node.reach if node.reach is not None else
                       "the node helpers did not answer", "the reach test")
    ports = cluster.target.ports
    problems = []
    others = [s for s in cluster.answered()
              if s.name != node.name and isinstance(s.reach, protocol.ReachAnswer)]
    if not others:
        pytest.skip("no other host took part in the reach test")
    for peer in others:
        if set(ports[peer.name]) - set(answer.reached.get(peer.name, [])):
            why = answer.unreached.get(peer.name, "no answer")
            problems.append(f"cannot reach {peer.name} ({why})")
        theirs = peer.reach
        if set(ports[node.name]) - set(theirs.reached.get(node.name, [])):
            why = theirs.unreached.get(node.name, "no answer")
            problems.append(f"{peer.name} cannot reach it ({why})")
    if problems:
        raise node.fail("; ".join(problems), "let the nodes connect to each other's "
                                             "mlxops_ip on the ring ports (a firewall?)")


@when(lambda cluster, node: sum(h.slots for h in cluster.target.hosts) > 1
      and cluster.target.backend not in protocol.JACCL_BACKENDS)
def check_all_sum(node, all_sum):
    """One real ``all_sum`` of float32 across every rank of the checked hosts, started as a
    job starts its ranks (the inventory's or the job's backend and ring ports): every rank
    gets n(n+1)/2. It runs once the code is current, the ports free and every host
    answered; until then the check that names the problem fails and this one is skipped.
    (jaccl needs RDMA over Thunderbolt: not run by this check.)"""
    cluster = all_sum
    if cluster.all_sum_skipped:
        pytest.skip(f"all_sum not run: {cluster.all_sum_skipped}")
    if cluster.all_sum:
        raise node.fail(f"all_sum across the checked hosts' ranks failed: {cluster.all_sum}",
                        "run mlxops bench for the links and the all-reduce, "
                        "mlxops logs mlxops-bench while it runs")


def _collectives(cluster, node) -> bool:
    return (sum(h.slots for h in cluster.target.hosts) > 1
            and cluster.target.backend not in protocol.JACCL_BACKENDS
            and bool(cluster.collectives_ops()))


@when(_collectives)
def check_collectives(node, collectives):
    """The collectives the checked job will trust with its data (``all_gather`` for a
    sharded optimizer, ``send``/``recv`` for pipeline stages; without ``--job``, all of
    them) give the right answer on every rank of this host: each rank sends values that
    name it, and the sums, the order of the gathered rows and what each neighbour sent
    are checked (mlxops/node/collectives.py), on the backend and ring ports a job uses."""
    cluster = collectives
    if cluster.collectives_skipped:
        pytest.skip(f"collectives not checked: {cluster.collectives_skipped}")
    if cluster.collectives_error:
        raise node.fail(f"the collectives check did not run: {cluster.collectives_error}")
    wrong = (cluster.collectives or {}).get(node.name, [])
    if wrong:
        raise node.fail(f"{cluster.collectives_line} (on this host: {wrong[0]})",
                        "run jobs that use these collectives on another backend or MLX "
                        "version (docs/node-protocol.md, Collectives check)")


@when(lambda cluster, node: cluster.target.backend == protocol.MPI)
def check_mpirun(node, cluster):
    """mpirun on the host of rank 0, and at the same path on every other host (mpirun's
    ``--prefix`` tells the others' orted where Open MPI is), as pre-flight requires."""
    ready = node.need(node.ready, "the node's answer (mlxops.node ready)")
    first = cluster.target.first
    said = {node.name: HostSaid.from_ready(node.name, node.facts.system, ready)}
    if node.name != first:
        launcher = cluster.states[first].ready
        if not isinstance(launcher, protocol.ReadyAnswer):
            pytest.skip(f"{first} (rank 0, where mpirun starts) did not answer")
        said[first] = HostSaid.from_ready(first, None, launcher)
    findings = findings_of(mpi_findings(said, first), node.name)
    if findings:
        raise node.fail(*joined(findings))


@when(lambda cluster, node: cluster.target.backend in protocol.JACCL_BACKENDS)
def check_backend_system(node, cluster):
    """The host can run the backend: jaccl and jaccl-ring need macOS (RDMA over
    Thunderbolt 5), as pre-flight requires."""
    findings = backend_findings(HostSaid(node.name, node.facts.system),
                                cluster.target.backend)
    if findings:
        raise node.fail(*joined(findings))


@when(lambda cluster, node: cluster.target.webhook is not None
      and node.name == cluster.target.webhook.host)
def check_supervisor_reaches_webhook(node, cluster):
    """The job's supervisor host (``supervisor:`` / ``mlxops_supervisor``) opens a TCP
    connection to its webhook's address: a job supervised on a node notifies from there
    (docs/supervisor.md)."""
    hook = cluster.target.webhook
    why = node.webhook  # "" when it reached it (a str here is an answer, not a reason)
    if why is None:
        pytest.skip("the host was not asked (not read)")
    if why:
        raise node.fail(f"the job's supervisor cannot reach its webhook at {hook.address}:"
                        f"{hook.port} ({why})",
                        "notifications are sent from the supervisor host: give the webhook "
                        "an address that host reaches, or supervise from the controller")

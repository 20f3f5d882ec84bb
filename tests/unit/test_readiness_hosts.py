"""One readiness rule set (mlxops/readiness.py, its host rules): everything pre-flight
refuses a host for is what ``mlxops check --job`` reports on that host, with the same line.

Both sides read the node's own answers, asked here as a node answers them (its real
``preflight`` and ``ready`` commands, tests/unit/node_answers.py): a rank of the job left
running (a live process in its run directory), a ring port and a server's port held by a
listening socket, mpirun missing from rank 0's host (the node searched a PATH without it),
a jaccl job on Linux nodes. Pre-flight's refusal (check_preflight) must carry every line
the checks raise, and the checks must raise one for each host pre-flight names."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
import yaml
from node_answers import Processes, make_run_dir, node_answer

from mlxops.checks import NotReady, check_cluster, check_resources
from mlxops.checks.cluster import Cluster
from mlxops.checks.state import NodeState
from mlxops.checks.target import load_target
from mlxops.hostfacts import HostFacts
from mlxops.jobs.placement import place_ranks
from mlxops.jobs.preflight import HostPrep, PreflightError, check_preflight
from mlxops.node import protocol

CHECKS = [check_resources.check_leftover_ranks, check_resources.check_ring_ports,
          check_resources.check_serve_port, check_cluster.check_mpirun,
          check_cluster.check_backend_system]


def free_port_pair() -> int:
    """A port P with P and P+1 free here."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port < 65000:
            try:
                with socket.socket() as t:
                    t.bind(("127.0.0.1", port + 1))
                return port
            except OSError:
                continue
    raise AssertionError("no two free ports")


def write(tmp_path: Path, job: dict, host_vars: dict | None = None,
          **inventory_vars) -> tuple[Path, Path]:
    hosts = {name: {"ansible_host": "127.0.0.1", **(host_vars or {}).get(name, {})}
             for name in ("mac1", "mac2")}
    inventory = tmp_path / "inventory.yml"
    inventory.write_text(yaml.safe_dump({"all": {
        "vars": {"mlxops_root": str(tmp_path / "roots"), **inventory_vars},
        "hosts": hosts}}))
    path = tmp_path / "tiny.yml"
    path.write_text(yaml.safe_dump({"name": "tiny", "inventory": "inventory.yml", **job}))
    return inventory, path


def refusals_and_findings(tmp_path: Path, job: dict, *, leftover: str | None = None,
                          no_mpirun: str | None = None, monkeypatch=None,
                          host_vars: dict | None = None, **inventory_vars):
    """Pre-flight's problems (each a line) and the checks' findings (host -> lines), from
    the nodes' own answers to the questions the rules ask."""
    inventory, job_path = write(tmp_path, job, host_vars, **inventory_vars)
    target = load_target(inventory, job_path=job_path)
    spec = target.job
    ranks = place_ranks(list(target.planned), spec.base_port,
                        one_per_host=spec.workload.one_rank_per_host)
    cluster = Cluster(target, connector=None)
    preps = {}
    with Processes() as procs:
        for host in target.hosts:
            root = tmp_path / "roots" / host.name
            run_dir = root / protocol.RUNS_DIR / spec.name
            make_run_dir(run_dir, {"ranks": {0: {"pid": "alive"}}} if host.name == leftover
                         else {}, procs)
            asked = target.questions(host)
            if host.name == no_mpirun:
                monkeypatch.setenv("PATH", str(tmp_path))  # nothing there: no mpirun
            pre = node_answer(protocol.preflight_args(
                str(run_dir), ip=asked.ip, ports=asked.ports, mpi=asked.mpi))
            ready = node_answer(protocol.ready_args(
                str(root), ip=asked.ip, ports=asked.ports, mpi=asked.mpi))
            if host.name == no_mpirun:
                monkeypatch.undo()
            facts = HostFacts.unknown()
            facts.system = pre.system
            preps[host.name] = HostPrep(host, str(root), "/py", pre, asked)
            cluster.states[host.name] = NodeState(host, facts=facts, ready=ready)
    try:
        check_preflight(spec, preps, ranks, resume=False)
        refused: list[str] = []
    except PreflightError as exc:
        refused = str(exc).removeprefix("pre-flight failed: ").split("; ")
    found: dict[str, list[str]] = {}
    for check in CHECKS:
        for name, state in cluster.states.items():
            applies = getattr(check, "mlxops_when", None)
            if applies is not None and not applies(cluster, state):
                continue
            try:
                check(state, cluster) if check is not check_resources.check_leftover_ranks \
                    else check(state)
            except NotReady as exc:
                found.setdefault(name, []).append(exc.line)
    return refused, found


def versions_only(lines: list[str]) -> list[str]:
    """Pre-flight also compares versions (mlxops.readiness, tested on its own)."""
    return [line for line in lines if " mlx " not in line and "python" not in line]


def assert_same(refused: list[str], found: dict[str, list[str]], hosts: set[str]) -> None:
    refused = versions_only(refused)
    assert refused, "pre-flight refused nothing"
    assert {line.split(":")[0] for line in refused} == hosts == set(found)
    reported = [line for lines in found.values() for line in lines]
    assert sorted(refused) == sorted(reported)


def test_a_leftover_rank_and_a_busy_ring_port(tmp_path):
    base = free_port_pair()
    with socket.create_server(("127.0.0.1", base + 1)):   # mac2's ring port, held
        refused, found = refusals_and_findings(
            tmp_path, {"port": base, "trainer": {"model": {"dims": 32, "layers": 1,
                                                           "heads": 2, "vocab_size": 256,
                                                           "seq_len": 16}}},
            leftover="mac1")
    assert_same(refused, found, {"mac1", "mac2"})
    assert any(line.startswith("mac1: job tiny: rank 0 (pid ") for line in found["mac1"])
    assert found["mac2"] == [f"mac2: ring port {base + 1} on 127.0.0.1 in use: stop what "
                             "holds them (another job? mlxops status), or set another "
                             "port: in tiny.yml"]


def test_a_busy_server_port(tmp_path):
    port = free_port_pair()
    with socket.create_server(("127.0.0.1", port)):
        refused, found = refusals_and_findings(
            tmp_path, {"serve": {"model": "/models/tiny", "port": port}},
            mlxops_mlx_lm=True)
    assert_same(refused, found, {"mac1"})
    assert found["mac1"] == [f"mac1: serve.port {port} on 127.0.0.1 in use (another "
                             "server?): stop what holds it, or set another serve.port in "
                             "tiny.yml"]


def test_mpirun_missing_on_rank_0s_host(tmp_path, monkeypatch):
    refused, found = refusals_and_findings(
        tmp_path, {"backend": "mpi", "trainer": {"model": {"dims": 32, "layers": 1,
                                                           "heads": 2, "vocab_size": 256,
                                                           "seq_len": 16}}},
        no_mpirun="mac1", monkeypatch=monkeypatch)
    assert_same(refused, found, {"mac1"})
    assert found["mac1"][0].startswith("mac1: mpirun not found (")


def test_jaccl_on_nodes_that_are_not_macs(tmp_path):
    refused, found = refusals_and_findings(
        tmp_path, {"backend": "jaccl", "trainer": {"model": {
            "dims": 32, "layers": 1, "heads": 2, "vocab_size": 256, "seq_len": 16}}},
        host_vars={"mac1": {"mlxops_rdma": {"mac2": "rdma_en3"}},
                   "mac2": {"mlxops_rdma": {"mac1": "rdma_en3"}}})
    assert_same(refused, found, {"mac1", "mac2"})
    assert found["mac2"] == ["mac2: runs Linux, the jaccl backend needs macOS with RDMA over "
                             "Thunderbolt 5: choose Macs with Thunderbolt 5 for this job, or "
                             "backend: ring"]


@pytest.mark.parametrize("check", CHECKS)
def test_every_rule_is_a_check(check):
    assert check.__doc__ and "pre-flight" in check.__doc__

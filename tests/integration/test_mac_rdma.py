"""RDMA readiness and the data link end to end: ``mlxops check`` of a jaccl inventory on
Mac-like sandbox nodes, whose ``rdma_ctl``, ``ibv_devinfo``, ``system_profiler``,
``networksetup`` and ``ifconfig`` answer from output recorded on real Macs
(mlxops/sandbox/darwin/recorded/README.md), broken one fault at a time as real Macs break
(mlxops/sandbox/darwin/macrdma.py): each problem is reported on its node with its fix; a
good set passes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from cli_helpers import mlxops


@pytest.fixture(scope="module")
def jaccl_inventory(mac_sandbox, tmp_path_factory) -> Path:
    """The Mac-like sandbox's inventory as a jaccl cluster: each node reaches the other
    over ``rdma_en2``."""
    doc = yaml.safe_load(mac_sandbox.inventory_path.read_text())
    doc["all"]["vars"]["mlxops_backend"] = "jaccl"
    hosts = doc["all"]["children"]["sandbox"]["hosts"]
    hosts["node1"]["mlxops_rdma"] = {"node2": "rdma_en2"}
    hosts["node2"]["mlxops_rdma"] = {"node1": "rdma_en2"}
    path = tmp_path_factory.mktemp("rdma") / "inventory.yml"
    path.write_text(yaml.safe_dump(doc))
    return path


CHECKS = ("check_rdma", "check_data_link", "check_macos_release")


def results_of(tmp_path: Path, inventory: Path, check: str) -> dict[str, dict]:
    done = mlxops(tmp_path, "check", str(inventory), "--json", timeout=180)
    assert done.returncode in (0, 1), done.stdout[-2000:] + done.stderr[-2000:]
    return {r["host"]: r for r in json.loads(done.stdout)["results"] if r["check"] == check}


@pytest.mark.parametrize("fault, check, found, fix", [
    ("rdma-off", "check_rdma", "RDMA is disabled", "rdma_ctl enable"),
    ("tb4", "check_rdma", "40 Gb/s", "Thunderbolt 5"),
    ("bridge", "check_rdma", "rdma_en2: en2 is held by the Thunderbolt Bridge",
     "'Thunderbolt Bridge' off"),
    ("wifi", "check_data_link", "en0 (Wi-Fi)", "thunderbolt_ips"),
    ("beta", "check_macos_release", "build 25A5316i is a beta", "release build"),
    ("beta", "check_versions_agree", "25A5316i", "macOS"),   # a mix of builds
])
def test_check_reports_each_fault_on_its_node_with_the_fix(mac_sandbox, jaccl_inventory,
                                                           tmp_path, fault, check, found, fix):
    try:
        mac_sandbox.mac_faults("node2", fault)
        results = results_of(tmp_path, jaccl_inventory, check)
    finally:
        mac_sandbox.mac_faults("node2")
    assert results["node1"]["outcome"] == "passed", results
    assert results["node2"]["outcome"] == "failed", results
    message = json.dumps(results["node2"])
    assert found in message and fix in message, message


@pytest.mark.parametrize("check", CHECKS)
def test_a_good_set_passes(mac_sandbox, jaccl_inventory, tmp_path, check):
    results = results_of(tmp_path, jaccl_inventory, check)
    assert {h: r["outcome"] for h, r in results.items()} == {"node1": "passed",
                                                             "node2": "passed"}, results

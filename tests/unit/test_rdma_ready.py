"""RDMA readiness (mlxops/rdmaready.py) over facts parsed from output recorded on real Macs
(mlxops/sandbox/darwin/recorded/README.md names the sources: ibv_devinfo, networksetup and
system_profiler from two M5 Max MacBook Pros on macOS 27.0, osaurus-ai/osaurus's
DistributedFixtures.swift; rdma_ctl's answer from jundot/omlx#3037 and ml-explore/mlx#3777),
as the Mac-like sandbox node's tools answer them (mlxops/sandbox/darwin/macrdma.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from mlxops import macnet
from mlxops.hostfacts import HostFacts
from mlxops.rdmaready import REBOOT, rdma_findings, wanted_devices
from mlxops.sandbox import darwin
from mlxops.sandbox.darwin import macrdma, shim
from mlxops.tasks import facts as F

RECORDED = Path(darwin.__file__).parent / "recorded"
WANTED = {"rdma_en2": ["mac2"]}


def mac_facts(node: Path, *faults: str) -> HostFacts:
    """The facts of a Mac-like node with these faults, through the facts parsers."""
    (node / "faults").write_text("".join(f + "\n" for f in faults))
    ifconfig = shim.ifconfig([("10.0.0.1", 24)], "02:00:00:00:00:09", RECORDED)
    # The shim reads its own node directory; the bridge stanza is the fault's.
    ifconfig += macrdma.bridge_stanza(RECORDED, node)
    sections = {
        "uname": "Darwin\narm64\nmac1", "home": "/Users/mlx",
        "sw_vers": shim.sw_vers([], RECORDED), "ifconfig": ifconfig,
        "hardwareports": macrdma.networksetup(["-listallhardwareports"], RECORDED, node),
        "rdma_ctl": macrdma.rdma_ctl(["status"], RECORDED, node),
        "ibv_devinfo": macrdma.ibv_devinfo(["-v"], RECORDED, node),
        "thunderbolt": macrdma.system_profiler(["SPThunderboltDataType", "-json"], RECORDED,
                                               node),
    }
    return F.build_facts(sections, "~/.mlxops")


def test_the_recorded_outputs_parse():
    ports = macnet.parse_hardware_ports(
        (RECORDED / "networksetup-listallhardwareports.txt").read_text())
    assert ports["en2"] == "Thunderbolt 3" and ports["en0"] == "Wi-Fi"
    assert ports["bridge0"] == "Thunderbolt Bridge"
    devices = macnet.parse_ibv_devinfo((RECORDED / "ibv_devinfo.txt").read_text())
    assert [(d.name, d.port_state, d.link_layer) for d in devices] == [
        ("rdma_en1", "PORT_DOWN", "Thunderbolt"), ("rdma_en6", "PORT_DOWN", "Thunderbolt"),
        ("rdma_en2", "PORT_DOWN", "Thunderbolt")]
    assert devices[2].interface == "en2" and devices[2].max_qp is None  # not -v
    links = macnet.parse_thunderbolt_links(
        (RECORDED / "system_profiler-SPThunderboltDataType.json").read_text())
    # The dock on bus 2 (40 Gb/s) is not a Mac: only the cable to the other Mac counts.
    assert [(x.bus, x.speed_gbps, x.peer) for x in links] == [
        ("thunderboltusb4_bus_1", 80, "MacBook Pro")]
    assert macnet.parse_rdma_ctl("enabled\n") is True
    assert macnet.parse_rdma_ctl("disabled\n") is False
    assert macnet.parse_rdma_ctl("") is None


def test_a_good_mac_is_ready_and_round_trips_through_json(tmp_path):
    facts = mac_facts(tmp_path)
    assert facts.rdma.enabled is True
    device = facts.rdma.device("rdma_en2")
    assert (device.port_state, device.max_qp, device.max_pd, device.max_mr) == (
        "PORT_ACTIVE", 10, 11, 100)
    assert facts.macos.hardware_ports["en0"].startswith("Ethernet")
    assert rdma_findings(facts, WANTED) == []
    assert HostFacts.from_json(facts.to_json()) == facts


@pytest.mark.parametrize("fault, device, found, fix", [
    ("rdma-off", None, "RDMA is disabled", "rdma_ctl enable"),
    ("tb4", None, "40 Gb/s", "Thunderbolt 5"),
    ("bridge", "rdma_en2", "en2 is held by the Thunderbolt Bridge",
     "networksetup -setnetworkserviceenabled 'Thunderbolt Bridge' off"),
])
def test_each_fault_is_one_finding_with_its_fix(tmp_path, fault, device, found, fix):
    findings = rdma_findings(mac_facts(tmp_path, fault), WANTED)
    assert len(findings) == 1, findings
    assert findings[0].device == device
    assert found in findings[0].found and fix in findings[0].fix


def test_rdma_off_says_reboot(tmp_path):
    (finding,) = rdma_findings(mac_facts(tmp_path, "rdma-off"), WANTED)
    assert finding.fix.endswith(REBOOT)


def test_enabled_without_devices_wants_a_reboot(tmp_path):
    facts = mac_facts(tmp_path)
    facts.rdma.devices = []
    (finding,) = rdma_findings(facts, WANTED)
    assert "no device" in finding.found and finding.fix.startswith(REBOOT)


def test_a_renamed_device_lists_the_ones_there_are(tmp_path):
    (finding,) = rdma_findings(mac_facts(tmp_path), {"rdma_en5": ["mac2"]})
    assert finding.device == "rdma_en5"
    assert "rdma_en1, rdma_en6, rdma_en2" in finding.found and "mac2" in finding.fix


def test_a_port_down_names_the_peer_and_the_reboot(tmp_path):
    (finding,) = rdma_findings(mac_facts(tmp_path), {"rdma_en6": ["mac3"]})
    assert "PORT_DOWN" in finding.found
    assert "mac3" in finding.fix and REBOOT in finding.fix


def test_limits_below_the_peers_a_device_serves(tmp_path):
    facts = mac_facts(tmp_path)
    facts.rdma.device("rdma_en2").max_qp = 1
    assert rdma_findings(facts, {"rdma_en2": ["mac2"]}) == []
    (finding,) = rdma_findings(facts, {"rdma_en2": ["mac2", "mac3"]})
    assert "max_qp 1 < 2" in finding.found


def test_a_mac_without_rdma_ctl_is_told_to_update():
    facts = HostFacts.unknown()
    facts.system, facts.macos_version = "Darwin", "15.6"
    (finding,) = rdma_findings(facts, WANTED)
    assert "26.2" in finding.found


def test_wanted_devices_are_those_towards_the_job_s_peers():
    rdma = {"mac2": "rdma_en2", "mac3": ["rdma_en3", "rdma_en4"], "mac4": "rdma_en5"}
    assert wanted_devices(rdma, ["mac2", "mac3"]) == {
        "rdma_en2": ["mac2"], "rdma_en3": ["mac3"], "rdma_en4": ["mac3"]}

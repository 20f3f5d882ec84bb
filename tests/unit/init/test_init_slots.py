"""``mlxops_slots`` from the facts (mlxops/init/slots.py): one rank on a Mac's GPU, the
cores and memory on MLX's CPU build.

The Mac's facts come from output recorded on a real Mac: the M1 Pro's ``sysctl`` dump
(mlxops/sandbox/darwin/recorded/sysctl.txt: 10 cores, 8 of them performance cores, 32 GiB;
its source in that folder's README.md), ``uname -s``/``-m`` as recorded on an M1 (Darwin,
arm64: the same README). The Linux node's are the facts command's output recorded on a
sandbox node (tests/unit/data/facts/linux_x86_64.txt: 2 CPUs)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from mlxops.init.slots import slots
from mlxops.sandbox import darwin
from mlxops.tasks import facts as F

RECORDED = Path(darwin.__file__).parent / "recorded"
DATA = Path(__file__).resolve().parents[1] / "data" / "facts"
GiB = 2**30


def recorded_mac() -> F.HostFacts:
    sysctl = (RECORDED / "sysctl.txt").read_text()
    return F.build_facts({"uname": "Darwin\narm64\nakasurde-mac", "sysctl": sysctl}, "~")


def test_a_mac_runs_one_rank_on_its_gpu_whatever_its_cores_and_memory():
    mac = recorded_mac()
    assert (mac.chip, mac.perf_cores, mac.cpu_cores, mac.memory_bytes) == \
        ("Apple M1 Pro", 8, 10, 32 * GiB)
    assert slots(mac) == 1
    # the same chip with 4x the cores and memory: still one GPU, one rank
    assert slots(dataclasses.replace(mac, perf_cores=32, cpu_cores=40,
                                     memory_bytes=128 * GiB)) == 1


def test_cpu_hosts_get_a_rank_per_four_cores_within_their_memory():
    node = F.build_facts(F.split_sections((DATA / "linux_x86_64.txt").read_text()), "~")
    assert (node.system, node.cpu_cores, node.ranks_working_set) == ("Linux", 2, None)
    assert slots(node) == 1  # 2 cores: less than one rank's 4, still one rank
    server = dataclasses.replace(node, cpu_cores=16, memory_bytes=64 * GiB)
    assert slots(server) == 4
    assert slots(dataclasses.replace(server, memory_bytes=8 * GiB)) == 2   # memory binds
    assert slots(dataclasses.replace(server, cpu_cores=256, memory_bytes=2048 * GiB)) == 32
    assert slots(dataclasses.replace(server, memory_bytes=None)) == 1     # not said: 1
    # an x86 Mac (no Metal for MLX; no hw.perflevel0): its CPUs, as a CPU host
    intel = dataclasses.replace(recorded_mac(), arch="x86_64", perf_cores=None, cpu_cores=16)
    assert slots(intel) == 4

"""A Linux node's memory is its memory cgroup's limit where that is below its RAM
(mlxops/tasks/facts.py, ``cgroupmem``). The values are what this machine's cgroup v1 files
printed (``memory.limit_in_bytes`` unlimited, and a sandbox node limited to 384 MiB) and
what cgroup v2's ``memory.max`` prints unlimited (``max``)."""

from __future__ import annotations

from pathlib import Path

from mlxops.tasks import facts as F

LINUX = Path(__file__).parent / "data" / "facts" / "linux_x86_64.txt"
UNLIMITED_V1 = "9223372036854771712"


def test_a_limit_below_the_ram_is_the_nodes_memory():
    assert F.parse_cgroup_memory(f"{UNLIMITED_V1}\n402653184\n") == 402653184
    sections = F.split_sections(LINUX.read_text() + "@@mlxops:cgroupmem\n402653184\n")
    assert F.build_facts(sections, "~/.mlxops").memory_bytes == 402653184


def test_no_limit_leaves_the_ram():
    ram = F.build_facts(F.split_sections(LINUX.read_text()), "~/.mlxops").memory_bytes
    for text in (f"{UNLIMITED_V1}\n", "max\n", ""):
        sections = F.split_sections(LINUX.read_text() + f"@@mlxops:cgroupmem\n{text}")
        assert F.build_facts(sections, "~/.mlxops").memory_bytes == ram
    assert F.parse_cgroup_memory("max\n") is None

"""Facts: recorded outputs of the one facts command in, the facts schema out.

``data/facts/*.txt`` are whole outputs of :func:`facts_script` (the Darwin ones
illustrative: written by hand in the tools' formats, see data/facts/README.md; the Linux one
recorded from a sandbox node); ``*.json`` beside each is the facts it must give. Output
recorded on a real Mac goes through the same parsers in test_darwin_shims.py.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from mlxops.tasks import facts as F

DATA = Path(__file__).parent / "data" / "facts"
RECORDED = sorted(DATA.glob("*.txt"))
SCHEMA = {"system", "hostname", "arch", "macos_version", "macos_build", "chip", "memory_bytes",
          "cpu_cores", "perf_cores", "gpu_cores", "python", "interfaces", "disk_free_bytes",
          "root"}


@pytest.mark.parametrize("path", RECORDED, ids=[p.stem for p in RECORDED])
def test_recorded_output_parses_to_expected_facts(path: Path) -> None:
    facts = F.build_facts(F.split_sections(path.read_text()), "~/.mlxops")
    assert facts == json.loads(path.with_suffix(".json").read_text())
    assert SCHEMA <= set(facts)
    assert set(facts["python"]) == {"path", "version", "mlx"}
    assert isinstance(facts["memory_bytes"], int) and isinstance(facts["cpu_cores"], int)
    assert facts["root"].startswith("/")
    for addrs in facts["interfaces"].values():
        assert addrs and all(a.count(".") == 3 for a in addrs)


def test_recorded_files_cover_darwin_and_linux() -> None:
    systems = {F.build_facts(F.split_sections(p.read_text()), "~")["system"] for p in RECORDED}
    assert systems == {"Darwin", "Linux"}


def test_darwin_details() -> None:
    facts = F.build_facts(F.split_sections((DATA / "darwin_m2_ultra.txt").read_text()), "~/x")
    assert facts["macos_build"] == "23E224" and facts["chip"] == "Apple M2 Ultra"
    assert facts["gpu_cores"] == 76 and facts["perf_cores"] == 16
    # bridge0 exists but no cable: not "up" for jaccl's purposes; en5 keeps its address.
    assert facts["macos"] == {"wired_limit_mb": 0, "sleep": 1, "thunderbolt_bridge_up": False}
    assert facts["interfaces"]["en5"] == ["10.0.5.1"] and "bridge0" not in facts["interfaces"]


def test_missing_interpreter_and_sections() -> None:
    facts = F.build_facts({"uname": "Linux\nx86_64\nn1", "home": "/home/u"}, "rel/root")
    assert facts["python"] == {"path": None, "version": None, "mlx": None}
    assert facts["venv"] is None and facts["root"] == "/home/u/rel/root"
    assert facts["memory_bytes"] is None and facts["interfaces"] == {}


@pytest.mark.parametrize("root, home, want", [
    ("~/.mlxops", "/Users/a", "/Users/a/.mlxops"), ("~", "/h", "/h"),
    ("/opt/mlxops", "/h", "/opt/mlxops"), ("data/m", "/h/", "/h/data/m"),
])
def test_absolute_root(root, home, want) -> None:
    assert F.absolute_root(root, home) == want


def test_small_parsers() -> None:
    assert F.parse_gpu_cores('  |   "gpu-core-count" = 10\n') == 10
    assert F.parse_gpu_cores("") is None
    assert F.parse_pmset_sleep(" Sleep On Power Button 1\n sleep  0\n") == 0
    assert F.parse_df("Filesystem 1024-blocks Used Available Capacity Mounted\n/d 10 5 4 50% /") \
        == 4096
    assert F.parse_probe("/usr/bin/python3\nnot json\n") == {
        "path": "/usr/bin/python3", "version": None, "mlx": None}
    assert F.split_sections("junk\n@@mlxops:a\n1\n@@mlxops:b\n") == {"a": "1", "b": ""}


def test_script_quotes_inventory_values(tmp_path: Path) -> None:
    # Hostile mlxops_python / mlxops_root must stay data: run the real script locally.
    marker = tmp_path / "pwned"
    script = F.facts_script(f"python3; touch {marker}", f"~/x'; touch {marker}; '")
    out = subprocess.run(["sh", "-c", script], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0 and not marker.exists()
    facts = F.build_facts(F.split_sections(out.stdout), "~/.mlxops")
    assert facts["python"]["path"] is None and facts["system"] in ("Linux", "Darwin")


def test_cache_roundtrip(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("MLXOPS_HOME", str(tmp_path))
    assert F.load_cached_facts("n1") is None
    path = F.save_facts("n1", {"system": "Linux"})
    assert path == tmp_path / "facts" / "n1.json"
    assert F.load_cached_facts("n1") == {"system": "Linux"}

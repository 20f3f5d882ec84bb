"""The Mac-like sandbox node's tools (mlxops/sandbox/darwin/shim.py) and mlxops's Darwin
parsers, both fed the same output recorded on a real Mac (darwin/recorded/README.md)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from mlxops.hostfacts import MacState
from mlxops.node import host, procs
from mlxops.node.sample import ioreg_gpu, vm_stat_used
from mlxops.sandbox import darwin
from mlxops.sandbox.darwin import shim
from mlxops.tasks import facts as F

RECORDED = Path(darwin.__file__).parent / "recorded"
MAC = shim.recorded_sysctl(RECORDED)
ROOT = {shim.ROOT_MARK: "1"}
FACT_KEYS = ["hw.memsize", "hw.ncpu", "hw.perflevel0.physicalcpu", "machdep.cpu.brand_string",
             "iogpu.wired_limit_mb"]   # as the facts script asks


@pytest.fixture
def node(tmp_path: Path) -> Path:
    """A node's own state directory as `up` makes it."""
    for key, value in darwin.INITIAL_STATE.items():
        (tmp_path / key).write_text(value + "\n")
    return tmp_path


def test_every_recorded_file_names_its_source():
    readme = (RECORDED / "README.md").read_text()
    for path in RECORDED.iterdir():
        if path.name != "README.md":
            assert f"`{path.name}`" in readme, f"{path.name}: no source in README.md"


def test_darwin_facts_from_the_recorded_mac(node):
    """The facts script's Darwin sections, as the shims answer them, parse to that Mac."""
    out, err, code = shim.sysctl(FACT_KEYS, {}, RECORDED, node)
    assert code == 0 and err == ""
    sections = {
        "uname": "".join(shim.uname([f], RECORDED) for f in ("-s", "-m", "-n")),
        "home": "/Users/ml", "sw_vers": shim.sw_vers([], RECORDED), "sysctl": out,
        "ioreg": "\n".join(line for line in shim.ioreg(["-rd1", "-c", "AGXAccelerator"],
                                                       RECORDED).splitlines()
                           if "gpu-core-count" in line),
        "ifconfig": shim.ifconfig([("192.168.1.21", 24)], "3c:a6:f6:00:00:01", RECORDED),
        "pmset": shim.pmset(["-g"], {}, RECORDED, node)}
    facts = F.build_facts(sections, "~/.mlxops")
    assert (facts.system, facts.arch) == ("Darwin", "arm64")
    assert (facts.macos_version, facts.macos_build) == ("14.4.1", "23E224")
    assert facts.chip == "Apple M1 Pro" and facts.memory_bytes == 34359738368
    assert (facts.cpu_cores, facts.perf_cores) == (10, 8)
    assert facts.gpu_cores is None   # the recorded entry is cut before gpu-core-count
    assert facts.interfaces == {"lo0": ["127.0.0.1"], "en0": ["192.168.1.21"]}
    assert facts.macos == MacState(wired_limit_mb=0, sleep=1, thunderbolt_bridge_up=False)
    _, tb = F.parse_ifconfig(sections["ifconfig"])
    assert {n: i["active"] for n, i in tb.items() if n in ("en1", "en3", "en4")} == \
        {"en1": False, "en3": False, "en4": False}


def test_sysctl_keeps_the_wired_limit_and_writes_only_as_root(node):
    assert shim.sysctl(["-n", "hw.pagesize", "hw.memsize"], {}, RECORDED, node)[0] == \
        "16384\n34359738368\n"
    out, err, code = shim.sysctl(["-w", "iogpu.wired_limit_mb=24576"], {}, RECORDED, node)
    assert (out, code) == ("", 1) and "Operation not permitted" in err
    out, err, code = shim.sysctl(["-w", "iogpu.wired_limit_mb=24576"], ROOT, RECORDED, node)
    assert (out, err, code) == ("iogpu.wired_limit_mb: 0 -> 24576\n", "", 0)
    assert shim.sysctl(["iogpu.wired_limit_mb"], {}, RECORDED, node)[0] == \
        "iogpu.wired_limit_mb: 24576\n"
    assert "read only" in shim.sysctl(["hw.memsize=1"], ROOT, RECORDED, node)[1]
    assert shim.sysctl(["no.such"], {}, RECORDED, node)[1:] == \
        ("sysctl: unknown oid 'no.such'\n", 1)
    assert shim.sysctl(["-i", "no.such"], {}, RECORDED, node) == ("", "", 0)


def test_pmset_keeps_sleep_and_changes_it_only_as_root(node):
    assert F.parse_pmset_sleep(shim.pmset(["-g"], {}, RECORDED, node)) == 1
    with pytest.raises(shim.ToolError, match="root"):
        shim.pmset(["-a", "sleep", "0"], {}, RECORDED, node)
    shim.pmset(["-a", "sleep", "0"], ROOT, RECORDED, node)
    shown = shim.pmset(["-g"], {}, RECORDED, node)
    assert F.parse_pmset_sleep(shown) == 0 and "sleep prevented" not in \
        next(line for line in shown.splitlines() if line.startswith(" sleep "))
    assert "displaysleep         10" in shown   # the rest as recorded


def test_uname_and_sw_vers_answer_as_the_recorded_mac():
    everything = shim.uname(["-a"], RECORDED).split()
    assert everything[0] == "Darwin" and everything[2] == "23.4.0"
    assert everything[-1] == "arm64" and MAC["kern.version"] in shim.uname(["-v"], RECORDED)
    assert shim.uname(["-sm"], RECORDED) == "Darwin arm64\n"
    with pytest.raises(shim.ToolError):
        shim.uname(["--all"], RECORDED)
    assert shim.sw_vers(["-productVersion"], RECORDED) == "14.4.1\n"
    assert F.parse_key_values(shim.sw_vers([], RECORDED))["BuildVersion"] == "23E224"


def test_the_monitor_parsers_read_the_recorded_vm_stat_and_ioreg():
    # Activity Monitor's "Memory Used": anonymous - purgeable + wired + compressed pages.
    assert vm_stat_used((RECORDED / "vm_stat.txt").read_text()) == \
        (912210 - 19224 + 165932 + 424276) * 16384
    gpu = ioreg_gpu(shim.ioreg(["-r", "-d", "1", "-w", "0", "-c", "IOAccelerator"], RECORDED))
    assert (gpu.utilization, gpu.renderer, gpu.memory_in_use) == (2.0, 2.0, 340983808)
    assert shim.ioreg(["-c", "IOUSBHostDevice"], RECORDED) == ""


def test_bsd_stat_formats_and_refuses_gnu_options(tmp_path):
    path = tmp_path / "env.sh"
    path.write_text("x=1\n")
    path.chmod(0o640)
    assert shim.bsd_stat(["-f", "%Lp %z %N", str(path)]) == f"640 4 {path}\n"
    with pytest.raises(shim.ToolError, match="illegal option -- c"):
        shim.bsd_stat(["-c", "%a", str(path)])


def test_the_process_table_through_bsd_ps_matches_proc(tmp_path, monkeypatch):
    """procs.py's macOS path (no /proc: ps -A -o pid=,...) on this machine's processes."""
    ps = tmp_path / "ps"
    here = str(Path(shim.__file__).parent)
    ps.write_text(f"#!{sys.executable}\nimport sys\nsys.path.insert(0, {here!r})\nimport shim\n"
                  "shim.REAL_PROC = shim.Path('/proc')\nsys.exit(shim.main(sys.argv))\n")
    ps.chmod(0o755)
    linux = {pid: (ppid, pgid) for pid, ppid, pgid, _, _ in procs.process_table()}
    monkeypatch.setattr(procs, "has_proc", lambda: False)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    mac = procs.process_table()
    mine = next(row for row in mac if row[0] == os.getpid())
    assert mine[1:3] == linux[os.getpid()] and mine[3] in "RS"
    assert mine[4].startswith("python")   # basename of BSD ps's comm (the executable path)
    assert procs.alive(os.getpgrp(), mac)
    assert len(mac) >= len(linux) // 2   # processes come and go between the two reads


def test_ps_output_is_bsd_ps_s():
    out = shim.ps(["-p", str(os.getpid()), "-o", "pid,stat,comm"], Path("/proc"))
    header, row = out.splitlines()
    assert header.split() == ["PID", "STAT", "COMM"] and row.split()[0] == str(os.getpid())
    with pytest.raises(shim.ToolError, match="keyword not found"):
        shim.ps(["-A", "-o", "pid=,nonsense="], Path("/proc"))


def test_host_is_read_from_what_the_node_has(monkeypatch):
    assert host.system() in ("Linux", "Darwin")
    monkeypatch.setattr(host, "PROC_SELF", Path("/nonexistent/self/stat"))
    assert not host.has_proc()


def test_node_code_asks_what_the_node_has_not_what_python_was_built_for():
    """So that a node answering as a Mac takes a Mac's path: platform.system() is asked in
    node/host.py alone (its fallback when there is no uname)."""
    node = Path(host.__file__).parent
    asking = sorted(p.name for p in node.glob("*.py")
                    if "platform.system(" in p.read_text() or "sys.platform" in p.read_text())
    assert asking == ["host.py"]

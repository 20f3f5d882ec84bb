"""Facts: recorded outputs of the one facts command in, the facts schema out.

``data/facts/*.txt`` are whole outputs of :func:`facts_script` (the Darwin ones
illustrative: written by hand in the tools' formats, see data/facts/README.md; the Linux one
recorded from a sandbox node); ``*.json`` beside each is the facts it must give (the
record's JSON form, as the facts cache holds it). Output recorded on a real Mac goes through
the same parsers in test_darwin_shims.py.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import shutil
import subprocess
from pathlib import Path

import pytest

import mlxops
from mlxops.hostfacts import FactsError, HostFacts, Interpreter, MacState
from mlxops.tasks import facts as F

DATA = Path(__file__).parent / "data" / "facts"
RECORDED = sorted(DATA.glob("*.txt"))
SCHEMA = {"system", "hostname", "arch", "macos_version", "macos_build", "chip", "memory_bytes",
          "cpu_cores", "perf_cores", "gpu_cores", "python", "interfaces", "disk_free_bytes",
          "root"}


@pytest.mark.parametrize("path", RECORDED, ids=[p.stem for p in RECORDED])
def test_recorded_output_parses_to_expected_facts(path: Path) -> None:
    facts = F.build_facts(F.split_sections(path.read_text()), "~/.mlxops")
    doc = facts.to_json()
    assert doc == json.loads(path.with_suffix(".json").read_text())
    assert SCHEMA <= set(doc)
    assert set(doc["python"]) == {"path", "version", "mlx", "working_set", "mlx_lm"}
    assert isinstance(facts.memory_bytes, int) and isinstance(facts.cpu_cores, int)
    assert facts.root.startswith("/")
    for addrs in facts.interfaces.values():
        assert addrs and all(a.count(".") == 3 for a in addrs)


def test_recorded_files_cover_darwin_and_linux() -> None:
    systems = {F.build_facts(F.split_sections(p.read_text()), "~").system for p in RECORDED}
    assert systems == {"Darwin", "Linux"}


def test_darwin_details() -> None:
    facts = F.build_facts(F.split_sections((DATA / "darwin_m2_ultra.txt").read_text()), "~/x")
    assert facts.macos_build == "23E224" and facts.chip == "Apple M2 Ultra"
    assert facts.gpu_cores == 76 and facts.perf_cores == 16
    # bridge0 exists but no cable: not "up" for jaccl's purposes; en5 keeps its address.
    # It still holds en2 and en3: jaccl over those ports fails (mlxops/rdmaready.py).
    assert facts.macos == MacState(wired_limit_mb=0, sleep=1, thunderbolt_bridge_up=False,
                                   bridge_members=["en2", "en3"])
    assert facts.interfaces["en5"] == ["10.0.5.1"] and "bridge0" not in facts.interfaces


def test_missing_interpreter_and_sections() -> None:
    facts = F.build_facts({"uname": "Linux\nx86_64\nn1", "home": "/home/u"}, "rel/root")
    assert facts.python == Interpreter(path=None, version=None, mlx=None)
    assert facts.venv is None and facts.root == "/home/u/rel/root"
    assert facts.memory_bytes is None and facts.interfaces == {}


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
    assert F.parse_probe("/usr/bin/python3\nnot json\n") == Interpreter(
        path="/usr/bin/python3", version=None, mlx=None)
    assert F.split_sections("junk\n@@mlxops:a\n1\n@@mlxops:b\n") == {"a": "1", "b": ""}


def test_script_quotes_inventory_values(tmp_path: Path) -> None:
    # Hostile mlxops_python / mlxops_root must stay data: run the real script locally.
    marker = tmp_path / "pwned"
    script = F.facts_script(f"python3; touch {marker}", f"~/x'; touch {marker}; '")
    out = subprocess.run(["sh", "-c", script], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0 and not marker.exists()
    facts = F.build_facts(F.split_sections(out.stdout), "~/.mlxops")
    assert facts.python.path is None and facts.system in ("Linux", "Darwin")


@pytest.mark.skipif(not Path("/proc/meminfo").exists(), reason="the Linux branch")
@pytest.mark.parametrize("sh", [s for s in ("sh", "zsh") if shutil.which(s)])
def test_linux_sections_are_what_the_tools_print(sh: str) -> None:
    # The script reads /proc and /sys with the shell's own `read` and starts one `uname`
    # (fewer processes on every node): each section must be what the tools it replaced
    # print, under sh and under zsh (a Mac's and many a node's login shell).
    out = subprocess.run([sh, "-c", F.facts_script("python3", "~/x")], capture_output=True,
                         text=True, timeout=30)
    assert out.returncode == 0 and out.stderr == ""
    got = F.split_sections(out.stdout)

    def tool(*argv: str) -> str:
        return subprocess.run(argv, capture_output=True, text=True).stdout.rstrip("\n")

    assert got["uname"] == "\n".join(tool("uname", flag) for flag in ("-s", "-m", "-n"))
    assert got["meminfo"] == tool("grep", "MemTotal", "/proc/meminfo")
    assert got["nproc"] == tool("getconf", "_NPROCESSORS_ONLN")
    assert got["cpuinfo"] == tool("grep", "-m1", "model name", "/proc/cpuinfo")
    assert F.parse_cgroup_memory(got["cgroupmem"]) == F.parse_cgroup_memory(
        tool("sh", "-c", _CGROUP_BY_CAT))


# The cgroup section as the script read it before it used the shell's `read`: cat.
_CGROUP_BY_CAT = r"""while IFS=: read -r hid ctl cg; do
  case "$ctl" in
    '') f="/sys/fs/cgroup$cg/memory.max" ;;
    memory|memory,*|*,memory|*,memory,*) f="/sys/fs/cgroup/memory$cg/memory.limit_in_bytes" ;;
    *) continue ;;
  esac
  if [ -r "$f" ]; then cat "$f"; fi
done < /proc/self/cgroup"""


def test_cache_roundtrip(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("MLXOPS_HOME", str(tmp_path))
    assert F.load_cached_facts("n1") is None
    facts = F.build_facts(F.split_sections((DATA / "darwin_m3_max_bridge.txt").read_text()),
                          "~/.mlxops")
    path = F.save_facts("n1", facts)
    assert path == tmp_path / "facts" / "n1.json"
    assert F.load_cached_facts("n1") == facts
    # A cache that does not fit the record (an older schema, a hand edit) counts as none.
    path.write_text(json.dumps({"system": "Linux"}))
    assert F.load_cached_facts("n1") is None
    path.write_text("{not json")
    assert F.load_cached_facts("n1") is None


@pytest.mark.parametrize("path", RECORDED, ids=[p.stem for p in RECORDED])
def test_json_round_trip(path: Path) -> None:
    facts = F.build_facts(F.split_sections(path.read_text()), "~/.mlxops")
    again = HostFacts.from_json(json.loads(json.dumps(facts.to_json())))
    assert again == facts
    assert again.python is not facts.python and isinstance(again.python, Interpreter)
    assert (again.macos is None) == (facts.system != "Darwin")


@pytest.mark.parametrize("drop, named", [
    (("memory_bytes",), "facts: missing field 'memory_bytes'"),
    (("python", "mlx"), "facts.python: missing field 'mlx'"),
    (("macos", "sleep"), "facts.macos: missing field 'sleep'"),
])
def test_a_missing_field_is_named(drop, named) -> None:
    doc = json.loads((DATA / "darwin_m2_ultra.json").read_text())
    *parents, last = drop
    inner = doc
    for key in parents:
        inner = inner[key]
    del inner[last]
    with pytest.raises(FactsError) as err:
        HostFacts.from_json(doc)
    assert str(err.value) == named


def test_misshapen_documents_are_named() -> None:
    doc = json.loads((DATA / "linux_x86_64.json").read_text())
    with pytest.raises(FactsError, match=r"^facts\.python: must not be null$"):
        HostFacts.from_json({**doc, "python": None})
    with pytest.raises(FactsError, match=r"^facts\.venv: expected an object, got str$"):
        HostFacts.from_json({**doc, "venv": "/usr/bin/python3"})
    with pytest.raises(FactsError, match=r"^facts: expected an object, got list$"):
        HostFacts.from_json([])


def test_interpreter_jobs_run_is_the_venv_when_there_is_one() -> None:
    facts = HostFacts.unknown()
    facts.python = Interpreter("/usr/bin/python3", "3.11.7", None)
    assert facts.interpreter() is facts.python
    facts.venv = Interpreter("/r/venv/bin/python", "3.11.7", "0.31.0")
    assert facts.interpreter() is facts.venv


# --- every reader uses attributes: no facts field read by its name as a string ---------

FIELDS = frozenset(f.name for cls in (HostFacts, Interpreter, MacState)
                   for f in dataclasses.fields(cls))
# Names only the facts use: any string literal equal to one is a facts read or write.
OWN = frozenset({"macos_version", "macos_build", "memory_bytes", "cpu_cores", "perf_cores",
                 "gpu_cores", "disk_free_bytes", "wired_limit_mb", "thunderbolt_bridge_up",
                 "working_set"})
# Other records that carry a figure the facts gave, under the same name, in their own JSON
# (docs/formats.md): plan rows in `mlxops plan --json` and the report; the readiness
# agreement's values (compared across hosts, the skew table's columns).
OTHER_RECORDS = {("mlxops/planning.py", "memory_bytes"),
                 ("mlxops/monitor/report.py", "memory_bytes"),
                 ("mlxops/readiness.py", "macos_build")}


def dict_reads_of_facts(source: str) -> list[str]:
    """``x["field"]`` / ``x.get("field")`` where ``x``'s text mentions facts (or the field
    is one only the facts have), and any literal equal to a facts-only name."""
    hits = []
    for node in ast.walk(ast.parse(source)):
        key = receiver = None
        if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
            key, receiver = node.slice.value, node.value
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr in ("get", "setdefault", "pop") and node.args
              and isinstance(node.args[0], ast.Constant)):
            key, receiver = node.args[0].value, node.func.value
        if key in FIELDS and ("facts" in ast.unparse(receiver) or key in OWN):
            hits.append(f"{node.lineno}: {ast.unparse(node)}")
        elif isinstance(node, ast.Constant) and node.value in OWN:
            hits.append(f"{node.lineno}: {node.value!r}")
    return hits


def test_the_scan_finds_dict_reads() -> None:
    assert dict_reads_of_facts('(facts.get("python") or {}).get("mlx")') != []
    assert dict_reads_of_facts('node.facts["root"]') != []
    assert dict_reads_of_facts('current.get("wired_limit_mb")') != []
    assert dict_reads_of_facts('facts.python.mlx; record["root"]') == []


def test_no_facts_field_name_is_a_string_outside_the_record() -> None:
    package = Path(mlxops.__file__).parent
    found = []
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(package.parent).as_posix()
        if rel == "mlxops/hostfacts.py":
            continue
        for hit in dict_reads_of_facts(path.read_text()):
            literal = hit.split(": ", 1)[1].strip("'")
            if (rel, literal) not in OTHER_RECORDS:
                found.append(f"{rel}:{hit}")
    assert found == []


def test_probe_reads_mlx_lm_from_its_dist_info_name(tmp_path: Path) -> None:
    """The facts' probe names the mlx-lm installed from the ``.dist-info`` directory's
    name, the first on sys.path as importlib.metadata finds it; an ``.egg-info`` without
    a version in its name is read by importlib.metadata."""
    import json
    import subprocess
    import sys

    from mlxops.tasks.facts import PROBE

    first, second, egg = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    (first / "mlx_lm-0.31.0.dist-info").mkdir(parents=True)
    (second / "mlx_lm-0.20.1.dist-info").mkdir(parents=True)
    (egg / "mlx_lm.egg-info").mkdir(parents=True)
    (egg / "mlx_lm.egg-info" / "PKG-INFO").write_text("Name: mlx-lm\nVersion: 0.9.3\n")

    def probed(*paths: Path) -> str | None:
        out = subprocess.run([sys.executable, "-S", "-c", PROBE], capture_output=True,
                             text=True, env={"PYTHONPATH": ":".join(map(str, paths))})
        return json.loads(out.stdout)["mlx_lm"]

    assert probed(first, second) == "0.31.0"
    assert probed(second, first) == "0.20.1"
    assert probed(egg) == "0.9.3"

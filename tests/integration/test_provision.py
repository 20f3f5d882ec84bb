"""``mlxops provision`` on the sandbox's real sshd nodes, through the real CLI.

Every test provisions into its own ``mlxops_root`` (an inventory copy with that one var
set) and its own ``MLXOPS_HOME``, so tests never see each other's state, nor other
engineers' tests in the same session. The cold run and its re-run run on bash and on zsh
login shells (``login_sandbox``).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.integration


def inventory_copy(sandbox, tmp_path: Path, root: str, host_vars: dict | None = None) -> Path:
    doc = yaml.safe_load(Path(sandbox.inventory_path).read_text())
    doc["all"]["vars"]["mlxops_root"] = root
    for name, extra in (host_vars or {}).items():
        doc["all"]["children"]["sandbox"]["hosts"][name].update(extra)
    path = tmp_path / "inventory.yml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def provision(inventory: Path, tmp_path: Path, *args: str, as_json: bool = True):
    argv = [sys.executable, "-m", "mlxops", "provision", str(inventory), *args]
    if as_json:
        argv.append("--json")
    env = {**os.environ, "MLXOPS_HOME": str(tmp_path / "home")}
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env)
    doc = json.loads(proc.stdout) if as_json and proc.stdout.strip() else None
    return proc, doc


def totals(doc: dict) -> dict[str, int]:
    return {k: sum(h[k] for h in doc["hosts"].values())
            for k in ("ok", "changed", "failed", "skipped")}


def snapshot(sandbox) -> dict[str, str]:
    """Every file under every node home: path -> hash of content and mode."""
    out = {}
    for node in sandbox.nodes:
        home = sandbox.node_home(node)
        for dirpath, _, files in os.walk(home):
            for name in files:
                p = Path(dirpath) / name
                if p.is_symlink() or not p.is_file():
                    continue
                digest = hashlib.sha256(p.read_bytes()).hexdigest()
                out[str(p)] = f"{digest}:{oct(p.stat().st_mode)}"
    return out


def test_cold_run_changes_then_rerun_changes_nothing(login_sandbox, tmp_path):
    sandbox = login_sandbox
    inv = inventory_copy(sandbox, tmp_path, "~/.prov-cold")
    proc, doc = provision(inv, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert set(doc["hosts"]) == set(sandbox.nodes)
    for name, host in doc["hosts"].items():
        assert host["changed"] > 0 and host["failed"] == 0 and host["unreachable"] is False
        facts = host["facts"]
        assert facts["system"] == "Linux" and facts["python"]["mlx"]
        assert facts["interfaces"]["eth0"] == [sandbox.ip(name)]
        assert facts["root"] == f"/home/{sandbox.user}/.prov-cold"
        assert (tmp_path / "home" / "facts" / f"{name}.json").is_file()
    assert (sandbox.node_home("node1") / ".prov-cold" / "env.sh").is_file()

    proc, doc = provision(inv, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert totals(doc)["changed"] == 0 and totals(doc)["failed"] == 0


def test_check_leaves_every_node_file_untouched(sandbox, tmp_path):
    inv = inventory_copy(sandbox, tmp_path, "~/.prov-check")
    before = snapshot(sandbox)
    proc, doc = provision(inv, tmp_path, "--check")
    assert proc.returncode == 0, proc.stderr
    assert all(h["changed"] > 0 for h in doc["hosts"].values())
    assert snapshot(sandbox) == before
    assert not (sandbox.node_home("node1") / ".prov-check").exists()


def test_diff_shows_the_change_of_one_edited_var(sandbox, tmp_path):
    inv = inventory_copy(sandbox, tmp_path, "~/.prov-diff")
    proc, _ = provision(inv, tmp_path, "--limit", "node1,node2")
    assert proc.returncode == 0, proc.stderr
    inv = inventory_copy(sandbox, tmp_path, "~/.prov-diff",
                         {"node2": {"mlxops_env": {"PROV_DIFF": "on it"}}})
    proc, _ = provision(inv, tmp_path, "--limit", "node1,node2", "--diff", as_json=False)
    assert proc.returncode == 0, proc.stderr
    assert "+export PROV_DIFF='on it'" in proc.stdout
    assert "changed: [node2]" in proc.stdout and "changed: [node1]" not in proc.stdout
    assert "next: mlxops launch" in proc.stdout


def test_one_node_with_another_mlx_is_a_skew_failure(sandbox, tmp_path):
    # node3 gets a real interpreter (a venv of the system Python) whose `mlx.core` is a
    # stub saying 0.31.0, and that version pinned for it: its own python task is content,
    # and only the cluster-wide skew check can notice it differs from the others.
    venv = f"/home/{sandbox.user}/.prov-fake-mlx"
    sandbox.exec_in("node3", ["/usr/bin/python3", "-m", "venv", "--without-pip", venv],
                    check=True)
    site = sandbox.exec_in("node3", [f"{venv}/bin/python", "-c",
                                     "import sysconfig; print(sysconfig.get_path('purelib'))"],
                           check=True).stdout.strip()
    rel = os.path.relpath(site, f"/home/{sandbox.user}")
    sandbox.write_node_file("node3", f"{rel}/mlx/__init__.py", "")
    sandbox.write_node_file("node3", f"{rel}/mlx/core.py", "__version__ = '0.31.0'\n")
    inv = inventory_copy(sandbox, tmp_path, "~/.prov-skew", {"node3": {
        "mlxops_python": f"{venv}/bin/python", "mlxops_mlx_version": "0.31.0"}})
    proc, doc = provision(inv, tmp_path, "--tags", "python")
    assert proc.returncode == 1, proc.stderr
    bad = [n for n, h in doc["hosts"].items() if h["failed"]]
    assert bad == ["node3"]
    skew = next(t for t in doc["tasks"] if t["task"] == "skew")
    assert "mlx 0.31.0" in skew["hosts"]["node3"]["message"]
    proc, _ = provision(inv, tmp_path, "--tags", "python", as_json=False)
    assert "version skew" in proc.stdout and "node3" in proc.stdout


def test_one_node_down_the_rest_provisioned_exit_3(sandbox_mut, tmp_path):
    sandbox = sandbox_mut
    inv = inventory_copy(sandbox, tmp_path, "~/.prov-down")
    sandbox.stop_node("node5")
    proc, doc = provision(inv, tmp_path, "--forks", "8")
    assert proc.returncode == 3, proc.stderr
    assert doc["hosts"]["node5"]["unreachable"] is True
    for name, host in doc["hosts"].items():
        if name != "node5":
            assert host["unreachable"] is False and host["failed"] == 0 and host["changed"] > 0
    assert (sandbox.node_home("node4") / ".prov-down" / "env.sh").is_file()


def test_bad_input_is_exit_2_before_any_host_is_touched(sandbox, tmp_path):
    inv = inventory_copy(sandbox, tmp_path, "~/.prov-bad")
    play = tmp_path / "provision.yml"
    play.write_text("tasks:\n  - {task: env}\n  - {task: sync, args: {foo: 1}}\n")
    proc, _ = provision(inv, tmp_path, "--playbook", str(play))
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip().count("\n") == 0
    assert "tasks[1].args.foo: unknown argument of task 'sync'" in proc.stderr
    proc, _ = provision(inv, tmp_path, "--tags", "nosuchtag")
    assert proc.returncode == 2 and "--tags: unknown tag 'nosuchtag'" in proc.stderr
    assert not any((sandbox.node_home(n) / ".prov-bad").exists() for n in sandbox.nodes)


def _tiny_mlx_wheel(directory: Path, version: str) -> Path:
    """A pure-Python wheel named mlx whose `mlx.core.__version__` is ``version``: enough for
    the python task's real path (venv, pushed wheelhouse, pip --no-index) in seconds."""
    return _tiny_wheel(directory, "mlx", version, {
        "mlx/__init__.py": "", "mlx/core.py": f"__version__ = {version!r}\n"},
        "Provides-Extra: cpu\n")


def _tiny_wheel(directory: Path, name: str, version: str, modules: dict[str, str],
                metadata: str = "") -> Path:
    """A pure-Python wheel of ``modules`` that pip installs as ``name`` ``version``."""
    import base64
    import zipfile

    dist = f"{name.replace('-', '_')}-{version}"
    files = {
        **modules,
        f"{dist}.dist-info/METADATA":
            f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n{metadata}",
        f"{dist}.dist-info/WHEEL":
            "Wheel-Version: 1.0\nGenerator: mlxops-test\nRoot-Is-Purelib: true\n"
            "Tag: py3-none-any\n",
    }
    record = []
    for path_in, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=")
        record.append(f"{path_in},sha256={digest.decode()},{len(text.encode())}")
    record.append(f"{dist}.dist-info/RECORD,,")
    files[f"{dist}.dist-info/RECORD"] = "\n".join(record) + "\n"
    path = directory / f"{dist}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as whl:
        for name, text in files.items():
            whl.writestr(name, text)
    return path


def test_python_task_makes_a_venv_from_a_pushed_wheelhouse(sandbox, tmp_path):
    # node2's interpreter is the system Python, which has no mlx: the task must make
    # ~/.prov-venv/venv and install the pin offline from the wheelhouse it pushes.
    from importlib.metadata import version

    pin = version("mlx")
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    _tiny_mlx_wheel(wheels, pin)
    inv = inventory_copy(sandbox, tmp_path, "~/.prov-venv", {"node2": {
        "mlxops_python": "/usr/bin/python3", "mlxops_wheelhouse": str(wheels)}})
    play = tmp_path / "python.yml"
    play.write_text("tasks:\n  - {task: facts}\n  - {task: python}\n")
    proc, doc = provision(inv, tmp_path, "--playbook", str(play), "--limit", "node2")
    assert proc.returncode == 0, proc.stderr + proc.stdout
    host = doc["hosts"]["node2"]
    assert host["changed"] == 1
    venv_python = f"/home/{sandbox.user}/.prov-venv/venv/bin/python"
    assert host["facts"]["python"] == {"path": venv_python, "version": host["facts"]["python"]
                                       ["version"], "mlx": pin,
                                       "working_set": None,  # MLX's CPU build: no GPU
                                       "mlx_lm": None}
    proc, doc = provision(inv, tmp_path, "--playbook", str(play), "--limit", "node2")
    assert proc.returncode == 0 and doc["hosts"]["node2"]["changed"] == 0
    assert doc["hosts"]["node2"]["facts"]["python"]["path"] == venv_python


def test_mlx_lm_is_installed_pinned_only_where_the_inventory_asks(sandbox, tmp_path):
    # node3 asks for mlx-lm 0.30.1 (its interpreter, the system Python, has neither): the
    # python task makes the venv with the pinned mlx, the mlx_lm task adds mlx-lm beside
    # it, both offline from the pushed wheelhouse; node4 does not ask and is skipped.
    from importlib.metadata import version

    pin = version("mlx")
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    _tiny_mlx_wheel(wheels, pin)
    _tiny_wheel(wheels, "mlx-lm", "0.30.1", {"mlx_lm/__init__.py": "__version__ = '0.30.1'\n"},
                f"Requires-Dist: mlx=={pin}\n")
    inv = inventory_copy(sandbox, tmp_path, "~/.prov-mlxlm", {
        "node3": {"mlxops_python": "/usr/bin/python3", "mlxops_wheelhouse": str(wheels),
                  "mlxops_mlx_lm": "0.30.1"}})
    play = tmp_path / "mlx_lm.yml"
    play.write_text("tasks:\n  - {task: facts}\n  - {task: python}\n  - {task: mlx_lm}\n"
                    "  - {task: skew}\n")
    proc, doc = provision(inv, tmp_path, "--playbook", str(play), "--limit", "node3,node4")
    assert proc.returncode == 0, proc.stderr + proc.stdout
    task = next(t for t in doc["tasks"] if t["task"] == "mlx_lm")
    assert task["hosts"]["node3"]["status"] == "changed"
    assert task["hosts"]["node3"]["message"] == (
        f"installed mlx-lm missing -> 0.30.1 in /home/{sandbox.user}/.prov-mlxlm/venv")
    assert task["hosts"]["node4"]["status"] == "skipped"
    python = doc["hosts"]["node3"]["facts"]["venv"]
    assert (python["mlx"], python["mlx_lm"]) == (pin, "0.30.1")
    proc, doc = provision(inv, tmp_path, "--playbook", str(play), "--limit", "node3,node4")
    assert proc.returncode == 0 and totals(doc)["changed"] == 0

"""``mlxops check`` on the sandbox's sshd nodes: a provisioned cluster passes, each kind of
breakage fails its own check on its own node (with the fix), a node down errors as
unreachable, and a user's check directory runs beside the shipped checks.

The cluster is provisioned once for the module into its own ``mlxops_root``; a test that
breaks a node mends it (``sandbox_mut`` for host keys and stopped nodes). The all-green
run (the all_sum included) runs on bash and on zsh login shells (``login_sandbox``).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import xml.etree.ElementTree as ET
from importlib.metadata import version
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.integration

ROOT = "~/.chk"
PORT = 31000
CHECKS = {"check_ssh", "check_interpreter", "check_mlx", "check_env_file", "check_hostfiles",
          "check_synced_code", "check_disk", "check_memory", "check_ring_ports",
          "check_leftover_ranks", "check_clock", "check_versions_agree", "check_ring_reach",
          "check_all_sum"}


def mlxops(home: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "MLXOPS_HOME": str(home)}
    return subprocess.run([sys.executable, "-m", "mlxops", *args], capture_output=True,
                          text=True, timeout=timeout, env=env, stdin=subprocess.DEVNULL)


def junit(path: Path) -> dict[str, str]:
    """``{"check_mlx[node2]": "passed" | "failure" | "error" | "skipped"}``."""
    cases = {}
    for tc in ET.parse(path).getroot().iter("testcase"):
        children = [c.tag for c in tc if c.tag in ("failure", "error", "skipped")]
        cases[tc.get("name")] = children[0] if children else "passed"
    return cases


@pytest.fixture(scope="module")
def provisioned(tmp_path_factory):
    """``provisioned(sandbox)``: that sandbox provisioned into ~/.chk, with a job file for
    its checks (a directory); provisioned once per sandbox for the module."""
    done: dict[str, Path] = {}

    def get(sandbox) -> Path:
        if sandbox.dir not in done:
            done[sandbox.dir] = _provision(sandbox, tmp_path_factory.mktemp("check"))
        return done[sandbox.dir]
    return get


@pytest.fixture
def cluster(sandbox, provisioned):
    """The bash sandbox, provisioned (:func:`provisioned`)."""
    return provisioned(sandbox)


def _provision(sandbox, base: Path) -> Path:
    """``base`` holds an inventory of ``sandbox`` with mlxops_root ~/.chk, provisioned, and
    job files (ring and mpi) for its checks."""
    doc = yaml.safe_load(Path(sandbox.inventory_path).read_text())
    doc["all"]["vars"]["mlxops_root"] = ROOT
    (base / "inventory.yml").write_text(yaml.safe_dump(doc, sort_keys=False))
    trainer = {"model": {"dims": 32, "layers": 1, "heads": 2, "vocab_size": 64, "seq_len": 16}}
    for name, backend in (("job.yml", "ring"), ("mpi.yml", "mpi")):
        (base / name).write_text(yaml.safe_dump({
            "name": "chk", "inventory": "inventory.yml", "backend": backend, "port": PORT,
            "trainer": trainer}))
    proc = mlxops(base / "home", "provision", str(base / "inventory.yml"))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr
    return base


def snapshot(sandbox) -> dict[str, str]:
    """Every file under every node's ~/.chk: path -> content and mode."""
    out = {}
    for node in sandbox.nodes:
        for dirpath, _, files in os.walk(sandbox.node_home(node) / ".chk"):
            for name in files:
                path = Path(dirpath) / name
                if path.is_file() and not path.is_symlink():
                    out[str(path)] = f"{hash(path.read_bytes())}:{oct(path.stat().st_mode)}"
    return out


def check(cluster: Path, *args: str) -> tuple[subprocess.CompletedProcess, dict[str, str]]:
    xml = cluster / "check.xml"
    xml.unlink(missing_ok=True)
    proc = mlxops(cluster / "home", "check", str(cluster / "inventory.yml"),
                  "--job", str(cluster / "job.yml"), "--junitxml", str(xml), *args)
    return proc, junit(xml) if xml.exists() else {}


def test_a_provisioned_cluster_passes_with_a_users_check_beside_the_shipped_ones(
        login_sandbox, provisioned, tmp_path):
    sandbox = login_sandbox
    cluster = provisioned(sandbox)
    mine = tmp_path / "mychecks"
    mine.mkdir()
    (mine / "test_node_user.py").write_text(textwrap.dedent(f"""
        def test_node_user(host, node):
            # testinfra's modules, over mlxops's SSH connection to the node
            assert host.user().name == {sandbox.user!r}
            assert host.file(node.facts.root + "/env.sh").mode == 0o600
    """))
    before = snapshot(sandbox)
    proc, cases = check(cluster, str(mine))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert snapshot(sandbox) == before   # read-only: not even a __pycache__
    want = {f"{c}[{n}]" for c in CHECKS | {"test_node_user"} for n in sandbox.nodes}
    assert set(cases) == want
    assert set(cases.values()) == {"passed"}
    assert (f"{len(sandbox.nodes)} hosts, {len(CHECKS) + 1} checks: {len(want)} passed, "
            "0 failed") in proc.stdout


def _fake_mlx_venv(sandbox, node: str) -> None:
    """``<root>/venv`` (which jobs run when it exists) whose mlx says 0.31.0."""
    venv = f"/home/{sandbox.user}/.chk/venv"
    sandbox.exec_in(node, ["/usr/bin/python3", "-m", "venv", "--without-pip", venv],
                    check=True)
    site = sandbox.exec_in(node, [f"{venv}/bin/python", "-c",
                                  "import sysconfig; print(sysconfig.get_path('purelib'))"],
                           check=True).stdout.strip()
    rel = os.path.relpath(site, f"/home/{sandbox.user}")
    sandbox.write_node_file(node, f"{rel}/mlx/__init__.py", "")
    sandbox.write_node_file(node, f"{rel}/mlx/core.py", "__version__ = '0.31.0'\n")


def test_each_breakage_fails_its_check_on_its_node_only(sandbox_mut, cluster):
    sandbox = sandbox_mut
    home = {n: sandbox.node_home(n) / ".chk" for n in sandbox.nodes}
    env_sh = (home["node1"] / "env.sh").read_text()
    train_py = home["node4"] / "code" / "mlxops" / "trainer" / "train.py"
    trainer_code = train_py.read_text()
    holder = leftover = None
    try:
        (home["node1"] / "env.sh").unlink()                                  # env missing
        _fake_mlx_venv(sandbox, "node2")                                     # wrong mlx
        # SO_REUSEADDR as any server sets it: the first test's reach left TIME_WAITs.
        holder = sandbox.popen_in("node3", [sandbox.python, "-c", textwrap.dedent("""
            import socket, sys, time
            s = socket.socket()
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind((sys.argv[1], int(sys.argv[2]))); s.listen()
            print("held", flush=True); time.sleep(300)
        """), sandbox.ip("node3"), str(PORT + 2)], stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True)
        held = holder.stdout.readline().strip()                              # held ring port
        assert held == "held", holder.stderr.read() if holder.poll() is not None else held
        sandbox.write_node_file("node4", ".chk/code/mlxops/trainer/train.py",
                                trainer_code + "# edited on the node\n")     # stale code
        leftover = sandbox.popen_in("node5", ["sleep", "300"])
        sandbox.write_node_file("node5", ".chk/runs/old/rank-0.sh", "sleep 300\n")
        sandbox.write_node_file("node5", ".chk/runs/old/rank-0.pid", f"{leftover.pid}\n")
        sandbox.forget_host_key("node6")                                     # unknown key

        proc, cases = check(cluster)
    finally:
        for proc_ in (holder, leftover):
            if proc_ is not None:
                proc_.kill()
                proc_.wait()
        sandbox.write_node_file("node1", ".chk/env.sh", env_sh, mode=0o600)
        shutil.rmtree(home["node2"] / "venv", ignore_errors=True)
        sandbox.write_node_file("node4", ".chk/code/mlxops/trainer/train.py", trainer_code)
        shutil.rmtree(home["node5"] / "runs" / "old", ignore_errors=True)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    broken = {"check_env_file[node1]", "check_mlx[node2]", "check_ring_ports[node3]",
              "check_synced_code[node4]", "check_leftover_ranks[node5]", "check_ssh[node6]"}
    assert {n for n, o in cases.items() if o == "failure"} == broken, proc.stdout
    assert not [n for n, o in cases.items() if o == "error"]
    # node6 answered with a key nobody trusts: nothing else is asked of it.
    # The all_sum waits for the others (it would sync node4's code, hang on node3's port).
    assert {n for n, o in cases.items() if o == "skipped"} == {
        f"{c}[node6]" for c in CHECKS - {"check_ssh"}} | {
        f"check_all_sum[{n}]" for n in sandbox.nodes}
    lines = proc.stdout.splitlines()
    assert "node1: ~/.chk/env.sh missing: run mlxops provision" in lines
    assert f"node2: mlx 0.31.0, controller {version('mlx')}: run mlxops provision" in lines
    assert (f"node3: ring port {PORT + 2} on {sandbox.ip('node3')} in use: stop what holds "
            "them (another job? mlxops status), or set another port: in job.yml") in lines
    assert ("node4: ~/.chk/code is not the controller's code: 1 changed "
            "(e.g. mlxops/trainer/train.py): mlxops launch job.yml syncs it, or run mlxops "
            "provision") in lines
    assert f"node5: job old: rank 0 (pid {leftover.pid}) still running: mlxops stop old" \
        in lines
    [key_line] = [ln for ln in lines if ln.startswith("node6: ")]
    assert "unknown host key" in key_line and "SHA256:" in key_line
    assert "mlxops trust" in key_line


def test_a_node_down_errors_as_unreachable_and_the_others_run(sandbox_mut, cluster):
    sandbox_mut.stop_node("node7")
    proc, cases = check(cluster, "--json")
    assert proc.returncode == 3, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["exit_code"] == 3 and doc["ok"] is False
    # The others' all_sum waits for every host (it needs all their ranks).
    others = {f"check_all_sum[{n}]" for n in sandbox_mut.nodes if n != "node7"}
    assert {n for n, o in cases.items() if o != "passed"} == {
        f"{c}[node7]" for c in CHECKS} | others
    assert {cases[f"{c}[node7]"] for c in CHECKS} == {"error"}
    assert {cases[n] for n in others} == {"skipped"}
    down = [r for r in doc["results"] if r["host"] == "node7"]
    assert {r["outcome"] for r in down} == {"unreachable"}
    assert all(r["message"].startswith("node7: unreachable: ") for r in down)
    assert doc["counts"]["passed"] == 7 * (len(CHECKS) - 1)


def test_an_mpi_job_needs_mpirun_at_the_same_path(sandbox, cluster):
    if not shutil.which("mpirun"):
        pytest.skip("Open MPI is not installed here (make test installs openmpi-bin)")
    proc = mlxops(cluster / "home", "check", str(cluster / "inventory.yml"), "--job",
                  str(cluster / "mpi.yml"), "--limit", "node1,node2", "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = json.loads(proc.stdout)
    assert {(r["check"], r["host"]) for r in doc["results"] if r["check"] == "check_mpirun"} \
        == {("check_mpirun", "node1"), ("check_mpirun", "node2")}
    assert "check_ring_ports" not in doc["checks"] and "check_ring_reach" not in doc["checks"]

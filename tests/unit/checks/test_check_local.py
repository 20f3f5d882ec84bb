"""``mlxops check`` end to end on this machine: two local hosts (``ansible_connection:
local``, no SSH), provisioned for real, then checked through the CLI as users run it.

The same session runs on sandbox nodes over SSH in tests/integration/test_check.py; here
it is the pytest session itself under test: JUnit, --json, user check directories,
--wait, bad input, and that nothing of it leaks into a plain pytest run.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import xml.etree.ElementTree as ET
from importlib import import_module
from pathlib import Path

import paramiko
import pytest
import yaml
from click.testing import CliRunner

ROOT = Path(__file__).resolve().parents[3]
LOCAL_CHECKS = {"check_interpreter", "check_mlx", "check_env_file", "check_hostfiles",
                "check_synced_code", "check_ring_ports", "check_leftover_ranks",
                "check_clock", "check_versions_agree", "check_ring_reach", "check_all_sum",
                "check_collectives"}


def mlxops(*args: str, home: Path, cwd: Path | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MLXOPS_HOME": str(home)}
    return subprocess.run([sys.executable, "-m", "mlxops", *args], capture_output=True,
                          text=True, timeout=300, env=env, cwd=cwd or ROOT)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """Two local hosts, a and b, each with its own root, provisioned."""
    base = tmp_path_factory.mktemp("local-check")
    inventory = base / "inventory.yml"
    inventory.write_text(yaml.safe_dump({"all": {
        "vars": {"ansible_connection": "local", "mlxops_ip": "127.0.0.1"},
        "hosts": {"a": {"mlxops_root": str(base / "a")},
                  "b": {"mlxops_root": str(base / "b"), "mlxops_env": {"TOKEN": "s3cret"}}},
    }}))
    (base / "job.yml").write_text(yaml.safe_dump({
        "name": "tiny", "inventory": "inventory.yml", "port": 31500,
        "trainer": {"model": {"dims": 32, "layers": 1, "heads": 2, "vocab_size": 64,
                              "seq_len": 16}}}))
    proc = mlxops("provision", str(inventory), home=base / "home")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return base


def junit_cases(path: Path) -> dict[str, list[str]]:
    """``{"check_mlx[a]": [child tags]}`` of a JUnit file."""
    root = ET.parse(path).getroot()
    return {tc.get("name"): [child.tag for child in tc] for tc in root.iter("testcase")}


def test_a_provisioned_cluster_passes_one_testcase_per_host_per_check(cluster, tmp_path):
    # What a node's Python leaves when it runs the helpers is not a code difference.
    pyc = cluster / "a" / "code" / "mlxops" / "__pycache__" / "__init__.cpython-311.pyc"
    pyc.parent.mkdir(exist_ok=True)
    pyc.write_bytes(b"compiled")
    xml = tmp_path / "check.xml"
    proc = mlxops("check", str(cluster / "inventory.yml"), "--junitxml", str(xml),
                  home=cluster / "home")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    cases = junit_cases(xml)
    assert set(cases) == {f"{c}[{h}]" for c in LOCAL_CHECKS for h in "ab"}
    assert all(children == [] for children in cases.values()), cases
    assert proc.stdout.splitlines()[0].split() == ["check", "a", "b"]
    assert "2 hosts, 12 checks: 24 passed, 0 failed" in proc.stdout
    assert proc.stderr == ""


def test_each_breakage_fails_that_check_on_that_host_only(cluster, tmp_path):
    env_b = cluster / "b" / "env.sh"
    trainer_a = cluster / "a" / "code" / "mlxops" / "trainer" / "train.py"
    saved_env, saved_code = env_b.read_bytes(), trainer_a.read_bytes()
    env_b.unlink()
    trainer_a.write_bytes(saved_code + b"# edited on the node\n")
    xml = tmp_path / "check.xml"
    try:
        proc = mlxops("check", str(cluster / "inventory.yml"), "--junitxml", str(xml),
                      home=cluster / "home")
    finally:
        env_b.write_bytes(saved_env)
        env_b.chmod(0o600)
        trainer_a.write_bytes(saved_code)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    cases = junit_cases(xml)
    failed = {name for name, children in cases.items() if "failure" in children}
    assert failed == {"check_env_file[b]", "check_synced_code[a]"}
    # The all_sum and the collectives check would sync the code (a job's pre-flight
    # does): they wait for a clean run.
    skipped = {name for name, children in cases.items() if children == ["skipped"]}
    assert skipped == {"check_all_sum[a]", "check_all_sum[b]", "check_collectives[a]",
                       "check_collectives[b]"}
    [case] = [tc for tc in ET.parse(xml).getroot().iter("testcase")
              if tc.get("name") == "check_env_file[b]"]
    assert case.find("failure").get("message") == \
        f"b: {env_b} missing: run mlxops provision"
    lines = proc.stdout.splitlines()
    assert f"b: {env_b} missing: run mlxops provision" in lines
    assert (f"a: {cluster / 'a' / 'code'} is not the controller's code: 1 changed "
            "(e.g. mlxops/trainer/train.py): run mlxops provision") in lines


def test_json_with_a_job_checks_its_disk_memory_and_ports(cluster):
    proc = mlxops("check", str(cluster / "inventory.yml"), "--job", str(cluster / "job.yml"),
                  "--json", home=cluster / "home")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["ok"] is True and doc["exit_code"] == 0 and doc["hosts"] == ["a", "b"]
    # The job trusts no collective beyond all_sum with data: no collectives check for it.
    assert set(doc["checks"]) == LOCAL_CHECKS - {"check_collectives"} | {"check_disk",
                                                                        "check_memory"}
    assert doc["counts"]["passed"] == 26 and doc["counts"]["failed"] == 0
    assert {r["outcome"] for r in doc["results"]} == {"passed"}
    assert doc["results"][0] == {"check": "check_interpreter", "host": "a",
                                 "outcome": "passed", "message": ""}
    assert doc["attempts"] == 1 and doc["junitxml"] is None


def test_a_user_check_directory_runs_beside_the_shipped_checks(cluster, tmp_path):
    mine = tmp_path / "mychecks"
    mine.mkdir()
    (mine / "test_site.py").write_text(
        "def test_has_tmp(host, node):\n"
        "    assert host.file('/tmp').is_directory\n"
        "    assert node.facts.system == 'Linux'\n"
        "\n"
        "def check_nothing_on_b(host):\n"
        "    assert host.backend.get_hostname() != 'b', 'b is not wanted'\n"
        "\n"
        "def test_once(cluster):\n"
        "    assert set(cluster.states) == {'a', 'b'}\n")
    xml = tmp_path / "check.xml"
    proc = mlxops("check", str(cluster / "inventory.yml"), str(mine), "--junitxml", str(xml),
                  home=cluster / "home")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    cases = junit_cases(xml)
    assert {"test_has_tmp[a]", "test_has_tmp[b]", "check_nothing_on_b[a]", "test_once",
            "check_mlx[a]", "check_mlx[b]"} <= set(cases)
    assert {n for n, c in cases.items() if c} == {"check_nothing_on_b[b]"}
    assert "b: b is not wanted" in proc.stdout.splitlines()
    header = proc.stdout.splitlines()[0].split()
    assert header == ["check", "a", "b", "all"]


def test_a_user_check_that_does_not_import_is_bad_input(cluster, tmp_path):
    mine = tmp_path / "broken"
    mine.mkdir()
    (mine / "test_broken.py").write_text("import no_such_module_here\n")
    proc = mlxops("check", str(cluster / "inventory.yml"), str(mine), home=cluster / "home")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stdout == ""
    assert proc.stderr.count("\n") == 1
    assert "test_broken.py" in proc.stderr and "no_such_module_here" in proc.stderr


@pytest.mark.parametrize("args,error", [
    (["nosuchdir"], "nosuchdir: no such check directory"),
    (["--limit", "zzz"], "--limit: no host or group named 'zzz'"),
    (["--job", "nosuch.yml"], "nosuch.yml: no such file"),
])
def test_bad_input_is_exit_2_with_one_line(cluster, args, error):
    proc = mlxops("check", str(cluster / "inventory.yml"), *args, home=cluster / "home")
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and error in proc.stderr, proc.stderr


def test_wait_checks_again_until_everything_passes(cluster, monkeypatch):
    from mlxops.checks import run
    from mlxops.checks.target import load_target

    monkeypatch.setenv("MLXOPS_HOME", str(cluster / "home"))
    monkeypatch.setattr(run, "RETRY_SECONDS", 0.1)
    env_a = cluster / "a" / "env.sh"
    saved = env_a.read_bytes()
    env_a.chmod(0o644)
    seen = []

    def repair(report, pause):
        seen.append([r.message for r in report.results if r.outcome == "failed"])
        env_a.chmod(0o600)

    try:
        report = run.run_checks(load_target(cluster / "inventory.yml"), wait=60,
                                on_retry=repair)
    finally:
        env_a.write_bytes(saved)
        env_a.chmod(0o600)
    assert seen == [[f"a: {env_a} has mode 644, want 600: run mlxops provision"]]
    assert report.exit_code == 0 and report.attempts == 2


def test_a_bug_reading_the_hosts_is_an_internal_error_not_a_host_failure(cluster, monkeypatch):
    from mlxops.checks import cluster as cluster_module
    from mlxops.cli import cli

    def broken(target, connector, host):
        return {}["facts"]

    monkeypatch.setenv("MLXOPS_HOME", str(cluster / "home"))
    monkeypatch.setattr(cluster_module, "inspect", broken)
    result = CliRunner().invoke(cli, ["check", str(cluster / "inventory.yml")])
    assert result.exit_code == 1
    assert "mlxops: internal error: KeyError: 'facts' on a" in result.output


def test_pytest_with_mlxops_inventory_gives_a_users_suite_the_hosts(cluster, tmp_path):
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "test_suite.py").write_text(
        "from mlxops.checks.backend import MlxopsBackend\n"
        "\n"
        "def test_host(host):\n"
        "    assert isinstance(host.backend, MlxopsBackend)\n"
        "    assert host.run('echo hi').stdout == 'hi\\n'\n")
    from mlxops.checks.run import testinfra_entry_point

    # The plugins named, none auto-loaded: the same run whether or not this checkout's
    # entry points are installed (the entry point itself: the test below).
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MLXOPS_HOME": str(cluster / "home"),
           "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    argv = [sys.executable, "-m", "pytest", "-p", "mlxops.checks.pytest_plugin",
            "-p", testinfra_entry_point(), "-p", "no:cacheprovider", "-v",
            "--mlxops-inventory", str(cluster / "inventory.yml")]
    proc = subprocess.run([*argv, "--mlxops-limit", "b"], capture_output=True, text=True,
                          cwd=suite, env=env, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "test_suite.py::test_host[b] PASSED" in proc.stdout
    assert "test_host[a]" not in proc.stdout
    proc = subprocess.run([*argv, "--hosts", "x"], capture_output=True, text=True, cwd=suite,
                          env=env, timeout=120)
    assert proc.returncode == 4 and "give one or the other" in proc.stderr


def test_the_plugin_is_a_pytest11_entry_point_and_checks_are_never_collected_by_pytest():
    tomllib = pytest.importorskip("tomllib")   # Python 3.11+
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    target = project["entry-points"]["pytest11"]["mlxops"]
    assert hasattr(import_module(target), "pytest_addoption")
    assert any(d.startswith("pytest-testinfra") for d in project["dependencies"])
    # A plain pytest in this repository (tests/ is the testpath, test_* the files)
    # never picks up the shipped check_*.py.
    proc = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q",
                           "-p", "no:cacheprovider", "mlxops/checks"],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 5 and "no tests collected" in proc.stdout, proc.stdout
    ini = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]
    assert ini["ini_options"]["testpaths"] == ["tests"]


class _Server(paramiko.ServerInterface):
    def get_allowed_auths(self, username):
        return "publickey"


def test_the_host_fixture_refuses_an_unknown_host_key(tmp_path, monkeypatch):
    """testinfra's own paramiko backend would accept any key; the mlxops backend goes
    through mlxops's connections, which refuse it (with its fingerprint)."""
    import socket

    import testinfra

    from mlxops.checks import backend
    from mlxops.inventory import load_inventory
    from mlxops.transport import Connector, UnknownHostKey

    key = paramiko.Ed25519Key.from_private_key_file(_keygen(tmp_path))
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]

    def serve():
        conn, _ = listener.accept()
        transport = paramiko.Transport(conn)
        transport.add_server_key(key)
        try:
            transport.start_server(server=_Server())
            transport.accept(5)
        except (paramiko.SSHException, EOFError, OSError):
            pass
        finally:
            transport.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    inventory = tmp_path / "inventory.yml"
    inventory.write_text(yaml.safe_dump({"all": {"hosts": {"mac9": {
        "ansible_host": "127.0.0.1", "ansible_port": port, "ansible_user": "nobody",
        "mlxops_known_hosts": str(tmp_path / "known_hosts")}}}}))
    monkeypatch.setenv("HOME", str(tmp_path))   # no ~/.ssh/config of the machine's
    backend.register()
    with Connector() as connector:
        backend.bind(load_inventory(inventory).hosts, connector)
        try:
            host = testinfra.get_host("mac9", connection=backend.NAME)
            assert isinstance(host.backend, backend.MlxopsBackend)
            with pytest.raises(UnknownHostKey, match="unknown host key for .*SHA256:"):
                host.run("true")
        finally:
            backend.unbind()
            listener.close()
    thread.join(timeout=10)
    assert not (tmp_path / "known_hosts").exists()


def _keygen(tmp_path: Path) -> str:
    path = tmp_path / "host_key"
    subprocess.run([shutil.which("ssh-keygen") or "ssh-keygen", "-q", "-t", "ed25519",
                    "-N", "", "-f", str(path)], check=True)
    return str(path)


def test_the_hosts_reading_runs_beside_the_caller_and_hands_over_its_error():
    """``Reading`` (started by ``mlxops check`` before it imports pytest): the caller goes
    on while the hosts are read; ``wait`` gives the cluster, or raises what reading raised."""
    from mlxops.checks.cluster import Reading

    release = threading.Event()

    class Slow:
        def read_hosts(self):
            assert release.wait(10)  # the caller is not held up meanwhile

    cluster = Slow()
    reading = Reading(cluster)  # type: ignore[arg-type]
    release.set()
    assert reading.wait() is cluster

    class Broken:
        def read_hosts(self):
            raise KeyError("x")

    with pytest.raises(KeyError):
        Reading(Broken()).wait()  # type: ignore[arg-type]

"""The supervisor on a node (mlxops.jobs.supervisor, mlxops.jobs.supervising): who it is,
how its start is rendered on each system, its lease, the inventory it reads.

The launchd agent cannot run here: its plist is checked as text against launchd.plist(5)
and launchctl(1) (macOS 14 man pages: Label, ProgramArguments, EnvironmentVariables,
KeepAlive.SuccessfulExit, StandardOutPath/StandardErrorPath; ``launchctl bootstrap
gui/UID PATH`` and ``bootout gui/UID/LABEL``), and parsed with plistlib as launchd would.
"""

from __future__ import annotations

import fcntl
import json
import os
import plistlib
import subprocess
import sys
from pathlib import Path

import pytest

from mlxops.errors import UserError
from mlxops.inventory import load_inventory
from mlxops.jobs import supervisor as rules
from mlxops.jobs.record import JobRecord, SupervisorRecord
from mlxops.jobs.spec import load_job
from mlxops.jobs.supervising import supervisor_inventory

SITE = rules.Site("mini1", "/Users/ml/.mlxops/supervisor", "tiny")


def _inventory(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "inventory.yml"
    path.write_text(text)
    (tmp_path / "id_mlxops").write_text("a key\n")
    return path


def _job(tmp_path: Path, extra: str = "") -> Path:
    path = tmp_path / "job.yml"
    path.write_text("name: tiny\ninventory: inventory.yml\ntrainer: {train: {steps: 4}}\n"
                    + extra)
    return path


INVENTORY = """\
all:
  vars: {ansible_user: ml, ansible_ssh_private_key_file: id_mlxops}
  hosts:
    mini1: {ansible_host: 10.0.0.1}
    mini2: {ansible_host: 10.0.0.2, mlxops_slots: 2}
  children:
    macs: {hosts: {mini1: {}, mini2: {}}}
"""


def _resolve(tmp_path: Path, inventory: str, extra: str = ""):
    spec = load_job(_job(tmp_path, extra)) if (tmp_path / "inventory.yml").exists() else None
    if spec is None:
        _inventory(tmp_path, inventory)
        spec = load_job(_job(tmp_path, extra))
    inv = load_inventory(spec.inventory)
    return rules.supervisor_of(spec.path, spec.supervisor, inv.select(spec.hosts), inv)


def test_the_controller_supervises_unless_told(tmp_path):
    assert _resolve(tmp_path, INVENTORY) is None


def test_the_job_names_its_supervisor(tmp_path):
    assert _resolve(tmp_path, INVENTORY, "supervisor: mini2\n").name == "mini2"


def test_the_inventory_names_it_for_every_job(tmp_path):
    text = INVENTORY.replace("ansible_user: ml,", "ansible_user: ml, mlxops_supervisor: mini1,")
    assert _resolve(tmp_path, text).name == "mini1"


def test_the_job_wins_over_the_inventory_even_for_the_controller(tmp_path):
    text = INVENTORY.replace("ansible_user: ml,", "ansible_user: ml, mlxops_supervisor: mini1,")
    assert _resolve(tmp_path, text, "supervisor: controller\n") is None


def test_a_supervisor_not_in_the_inventory_is_one_line_naming_the_job_key(tmp_path):
    with pytest.raises(UserError) as err:
        _resolve(tmp_path, INVENTORY, "supervisor: studio9\n")
    assert str(err.value).startswith(f"{tmp_path / 'job.yml'}: supervisor: no host named "
                                     "'studio9'")
    assert "\n" not in str(err.value)


def test_the_inventorys_supervisor_must_be_one_of_its_hosts(tmp_path):
    text = INVENTORY.replace("ansible_user: ml,", "ansible_user: ml, mlxops_supervisor: mac9,")
    with pytest.raises(UserError, match=r"inventory.yml: all.vars.mlxops_supervisor: no host "
                                        r"named 'mac9'"):
        load_inventory(_inventory(tmp_path, text))


def test_hosts_of_one_job_must_agree_on_the_inventorys_supervisor(tmp_path):
    text = INVENTORY.replace("{ansible_host: 10.0.0.1}",
                             "{ansible_host: 10.0.0.1, mlxops_supervisor: mini1}")
    with pytest.raises(UserError, match="mlxops_supervisor: differs between the hosts"):
        _resolve(tmp_path, text)


def test_setsid_start_is_detached_quoted_and_logged():
    line = rules.start_command(SITE, rules.SETSID)
    assert "nohup setsid env " in line
    assert "MLXOPS_HOME=/Users/ml/.mlxops/supervisor/home" in line
    assert f"{rules.ENV_HOST}=mini1" in line
    assert "-m mlxops watch tiny </dev/null >>" in line
    assert line.endswith("supervisor.log 2>&1 &")


def test_systemd_start_names_a_unit_and_appends_to_the_log():
    line = rules.start_command(SITE, rules.SYSTEMD)
    assert line.split(" && ", 1)[1].startswith("systemd-run --user --quiet --collect "
                                               "--unit=org.mlxops.watch.tiny ")
    assert "--property=StandardOutput=append:/Users/ml/.mlxops/supervisor/home/jobs/tiny/" \
           "supervisor.log" in line


def test_a_name_with_quotes_stays_one_word_in_every_start():
    odd = rules.Site("mini1", "/Users/o'neil/x y", "tiny")
    for method in rules.METHODS:
        line = rules.start_command(odd, method)
        assert "'/Users/o'\"'\"'neil/x y/home/jobs/tiny'" in line


def test_the_launchd_agent_reads_as_launchd_would():
    agent = plistlib.loads(rules.launchd_plist(SITE).encode())
    assert agent["Label"] == "org.mlxops.watch.tiny"
    assert agent["ProgramArguments"] == [SITE.python, "-m", "mlxops", "watch", "tiny"]
    assert agent["EnvironmentVariables"]["MLXOPS_HOME"] == SITE.home
    assert agent["EnvironmentVariables"]["PYTHONPATH"] == SITE.lib
    assert agent["KeepAlive"] == {"SuccessfulExit": False}
    assert agent["RunAtLoad"] is True
    assert agent["StandardOutPath"] == agent["StandardErrorPath"] == SITE.log


def test_the_launchd_start_writes_the_agent_then_bootstraps_it():
    line = rules.start_command(SITE, rules.LAUNCHD)
    plist = "/Users/ml/.mlxops/supervisor/org.mlxops.watch.tiny.plist"
    assert f"cat > {plist} && " in line
    assert 'launchctl bootout "$d"/org.mlxops.watch.tiny' in line  # a stale agent first
    assert line.endswith(f'launchctl bootstrap "$d" {plist}')
    assert 'launchctl print "gui/$u"' in line and 'd="user/$u"' in line
    assert rules.start_stdin(SITE, rules.LAUNCHD) == rules.launchd_plist(SITE).encode()
    assert rules.start_stdin(SITE, rules.SETSID) is None


def test_stopping_a_launchd_supervisor_boots_it_out_first():
    line = rules.stop_command("python3", SITE, rules.LAUNCHD, 5)
    assert line.index("launchctl bootout") < line.index("python3 -c")


def _lease(tmp_path: Path, *action: str) -> dict:
    site = rules.Site("h", str(tmp_path), "tiny")
    done = subprocess.run(["sh", "-c", rules.lease_command(sys.executable, site) + " "
                           + " ".join(action)], capture_output=True, text=True, check=True)
    return json.loads(done.stdout)


def test_no_lock_file_is_no_lease(tmp_path):
    assert _lease(tmp_path) == {"held": False, "pid": None}


def test_a_held_lock_names_its_holder_and_stop_ends_it(tmp_path):
    lock = tmp_path / "home" / "jobs" / "tiny" / "watch.lock"
    lock.parent.mkdir(parents=True)
    holder = subprocess.Popen([sys.executable, "-c", (
        "import fcntl, os, sys, time\n"
        f"f = open({str(lock)!r}, 'w'); fcntl.flock(f, fcntl.LOCK_EX)\n"
        "f.write(f'{os.getpid()}\\n'); f.flush(); print('held', flush=True)\n"
        "time.sleep(600)\n")], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "held\n"
        assert _lease(tmp_path) == {"held": True, "pid": holder.pid}
        assert _lease(tmp_path, "stop", "5") == {"held": False, "pid": holder.pid}
        assert holder.wait(timeout=10) != 0
    finally:
        holder.kill()
        holder.wait()
    with open(lock) as f:  # free again
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)


def test_the_supervisors_inventory_keeps_hosts_groups_and_vars_with_its_own_key(tmp_path):
    text = INVENTORY.replace("ansible_user: ml,",
                             "ansible_user: ml, mlxops_ring_order: [mini2, mini1],")
    inv = load_inventory(_inventory(tmp_path, text))
    out = tmp_path / "theirs" / "inventory.yml"
    out.parent.mkdir()
    out.write_text(supervisor_inventory(inv, SITE))
    theirs = load_inventory(out)
    assert list(theirs.hosts) == ["mini2", "mini1"]          # the ring order kept
    assert sorted(theirs.group_hosts("macs")) == ["mini1", "mini2"]
    mini2 = theirs.hosts["mini2"]
    assert (mini2.address, mini2.user, mini2.slots) == ("10.0.0.2", "ml", 2)
    assert mini2.vars["ansible_ssh_private_key_file"] == rules.KEY_FILE
    assert mini2.vars["mlxops_known_hosts"] == SITE.known_hosts


def test_known_hosts_lines_are_one_per_key():
    text = rules.known_hosts_lines([("[10.0.0.2]:2222", "ssh-ed25519", "AAAA"),
                                    ("10.0.0.1", "ssh-ed25519", "BBBB"),
                                    ("10.0.0.1", "ssh-ed25519", "BBBB")])
    assert text == "10.0.0.1 ssh-ed25519 BBBB\n[10.0.0.2]:2222 ssh-ed25519 AAAA\n"


def test_the_record_keeps_its_supervisor(tmp_path, monkeypatch):
    monkeypatch.setenv("MLXOPS_HOME", str(tmp_path))
    record = JobRecord(name="tiny", job_file="j.yml", inventory="i.yml", backend="ring",
                       hosts=[], ranks=[], supervisor=SupervisorRecord("mini1", "/x", "setsid"))
    back = JobRecord.from_dict(json.loads(json.dumps(record.to_dict())))
    assert back.supervisor == SupervisorRecord("mini1", "/x", "setsid")


def test_only_the_named_watchdog_supervises(monkeypatch):
    record = JobRecord(name="tiny", job_file="j.yml", inventory="i.yml", backend="ring",
                       hosts=[], ranks=[], supervisor=SupervisorRecord("mini1", "/x", "setsid"))
    monkeypatch.delenv(rules.ENV_HOST, raising=False)
    assert rules.supervised_elsewhere(record)
    monkeypatch.setenv(rules.ENV_HOST, "mini1")
    assert not rules.supervised_elsewhere(record)
    record.supervisor = None
    assert not rules.supervised_elsewhere(record)
    assert os.environ[rules.ENV_HOST] == "mini1"


def _sh(command: str, home: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["sh", "-c", command], capture_output=True, text=True,
                          env={**os.environ, "HOME": str(home)})


def test_authorising_the_key_is_once_and_check_changes_nothing(tmp_path):
    from mlxops.tasks.supervisor import AUTHORIZED, authorize_command

    line = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIK mlxops-supervisor@mini1"
    keys = tmp_path / AUTHORIZED.removeprefix("~/")
    assert _sh(authorize_command(line, check=True), tmp_path).stdout == "absent\n"
    assert not keys.exists()
    assert _sh(authorize_command(line, check=False), tmp_path).stdout == "added\n"
    assert _sh(authorize_command(line, check=False), tmp_path).stdout == "present\n"
    # The same key under another comment is the same key.
    other = line.replace("@mini1", "@elsewhere")
    assert _sh(authorize_command(other, check=True), tmp_path).stdout == "present\n"
    assert keys.read_text() == line + "\n"
    assert keys.stat().st_mode & 0o777 == 0o600


def test_the_key_is_made_once_and_never_under_check(tmp_path):
    from mlxops.tasks.supervisor import key_command

    assert _sh(key_command("mini1", create=False), tmp_path).stdout == ""
    made = _sh(key_command("mini1", create=True), tmp_path)
    assert made.returncode == 0, made.stderr
    assert made.stdout.startswith("ssh-ed25519 ") and "mlxops-supervisor@mini1" in made.stdout
    assert _sh(key_command("mini1", create=True), tmp_path).stdout == made.stdout
    assert _sh(key_command("mini1", create=False), tmp_path).stdout == made.stdout


def test_the_venv_is_pinned_to_the_controllers_versions():
    from importlib import metadata

    from mlxops.tasks.supervisor import requirements

    assert f"paramiko=={metadata.version('paramiko')}" in requirements()
    assert f"pyyaml=={metadata.version('pyyaml')}" in requirements()


class _Unreachable:
    """A connector whose every host is down, as the transport says it."""

    def connect(self, host):
        from mlxops.transport import HostUnreachable

        raise HostUnreachable(host.name, "connect timed out after 10s")


def test_an_unreachable_supervisor_is_one_line_before_any_rank_starts(tmp_path):
    from mlxops.errors import MlxopsError
    from mlxops.jobs.supervising import prepare

    _inventory(tmp_path, INVENTORY)
    spec = load_job(_job(tmp_path, "supervisor: mini2\n"))
    hosts = load_inventory(spec.inventory).select(spec.hosts)
    with pytest.raises(MlxopsError) as err:
        prepare(spec, hosts, _Unreachable())
    assert str(err.value) == "supervisor mini2: unreachable: connect timed out after 10s"


def test_a_job_with_a_workdir_stays_supervised_by_the_controller(tmp_path):
    from mlxops.jobs.supervising import prepare

    _inventory(tmp_path, INVENTORY)
    (tmp_path / "src").mkdir()
    path = tmp_path / "job.yml"
    path.write_text("name: own\ninventory: inventory.yml\ncommand: [python, run.py]\n"
                    "workdir: src\nsupervisor: mini2\n")
    spec = load_job(path)
    with pytest.raises(UserError, match="supervisor: a job with workdir: is supervised by "
                                        "the controller only"):
        prepare(spec, load_inventory(spec.inventory).select(spec.hosts), _Unreachable())

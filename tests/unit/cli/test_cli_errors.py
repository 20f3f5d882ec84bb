"""Bad input to the host commands: exit 2 and one line on stderr naming the file and key.

Run through the real entry point (``python -m mlxops``) so that a traceback anywhere on
the way out would show. No host is ever contacted: every case fails while loading.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

GOOD = """\
all:
  children:
    macs:
      hosts:
        mac1: {ansible_host: 192.0.2.1}
        mac2: {ansible_host: 192.0.2.2}
"""


def mlxops(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "MLXOPS_HOME": str(tmp_path / "home")}
    return subprocess.run([sys.executable, "-m", "mlxops", *args], capture_output=True,
                          text=True, timeout=60, env=env, stdin=subprocess.DEVNULL)


def assert_one_line_error(proc: subprocess.CompletedProcess, *needles: str) -> str:
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert proc.stdout == ""
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


def write(tmp_path: Path, text: str, name: str = "inventory.yml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


@pytest.mark.parametrize("cmd", [["run"], ["trust"]])
def test_missing_inventory(tmp_path, cmd):
    missing = tmp_path / "nope.yml"
    extra = ["--", "true"] if cmd == ["run"] else []
    proc = mlxops(tmp_path, *cmd, str(missing), *extra)
    assert_one_line_error(proc, str(missing), "no such file")


def test_invalid_yaml(tmp_path):
    inv = write(tmp_path, "all:\n  hosts:\n    mac1:\n      mlxops_env: [a, b\n")
    line = assert_one_line_error(mlxops(tmp_path, "run", str(inv), "--", "true"),
                                 str(inv), "invalid YAML")
    assert "line " in line  # where in the file


def test_limit_matching_nothing(tmp_path):
    inv = write(tmp_path, GOOD)
    proc = mlxops(tmp_path, "run", str(inv), "--limit", "studio9", "--", "true")
    assert_one_line_error(proc, "--limit", "studio9", str(inv))


def test_limit_bad_regex(tmp_path):
    inv = write(tmp_path, GOOD)
    proc = mlxops(tmp_path, "trust", str(inv), "--limit", "~mac[")
    assert_one_line_error(proc, "--limit", "mac[")


@pytest.mark.parametrize("host_vars, key, problem", [
    ("ansible_port: ssh", "all.children.macs.hosts.mac1.ansible_port", "port number"),
    ("mlxops_slots: two", "all.children.macs.hosts.mac1.mlxops_slots", "positive integer"),
    ("mlxops_env: {1BAD: x}", "all.children.macs.hosts.mac1.mlxops_env",
     "environment variable name"),
    ("mlxops_rooot: /x", "all.children.macs.hosts.mac1.mlxops_rooot", "mlxops_root"),
])
def test_bad_variable_value(tmp_path, host_vars, key, problem):
    inv = write(tmp_path, GOOD.replace("mac1: {ansible_host: 192.0.2.1}",
                                       f"mac1: {{ansible_host: 192.0.2.1, {host_vars}}}"))
    line = assert_one_line_error(mlxops(tmp_path, "run", str(inv), "--", "true"),
                                 str(inv), key, problem)
    assert line.startswith("mlxops: error: ")


def test_bad_group_vars_file_is_named(tmp_path):
    inv = write(tmp_path, GOOD)
    (tmp_path / "group_vars").mkdir()
    bad = write(tmp_path / "group_vars", "mlxops_slots: 0\n", "macs.yml")
    assert_one_line_error(mlxops(tmp_path, "trust", str(inv)), str(bad), "mlxops_slots")


def test_run_without_command_is_a_usage_error(tmp_path):
    inv = write(tmp_path, GOOD)
    proc = mlxops(tmp_path, "run", str(inv))
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr


# --- refused before any connection ---------------------------------------------------------
# The hosts are on TEST-NET-1 (192.0.2.0/24), which nothing answers: had a command tried to
# connect, it would wait out --connect-timeout (30 s) and the subprocess timeout (20 s) would
# fail the test. So a quick exit 2 proves the refusal came before any connection.

JOB = """\
name: world
inventory: inventory.yml
hosts: {hosts}
trainer:
  model: {{dims: 32, layers: 1, heads: 2, seq_len: 16}}
  train: {{steps: 10, global_batch: {batch}}}
"""
SLOTS = """\
all:
  hosts:
    mac1: {ansible_host: 192.0.2.1, mlxops_slots: 2}
    mac2: {ansible_host: 192.0.2.2}
"""


def quick(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "MLXOPS_HOME": str(tmp_path / "home")}
    return subprocess.run([sys.executable, "-m", "mlxops", *args], capture_output=True,
                          text=True, timeout=20, env=env, stdin=subprocess.DEVNULL)


@pytest.mark.parametrize("cmd", [["launch", "--connect-timeout", "30"], ["plan"]])
def test_global_batch_not_divisible_by_the_ranks_is_refused(tmp_path, cmd):
    write(tmp_path, SLOTS)
    job = write(tmp_path, JOB.format(hosts="all", batch=8), "bad.yml")
    line = assert_one_line_error(quick(tmp_path, *cmd, str(job)),
                                 f"{job}: trainer.train.global_batch: 8 is not divisible by "
                                 "the world size 3", "give 3 ranks")
    assert line.startswith("mlxops: error: ")
    assert not (tmp_path / "home" / "jobs" / "world").exists()  # nothing recorded


def test_the_same_job_on_hosts_that_divide_it_passes_the_check(tmp_path):
    write(tmp_path, SLOTS)
    job = write(tmp_path, JOB.format(hosts="mac1", batch=8), "ok.yml")
    proc = quick(tmp_path, "plan", str(job))
    assert "global_batch" not in proc.stderr


@pytest.mark.parametrize("host_vars, key, problem", [
    ("ansible_ssh_private_key_file: keys/nope", "ansible_ssh_private_key_file",
     "no such file: {tmp}/keys/nope"),
    ('ansible_user: "me\\nProxyCommand touch x"', "ansible_user", "control characters"),
    ('ansible_user: "me\\tyou"', "ansible_user", "control characters"),
    ('ansible_host: "192.0.2.1\\r"', "ansible_host", "control characters"),
    ("ansible_host: me@192.0.2.1", "ansible_host", "the user goes in ansible_user"),
    ("mlxops_ip: mac1.local", "mlxops_ip", "must be an IP address"),
    ('mlxops_ssh_target: "me@mac1\\n"', "mlxops_ssh_target", "control characters"),
    ("mlxops_ssh_target: -oProxyCommand=x", "mlxops_ssh_target", "SSH target"),
    ("mlxops_slots: 4096", "mlxops_slots", "at most 32"),
])
def test_values_that_would_fail_at_connect_are_refused_first(tmp_path, host_vars, key, problem):
    mine = "" if key == "ansible_host" else "ansible_host: 192.0.2.1, "
    inv = write(tmp_path, GOOD.replace("mac1: {ansible_host: 192.0.2.1}",
                                       f"mac1: {{{mine}{host_vars}}}"))
    proc = quick(tmp_path, "run", str(inv), "--connect-timeout", "30", "--", "true")
    assert_one_line_error(proc, f"{inv}: all.children.macs.hosts.mac1.{key}: ",
                          problem.format(tmp=tmp_path))


@pytest.mark.parametrize("cmd", [["trust"], ["provision"]])
def test_every_connecting_command_refuses_a_missing_key_first(tmp_path, cmd):
    inv = write(tmp_path, GOOD.replace("mac2: {ansible_host: 192.0.2.2}",
                                       "mac2: {ansible_host: 192.0.2.2, "
                                       "ansible_ssh_private_key_file: nope}"))
    proc = quick(tmp_path, *cmd, str(inv), "--connect-timeout", "30")
    assert_one_line_error(proc, f"{inv}: all.children.macs.hosts.mac2."
                                f"ansible_ssh_private_key_file: no such file: {tmp_path}/nope")


def test_a_missing_key_of_a_host_not_selected_is_not_an_error(tmp_path):
    inv = write(tmp_path, GOOD.replace("mac1: {ansible_host: 192.0.2.1}",
                                       "mac1: {ansible_host: 192.0.2.1, "
                                       "ansible_ssh_private_key_file: nope}"))
    proc = quick(tmp_path, "hostfile", str(inv))  # renders only: nothing connects
    assert proc.returncode == 0, proc.stderr
    proc = quick(tmp_path, "run", str(inv), "--limit", "mac1", "--", "true")
    assert_one_line_error(proc, "ansible_ssh_private_key_file: no such file")


def test_a_job_on_a_host_with_a_missing_key_is_refused_before_connecting(tmp_path):
    write(tmp_path, SLOTS.replace("mlxops_slots: 2}", "mlxops_slots: 2, "
                                  "ansible_ssh_private_key_file: ~/nope/id}"))
    job = write(tmp_path, JOB.format(hosts="all", batch=6), "job.yml")
    assert_one_line_error(quick(tmp_path, "launch", "--connect-timeout", "30", str(job)),
                          "inventory.yml: all.hosts.mac1.ansible_ssh_private_key_file: no such "
                          "file: ")

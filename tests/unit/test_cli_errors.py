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

"""``mlxops trust`` on the sandbox's real sshd nodes: show fingerprints, record new keys,
never record a changed one."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from cli_helpers import host_key_fingerprint, known_lines, run_json

pytestmark = pytest.mark.integration


def trust(tmp_path: Path, sandbox, *args: str) -> subprocess.CompletedProcess:
    # No COLUMNS: the table must show whole fingerprints at the default 80 columns too.
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    env["MLXOPS_HOME"] = str(tmp_path / "mlxops-home")
    return subprocess.run([sys.executable, "-m", "mlxops", "trust",
                           str(sandbox.inventory_path), *args],
                          capture_output=True, text=True, timeout=60, env=env,
                          stdin=subprocess.DEVNULL)


def row(stdout: str, name: str) -> list[str]:
    """``[host, address, key type, fingerprint, state]`` from ``name``'s block (an
    unreachable host: ``[host, "", "", why, "unreachable"]``)."""
    lines = stdout.splitlines()
    for i, line in enumerate(lines):
        head = re.fullmatch(rf"{re.escape(name)}(?: \((.+)\))?: (\S+)", line)
        if head:
            address, state = head.group(1) or "", head.group(2)
            detail = lines[i + 1] if i + 1 < len(lines) else ""
            assert detail.startswith("  "), stdout  # the block's second line
            if state == "unreachable":
                return [name, address, "", detail.strip(), state]
            key_type, fingerprint = detail.split()
            return [name, address, key_type, fingerprint, state]
    raise AssertionError(f"no block for {name} in:\n{stdout}")


def test_trust_records_a_forgotten_key_then_run_works(sandbox_mut, tmp_path):
    sandbox = sandbox_mut
    sandbox.forget_host_key("node4")
    expected = host_key_fingerprint(sandbox, "node4")

    proc = trust(tmp_path, sandbox, "--yes")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert row(proc.stdout, "node4") == ["node4", sandbox.ip("node4"), "ssh-ed25519",
                                         expected, "new"]
    for name in sandbox.nodes:
        if name != "node4":
            assert row(proc.stdout, name)[3:] == [host_key_fingerprint(sandbox, name), "known"]
    assert "recorded 1 host key(s)" in proc.stdout
    recorded = known_lines(sandbox, "node4")
    assert len(recorded) == 1
    assert recorded[0].split()[1:] == sandbox.host_key_line("node4").split()

    proc, doc = run_json(tmp_path, sandbox.inventory_path, "--limit", "node4", "--", "true")
    assert proc.returncode == 0, doc  # no --accept-new-host-keys needed now

    before = sandbox.known_hosts_path.read_text()
    proc = trust(tmp_path, sandbox, "--yes")
    assert proc.returncode == 0
    assert row(proc.stdout, "node4")[4] == "known"
    assert "recorded" not in proc.stdout
    assert sandbox.known_hosts_path.read_text() == before


def test_trust_without_yes_records_nothing_when_not_confirmed(sandbox_mut, tmp_path):
    sandbox = sandbox_mut
    sandbox.forget_host_key("node6")
    proc = trust(tmp_path, sandbox, "--limit", "node6")  # stdin is empty: no "yes"
    assert row(proc.stdout, "node6")[3:] == [host_key_fingerprint(sandbox, "node6"), "new"]
    assert "Traceback" not in proc.stderr
    assert known_lines(sandbox, "node6") == []


def test_trust_never_records_a_changed_key(sandbox_mut, tmp_path):
    sandbox = sandbox_mut
    before = sandbox.known_hosts_path.read_text()
    sandbox.regenerate_host_key("node5")
    new = host_key_fingerprint(sandbox, "node5")

    proc = trust(tmp_path, sandbox, "--yes")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert row(proc.stdout, "node5")[3:] == [new, "changed"]
    assert "host key changed for node5" in proc.stderr
    assert sandbox.known_hosts_path.read_text() == before

    proc, doc = run_json(tmp_path, sandbox.inventory_path, "--limit", "node5",
                         "--accept-new-host-keys", "--", "true")
    assert proc.returncode == 3
    assert "HOST KEY CHANGED" in doc["hosts"]["node5"]["message"]


def test_trust_unreachable_node_exit_3(sandbox_mut, tmp_path):
    sandbox = sandbox_mut
    sandbox.stop_node("node7")
    proc = trust(tmp_path, sandbox, "--yes", "--limit", "node6:node7:node8")
    assert proc.returncode == 3, proc.stdout + proc.stderr
    cells = row(proc.stdout, "node7")
    assert cells[-1] == "unreachable" and sandbox.ip("node7") in cells[3]
    assert row(proc.stdout, "node6")[4] == "known" and row(proc.stdout, "node8")[4] == "known"

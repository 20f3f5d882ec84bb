"""Helpers shared by the CLI integration tests: run mlxops, read host keys as OpenSSH does."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest


def mlxops(tmp_path: Path, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    """The real CLI in a subprocess, with its own controller home and no stdin."""
    env = {**os.environ, "MLXOPS_HOME": str(tmp_path / "mlxops-home")}
    return subprocess.run([sys.executable, "-m", "mlxops", *args], capture_output=True,
                          text=True, timeout=timeout, env=env, stdin=subprocess.DEVNULL)


def run_json(tmp_path: Path, inventory, *args: str) -> tuple[subprocess.CompletedProcess, dict]:
    """``mlxops run INVENTORY --json ARGS`` (ARGS include ``-- COMMAND``)."""
    proc = mlxops(tmp_path, "run", str(inventory), "--json", *args)
    try:
        doc = json.loads(proc.stdout)  # --json: stdout is one JSON document, nothing else
    except ValueError:
        pytest.fail(f"stdout is not one JSON document: {proc.stdout!r}\nstderr: {proc.stderr}")
    return proc, doc


def host_key_fingerprint(sandbox, name: str) -> str:
    """The node's host-key fingerprint as ``ssh-keygen -l`` prints it."""
    pub = Path(sandbox.dir) / "nodes" / name / "ssh_host_ed25519_key.pub"
    out = subprocess.run(["ssh-keygen", "-l", "-E", "sha256", "-f", str(pub)], check=True,
                         capture_output=True, text=True).stdout
    return out.split()[1]


def known_lines(sandbox, name: str) -> list[str]:
    """known_hosts lines for the node's address, as OpenSSH's own lookup finds them."""
    proc = subprocess.run(["ssh-keygen", "-F", sandbox.ip(name), "-f",
                           str(sandbox.known_hosts_path)], capture_output=True, text=True)
    return [ln for ln in proc.stdout.splitlines() if ln and not ln.startswith("#")]

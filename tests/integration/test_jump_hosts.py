"""Jump hosts (ProxyJump) on the sandbox's sshd nodes: a node that only the other nodes
reach (``isolate_node``: the controller's packets to its port 22 are dropped in its
namespace) is reached through another one named in ``~/.ssh/config``; the hop's key is
verified against the same known_hosts as the node's, refused with its own fingerprint when
unknown (recorded with ``--accept-new-host-keys``) and always when changed; ``mlxops trust``
shows and records it. The controller's ``~/.ssh/config`` is a ``HOME`` of the test's own;
the inventory's ``ansible_ssh_common_args: -J ...`` names a hop too.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from cli_helpers import host_key_fingerprint, known_lines

pytestmark = pytest.mark.integration


def cli_env(home: Path) -> dict[str, str]:
    """The environment of the real CLI with ``home`` as HOME (its ~/.ssh/config)."""
    env = {**os.environ, "HOME": str(home), "MLXOPS_HOME": str(home / "mlxops")}
    env.pop("COLUMNS", None)  # trust's fingerprints must be whole at 80 columns too
    return env


def mlxops(home: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """The real CLI with ``home`` as HOME (its ~/.ssh/config) and no stdin."""
    return subprocess.run([sys.executable, "-m", "mlxops", *args], capture_output=True,
                          text=True, timeout=timeout, env=cli_env(home),
                          stdin=subprocess.DEVNULL)


def ssh_connections_to(address: str) -> list[tuple[str, set[int]]]:
    """This machine's established TCP connections to ``address``:22 (the controller is
    the host's side of the sandbox bridge): (local address, the pids that hold it)."""
    out = subprocess.run(["ss", "-Htnp", "state", "established", f"( dst {address}:22 )"],
                         capture_output=True, text=True, check=True).stdout
    return [(line.split()[2], {int(p) for p in re.findall(r"pid=(\d+)", line)})
            for line in out.splitlines()]


def run(home: Path, sandbox, limit: str, *args: str) -> tuple[subprocess.CompletedProcess, dict]:
    """``mlxops run --json --limit LIMIT ARGS -- <print the SSH client address>``."""
    proc = mlxops(home, "run", str(sandbox.inventory_path), "--json", "--limit", limit, *args,
                  "--", "sh", "-c", 'echo "$SSH_CONNECTION" | cut -d" " -f1')
    return proc, json.loads(proc.stdout)


def ssh_home(tmp_path: Path, sandbox, jumps: dict[str, str]) -> Path:
    """A HOME whose ~/.ssh/config sends each node of ``jumps`` through its ProxyJump
    value (node names, as the sandbox's own ssh_config defines them)."""
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True, exist_ok=True)
    blocks = [f"Host {sandbox.ip(node)}\n  {value}\n" for node, value in jumps.items()]
    (home / ".ssh" / "config").write_text(
        "\n".join(blocks) + "\n" + sandbox.ssh_config_path.read_text())
    return home


def proxy_jump(*hops: str) -> str:
    return f"ProxyJump {','.join(hops)}"


def blocks(stdout: str) -> dict[str, list[str]]:
    """trust's output: ``{"node3": ["known", "ssh-ed25519 SHA256:..", "via ..."], ...}``
    (a block's head ``name (address): state``, then its indented lines; a name shown again,
    after new keys were recorded, by its last block)."""
    found: dict[str, list[str]] = {}
    current = None
    for line in stdout.splitlines():
        head = re.fullmatch(r"(\S.*?)(?: \((\S+)\))?: (\S+)", line)
        if head and not line.startswith(" "):
            current = found[head.group(1)] = [head.group(3)]
        elif line.startswith("  ") and current is not None:
            current.append(line.strip())
    return found


def test_a_node_only_others_reach_is_reached_through_its_jump_host(sandbox_mut, tmp_path):
    sandbox = sandbox_mut
    sandbox.isolate_node("node3")
    home = ssh_home(tmp_path, sandbox, {})
    proc, doc = run(home, sandbox, "node3", "--connect-timeout", "2")
    assert proc.returncode == 3 and doc["hosts"]["node3"]["unreachable"], proc.stdout

    home = ssh_home(tmp_path, sandbox, {"node3": proxy_jump("node1")})
    proc, doc = run(home, sandbox, "node2,node3")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # SSH_CONNECTION's client: node3 was reached from node1, node2 from the controller.
    assert doc["hosts"]["node3"]["stdout"] == f"{sandbox.ip('node1')}\n"
    assert doc["hosts"]["node2"]["stdout"] == f"{sandbox.controller_ip}\n"


def test_nested_jumps_are_visited_in_openssh_order(sandbox_mut, tmp_path):
    """``ProxyJump node1,node2``: node1 first, node2 through it, node4 through node2. Fabric
    would start at node2, which (isolated) the controller cannot reach."""
    sandbox = sandbox_mut
    sandbox.isolate_node("node2")
    sandbox.isolate_node("node4")
    home = ssh_home(tmp_path, sandbox, {"node4": proxy_jump("node1", "node2")})
    proc, doc = run(home, sandbox, "node4")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert doc["hosts"]["node4"]["stdout"] == f"{sandbox.ip('node2')}\n"


def test_hosts_behind_one_jump_host_share_one_connection_to_it(sandbox_mut, tmp_path):
    """One login to the bastion for every Mac behind it, not one each.

    Counted on the controller, every 0.1 s while the run runs: the connections to node1's
    port 22 that the run's own process holds. This test counted, on node1, every
    connection from the controller's address: any other client of the session's sandbox
    connected to node1 meanwhile made it 2, such as the watchdog thread of an earlier test
    that failed before waiting for it (it goes on supervising its job, and reconnects
    after the test's connector closed); it failed in full runs and passed when re-run
    alone. Other processes' connections to node1 are shown when it fails.
    """
    sandbox = sandbox_mut
    behind = ["node3", "node4", "node5", "node6"]
    for node in behind:
        sandbox.isolate_node(node)
    home = ssh_home(tmp_path, sandbox, {n: proxy_jump("node1") for n in behind})
    cli = subprocess.Popen(
        [sys.executable, "-m", "mlxops", "run", str(sandbox.inventory_path), "--json",
         "--limit", ",".join(behind), "--", "sleep", "3"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=cli_env(home),
        stdin=subprocess.DEVNULL)
    most, others = 0, set()
    try:
        deadline = time.monotonic() + 120
        while cli.poll() is None and time.monotonic() < deadline:
            seen = ssh_connections_to(sandbox.ip("node1"))
            most = max(most, sum(1 for _, pids in seen if cli.pid in pids))
            others |= {(local, *sorted(pids)) for local, pids in seen if cli.pid not in pids}
            time.sleep(0.1)
        out, err = cli.communicate(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        if cli.poll() is None:
            cli.kill()
            cli.communicate()
    assert cli.returncode == 0, out + err
    assert most == 1, (most, "other processes' connections to node1:", others)


def test_the_inventorys_ssh_arguments_name_the_jump_host(sandbox_mut, tmp_path):
    """Ansible's way, ``ansible_ssh_common_args: -J user@hop``, and no ~/.ssh/config: the
    hop logs in with the user's own ~/.ssh/id_ed25519, as ssh would."""
    sandbox = sandbox_mut
    sandbox.isolate_node("node3")
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    shutil.copy(sandbox.key_path, home / ".ssh" / "id_ed25519")
    doc = yaml.safe_load(Path(sandbox.inventory_path).read_text())
    doc["all"]["children"]["sandbox"]["hosts"]["node3"]["ansible_ssh_common_args"] = (
        f"-o StrictHostKeyChecking=yes -J {sandbox.user}@{sandbox.ip('node1')}")
    inventory = tmp_path / "inventory.yml"
    inventory.write_text(yaml.safe_dump(doc, sort_keys=False))
    proc = mlxops(home, "run", str(inventory), "--json", "--limit", "node2,node3", "--",
                  "sh", "-c", 'echo "$SSH_CONNECTION" | cut -d" " -f1')
    assert proc.returncode == 0, proc.stdout + proc.stderr
    hosts = json.loads(proc.stdout)["hosts"]
    assert hosts["node3"]["stdout"] == f"{sandbox.ip('node1')}\n"
    assert hosts["node2"]["stdout"] == f"{sandbox.controller_ip}\n"


def test_provision_and_check_reach_a_node_behind_a_jump_host(sandbox_mut, tmp_path):
    sandbox = sandbox_mut
    sandbox.isolate_node("node3")
    home = ssh_home(tmp_path, sandbox, {"node3": proxy_jump("node1")})
    doc = yaml.safe_load(Path(sandbox.inventory_path).read_text())
    doc["all"]["vars"]["mlxops_root"] = "~/.jmp"
    inventory = tmp_path / "inventory.yml"
    inventory.write_text(yaml.safe_dump(doc, sort_keys=False))

    proc = mlxops(home, "provision", str(inventory), "--limit", "node1,node3", timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr
    proc = mlxops(home, "provision", str(inventory), "--limit", "node1,node3", "--json",
                  timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr
    recap = json.loads(proc.stdout)
    assert recap["hosts"]["node3"]["changed"] == 0, recap["hosts"]["node3"]

    proc = mlxops(home, "check", str(inventory), "--limit", "node1,node3", "--json",
                  timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr


def test_unknown_jump_host_key_is_refused_with_its_fingerprint(sandbox_mut, tmp_path):
    sandbox = sandbox_mut
    sandbox.isolate_node("node3")
    sandbox.forget_host_key("node1")
    home = ssh_home(tmp_path, sandbox, {"node3": proxy_jump("node1")})

    proc, doc = run(home, sandbox, "node3")
    assert proc.returncode == 3, proc.stdout + proc.stderr
    message = doc["hosts"]["node3"]["message"]
    assert f"unknown host key for jump host {sandbox.ip('node1')}" in message
    assert host_key_fingerprint(sandbox, "node1") in message
    assert host_key_fingerprint(sandbox, "node3") not in message  # not the question yet
    assert known_lines(sandbox, "node1") == []

    proc, doc = run(home, sandbox, "node3", "--accept-new-host-keys")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    [line] = known_lines(sandbox, "node1")  # recorded, in the node's known_hosts
    assert line.split()[1:] == sandbox.host_key_line("node1").split()
    proc, doc = run(home, sandbox, "node3")
    assert proc.returncode == 0, doc


def test_changed_jump_host_key_is_always_refused(sandbox_mut, tmp_path):
    sandbox = sandbox_mut
    sandbox.isolate_node("node3")
    sandbox.regenerate_host_key("node1")
    home = ssh_home(tmp_path, sandbox, {"node3": proxy_jump("node1")})
    before = sandbox.known_hosts_path.read_text()

    for args in ((), ("--accept-new-host-keys",)):
        proc, doc = run(home, sandbox, "node3", *args)
        assert proc.returncode == 3, proc.stdout + proc.stderr
        message = doc["hosts"]["node3"]["message"]
        assert f"HOST KEY CHANGED for jump host {sandbox.ip('node1')}" in message
        assert host_key_fingerprint(sandbox, "node1") in message
    assert sandbox.known_hosts_path.read_text() == before


def test_trust_shows_the_jump_host_and_records_it_then_goes_on(sandbox_mut, tmp_path):
    sandbox = sandbox_mut
    sandbox.isolate_node("node3")
    sandbox.forget_host_key("node1")
    home = ssh_home(tmp_path, sandbox, {"node3": proxy_jump("node1")})
    node1 = host_key_fingerprint(sandbox, "node1")

    proc = mlxops(home, "trust", str(sandbox.inventory_path), "--limit", "node3")
    assert "Traceback" not in proc.stderr  # stdin is empty: no "yes", nothing recorded
    found = blocks(proc.stdout)
    assert found["jump host node1"] == ["new", f"ssh-ed25519 {node1}"], proc.stdout
    assert found["node3"][0] == "blocked" and "jump host node1" in found["node3"][1]
    assert known_lines(sandbox, "node1") == []

    proc = mlxops(home, "trust", str(sandbox.inventory_path), "--limit", "node3", "--yes")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    found = blocks(proc.stdout)
    assert "recorded 1 host key(s)" in proc.stdout
    # Then node3, behind the hop now trusted, is scanned: known, reached via node1.
    assert found["node3"] == ["known", f"ssh-ed25519 {host_key_fingerprint(sandbox, 'node3')}",
                              "via jump host node1"], proc.stdout
    assert len(known_lines(sandbox, "node1")) == 1
    proc, doc = run(home, sandbox, "node3")
    assert proc.returncode == 0, doc


def test_trust_never_records_a_changed_jump_host_key(sandbox_mut, tmp_path):
    sandbox = sandbox_mut
    sandbox.isolate_node("node3")
    sandbox.regenerate_host_key("node1")
    home = ssh_home(tmp_path, sandbox, {"node3": proxy_jump("node1")})
    before = sandbox.known_hosts_path.read_text()

    proc = mlxops(home, "trust", str(sandbox.inventory_path), "--limit", "node3", "--yes")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    found = blocks(proc.stdout)
    assert found["jump host node1"] == [
        "changed", f"ssh-ed25519 {host_key_fingerprint(sandbox, 'node1')}"], proc.stdout
    assert found["node3"][0] == "blocked"
    assert "host key changed for jump host node1" in proc.stderr
    assert sandbox.known_hosts_path.read_text() == before


def test_proxy_command_still_verifies_the_node_and_trust_says_what_it_does_not(
        sandbox_mut, tmp_path):
    """A ProxyCommand (OpenSSH's ``ssh -W``, which checks node1 by its own config): the
    node's key is still mlxops's to verify, and trust names the command."""
    sandbox = sandbox_mut
    sandbox.isolate_node("node3")
    command = f"ProxyCommand ssh -F {sandbox.ssh_config_path} -W %h:%p node1"
    home = ssh_home(tmp_path, sandbox, {"node3": command})
    proc, doc = run(home, sandbox, "node3")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert doc["hosts"]["node3"]["stdout"] == f"{sandbox.ip('node1')}\n"

    sandbox.forget_host_key("node3")
    proc, doc = run(home, sandbox, "node3")
    assert proc.returncode == 3, doc
    assert host_key_fingerprint(sandbox, "node3") in doc["hosts"]["node3"]["message"]
    proc = mlxops(home, "trust", str(sandbox.inventory_path), "--limit", "node3")
    found = blocks(proc.stdout)
    assert found["node3"][0] == "new" and "ProxyCommand" in found["node3"][2], proc.stdout

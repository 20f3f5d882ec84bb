"""``mlxops run`` on the sandbox's real sshd nodes, through the real CLI.

Parallel output, unreachable hosts, host-key refusal (unknown and changed keys), and
hostile values that must reach the node as data, never as shell.
"""

from __future__ import annotations

import copy
import os
import re
import signal
import subprocess
import time
import uuid
from pathlib import Path

import pytest
import yaml
from cli_helpers import host_key_fingerprint, known_lines, mlxops, run_json

from mlxops.inventory import load_inventory
from mlxops.node.procs import descendants, process_table
from mlxops.transport import ConnectOptions, Connector

pytestmark = pytest.mark.integration


def test_all_nodes_in_parallel_json(sandbox, tmp_path):
    proc, doc = run_json(tmp_path, sandbox.inventory_path,
                         "--", "sh", "-c", 'echo "$SSH_CONNECTION"; id -un; uname -n')
    assert proc.returncode == 0, proc.stderr
    assert list(doc) == ["hosts"]
    assert list(doc["hosts"]) == sandbox.nodes  # inventory order
    for name, host in doc["hosts"].items():
        assert host["status"] == "ok" and host["unreachable"] is False
        assert host["rc"] == 0 and host["stderr"] == "" and host["message"] == ""
        assert host["duration"] >= 0
        conn, user, hostname = host["stdout"].splitlines()
        # SSH_CONNECTION = client-ip client-port server-ip server-port: it ran on that node.
        client_ip, _, server_ip, server_port = conn.split()
        assert server_ip == sandbox.ip(name) and server_port == "22"
        assert client_ip == sandbox.controller_ip
        assert user == sandbox.user
        assert hostname == name  # a name of its own, as every Mac has (Open MPI needs it)


def test_all_nodes_text_output_grouped_per_host_with_recap(sandbox, tmp_path):
    proc = mlxops(tmp_path, "run", str(sandbox.inventory_path), "--",
                  "sh", "-c", 'echo "ran-on $(echo "$SSH_CONNECTION" | cut -d" " -f3)"')
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    for name in sandbox.nodes:
        head = [i for i, ln in enumerate(lines) if re.match(rf"^{name} \| OK \| rc=0 >>$", ln)]
        assert len(head) == 1, proc.stdout
        assert lines[head[0] + 1] == f"ran-on {sandbox.ip(name)}"  # its output right below
    recap = lines.index(next(ln for ln in lines if ln.strip() == "recap"))
    table = "\n".join(lines[recap:])
    for name in sandbox.nodes:
        assert re.search(rf"^\s*{name}\s.*\bOK\b.*\b0\b", table, re.M), table


def test_stopped_node_is_unreachable_others_ok(sandbox_mut, tmp_path):
    sandbox = sandbox_mut
    sandbox.stop_node("node3")
    proc, doc = run_json(tmp_path, sandbox.inventory_path, "--", "echo", "hi")
    assert proc.returncode == 3, proc.stderr
    for name, host in doc["hosts"].items():
        if name == "node3":
            assert host["status"] == "unreachable" and host["unreachable"] is True
            assert host["rc"] is None and host["stdout"] is None
            assert sandbox.ip("node3") in host["message"]
        else:
            assert host["status"] == "ok" and host["unreachable"] is False
            assert host["stdout"] == "hi\n"


def test_a_kept_connection_gone_dead_is_replaced_not_called_unreachable(sandbox_mut):
    """A transport the client still thinks is up (its sshd frozen, as behind a link that
    went down and came back) costs one fresh connection, not an unreachable host."""
    host = load_inventory(sandbox_mut.inventory_path).hosts["node2"]
    with Connector(ConnectOptions(connect_timeout=2)) as connector:
        conn = connector.connect(host)
        assert conn.run("echo one").stdout == "one\n"
        # Only this test's session runs below node2's sshd.
        serving = descendants(sandbox_mut.sshd_pid("node2"), process_table())
        assert serving
        for pid in serving:
            os.kill(pid, signal.SIGSTOP)
        try:
            again = conn.run("echo two", timeout=10)
            assert (again.exit_code, again.stdout) == (0, "two\n")
        finally:
            for pid in serving:
                os.kill(pid, signal.SIGKILL)


def test_become_without_passwordless_sudo_fails_at_once(sandbox, tmp_path):
    """The node user may not sudo (or there is no sudo): a failure, never a prompt that
    would hang the run."""
    proc, doc = run_json(tmp_path, sandbox.inventory_path, "--limit", "node1", "--become",
                         "--timeout", "20", "--", "id", "-u")
    assert proc.returncode == 1, proc.stderr
    host = doc["hosts"]["node1"]
    assert host["status"] == "failed" and host["rc"] not in (0, 124), host
    assert "sudo" in host["stderr"] and host["duration"] < 10, host


def test_failed_command_exit_1(sandbox, tmp_path):
    proc, doc = run_json(tmp_path, sandbox.inventory_path, "--limit", "node1,node2",
                         "--", "sh", "-c", "echo out; echo err >&2; exit 5")
    assert proc.returncode == 1
    for host in doc["hosts"].values():
        assert host["status"] == "failed" and host["unreachable"] is False
        assert (host["rc"], host["stdout"], host["stderr"]) == (5, "out\n", "err\n")
        assert host["message"] == "exit code 5"


def test_timeout_abandons_command(sandbox, tmp_path):
    proc, doc = run_json(tmp_path, sandbox.inventory_path, "--limit", "node1",
                         "--timeout", "1", "--", "sleep", "30")
    assert proc.returncode == 1
    host = doc["hosts"]["node1"]
    assert host["status"] == "failed" and host["rc"] == 124 and host["message"] == "timed out"
    assert host["duration"] < 10


def test_unknown_host_key_refused_then_accepted_and_recorded(sandbox_mut, tmp_path):
    sandbox = sandbox_mut
    marker = f"marker-{uuid.uuid4().hex}"
    sandbox.forget_host_key("node2")
    assert known_lines(sandbox, "node2") == []
    expected = host_key_fingerprint(sandbox, "node2")
    args = ("--limit", "node1,node2", "--", "touch", marker)

    proc, doc = run_json(tmp_path, sandbox.inventory_path, *args)
    assert proc.returncode == 3, proc.stderr
    refused = doc["hosts"]["node2"]
    assert refused["unreachable"] is True
    assert "unknown host key" in refused["message"] and expected in refused["message"]
    assert not (sandbox.node_home("node2") / marker).exists(), "ran on an untrusted host"
    assert (sandbox.node_home("node1") / marker).exists()
    assert known_lines(sandbox, "node2") == []  # refusing records nothing

    # The text output shows the same fingerprint.
    proc = mlxops(tmp_path, "run", str(sandbox.inventory_path), *args)
    assert proc.returncode == 3 and expected in proc.stdout + proc.stderr
    assert not (sandbox.node_home("node2") / marker).exists()

    proc, doc = run_json(tmp_path, sandbox.inventory_path, "--accept-new-host-keys", *args)
    assert proc.returncode == 0, doc
    assert (sandbox.node_home("node2") / marker).exists()
    recorded = known_lines(sandbox, "node2")
    assert len(recorded) == 1
    assert recorded[0].split()[2] == sandbox.host_key_line("node2").split()[1]

    proc, doc = run_json(tmp_path, sandbox.inventory_path, "--limit", "node2", "--", "true")
    assert proc.returncode == 0, doc
    assert len(known_lines(sandbox, "node2")) == 1  # known now: not recorded twice


def test_changed_host_key_refused_even_with_accept_new(sandbox_mut, tmp_path):
    sandbox = sandbox_mut
    marker = f"marker-{uuid.uuid4().hex}"
    before = sandbox.known_hosts_path.read_text()
    old = host_key_fingerprint(sandbox, "node4")
    sandbox.regenerate_host_key("node4")
    new = host_key_fingerprint(sandbox, "node4")
    assert new != old

    for extra in ((), ("--accept-new-host-keys",)):
        proc, doc = run_json(tmp_path, sandbox.inventory_path, *extra,
                             "--limit", "node4,node5", "--", "touch", marker)
        assert proc.returncode == 3, proc.stderr
        refused = doc["hosts"]["node4"]
        assert refused["unreachable"] is True
        assert "HOST KEY CHANGED" in refused["message"]
        assert new in refused["message"] and old in refused["message"]
        assert not (sandbox.node_home("node4") / marker).exists()
        assert doc["hosts"]["node5"]["status"] == "ok"
    assert sandbox.known_hosts_path.read_text() == before  # never recorded


def test_hostile_values_execute_nothing(sandbox, tmp_path):
    tag = uuid.uuid4().hex
    markers = [f"/tmp/pwned-{tag}-{i}" for i in range(8)]
    doc = yaml.safe_load(Path(sandbox.inventory_path).read_text())
    vars_ = doc["all"]["vars"]
    vars_["mlxops_env"] = {"X": f"$(touch {markers[0]})", "Y": f"`touch {markers[1]}`"}
    vars_["mlxops_root"] = f"~/.mlxops; touch {markers[2]}"
    hosts = doc["all"]["children"]["sandbox"]["hosts"]
    # A user name cannot hold spaces (refused when the inventory loads, see below): this one
    # is still shell syntax, and no such user exists.
    hosts["node8"]["ansible_user"] = f"{sandbox.user};touch${{IFS}}{markers[3]}"
    # A key that exists, under a name that is shell syntax: its directories spell
    # `keys$(touch /tmp/pwned-...-4)`. Not a key the nodes accept: node7 stays out.
    key_dir = tmp_path / "keys$(touch " / "tmp"
    key_dir.mkdir(parents=True)
    key = f"{tmp_path}/keys$(touch {markers[4]})"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", key], check=True,
                   stdin=subprocess.DEVNULL)
    hosts["node7"]["ansible_ssh_private_key_file"] = key
    inv = tmp_path / "inventory.yml"
    inv.write_text(yaml.safe_dump(doc, sort_keys=False))

    words = [f"$(touch {markers[5]})", f"`touch {markers[6]}`", f"; touch {markers[7]}",
             f"| touch pwned-{tag}-rel", "$HOME", "*", "'\"", "two\nlines", ""]
    proc, out = run_json(tmp_path, inv, "--", "printf", "[%s]\n", *words)
    assert proc.returncode == 3, proc.stderr  # node8 and node7 cannot log in; nothing else
    expected = "".join(f"[{w}]\n" for w in words)
    for name in sandbox.nodes[:6]:
        assert out["hosts"][name]["status"] == "ok", out["hosts"][name]
        assert out["hosts"][name]["stdout"] == expected  # verbatim
    assert out["hosts"]["node7"]["unreachable"] and out["hosts"]["node8"]["unreachable"]

    # What cannot work is refused before anything connects: exit 2, one line with the key.
    for name, var, value in [
            ("node8", "ansible_user", f"{sandbox.user}; touch {markers[3]}"),
            ("node8", "ansible_user", f"{sandbox.user}\nProxyCommand touch {markers[3]}"),
            ("node7", "ansible_ssh_private_key_file",
             f"{vars_['ansible_ssh_private_key_file']}$(touch {markers[4]})")]:
        bad = copy.deepcopy(doc)
        bad["all"]["children"]["sandbox"]["hosts"][name][var] = value
        bad_inv = tmp_path / "bad.yml"
        bad_inv.write_text(yaml.safe_dump(bad, sort_keys=False))
        proc = mlxops(tmp_path, "run", str(bad_inv), "--", "true")
        assert proc.returncode == 2, proc.stderr
        assert proc.stderr.count("\n") == 1
        assert f"all.children.sandbox.hosts.{name}.{var}: " in proc.stderr

    assert [m for m in markers if os.path.exists(m)] == []
    for name in sandbox.nodes:
        assert list(sandbox.node_home(name).glob(f"pwned-{tag}*")) == []
        assert not (sandbox.node_home(name) / ".mlxops; touch").exists()


def test_timeout_kills_the_remote_command(sandbox, tmp_path):
    word = f"{30 + uuid.uuid4().int % 1000 / 1000:.3f}"  # a sleep nobody else runs
    proc, doc = run_json(tmp_path, sandbox.inventory_path, "--limit", "node1",
                         "--timeout", "1", "--", "sleep", word)
    assert doc["hosts"]["node1"]["message"] == "timed out"

    def left() -> list[int]:  # the sleep this test started, found by its unique argument
        return [int(pid) for pid in subprocess.run(
            ["pgrep", "-f", f"^sleep {word}$"], capture_output=True, text=True).stdout.split()]

    # Gone soon after the timeout, however slow the machine (a fixed 1 s wait raced it);
    # well before the sleep's own 30 s, which would end it anyway.
    deadline = time.monotonic() + 15
    while (found := left()) and time.monotonic() < deadline:
        time.sleep(0.2)
    for pid in found:
        os.kill(pid, signal.SIGKILL)
    assert found == [], "the remote command outlived --timeout"

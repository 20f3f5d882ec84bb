"""The sandbox read back from its state.json, without root or a running node: what
`mlxops sandbox status` and the tests' queries see (no kernel object is touched)."""

from __future__ import annotations

import json

import pytest

from mlxops.errors import MlxopsError, UserError
from mlxops.sandbox import Sandbox
from mlxops.sandbox.faults import Faults
from mlxops.sandbox.layout import NodeLayout
from mlxops.sandbox.state import STATE_VERSION, SandboxState


def write_state(path, **extra):
    state = {"version": STATE_VERSION, "prefix": "mxq", "subnet": "10.250.7.0/24",
             "bridge": "mxq-br", "user": "someone", "login_shell": "bash", "flavour": "linux",
             "rate": None, "python": "/venv/bin/python",
             "nodes": [{"name": "node1", "ip": "10.250.7.11", "netns": "mxq-node1",
                        "veth": "mxq-v1", "sshd_pid": None},
                       {"name": "node2", "ip": "10.250.7.12", "netns": "mxq-node2",
                        "veth": "mxq-v2", "sshd_pid": None}]}
    state.update(extra)
    path.mkdir(parents=True, exist_ok=True)
    (path / "state.json").write_text(json.dumps(state))


def test_the_sandbox_is_its_lifecycle_its_state_and_its_faults():
    assert issubclass(Sandbox, Faults) and issubclass(Faults, SandboxState)
    for method in ("up", "down", "is_running", "stop_node", "start_node", "disconnect_node",
                   "reconnect_node", "forget_host_key", "trust_host_key",
                   "regenerate_host_key", "restore", "exec_in", "popen_in", "node_home",
                   "write_node_file", "node_layout", "sshd_alive"):
        assert callable(getattr(Sandbox, method)), method


def test_empty_dir_is_no_sandbox(tmp_path):
    box = Sandbox(tmp_path / "none")
    assert box.nodes == [] and not box.is_running()
    box.down()  # nothing to do, and no root needed for nothing
    with pytest.raises(UserError, match="sandbox up"):
        box.info  # noqa: B018 - the property raises


def test_state_is_read_back(tmp_path):
    write_state(tmp_path)
    box = Sandbox(tmp_path, prefix="ignored", subnet="10.1.2.0/24")
    assert box.nodes == ["node1", "node2"]
    assert box.user == "someone" and box.python == "/venv/bin/python"
    assert box.controller_ip == "10.250.7.1"  # from state.json, not the constructor
    assert box.node_layout("node2") == NodeLayout("node2", "10.250.7.12", "mxq-node2",
                                                  "mxq-v2")
    assert box.ip("node1") == "10.250.7.11"
    assert box.node_home("node1") == tmp_path / "nodes" / "node1" / "home"
    assert box.info.nodes == {"node1": "10.250.7.11", "node2": "10.250.7.12"}
    assert box.info.inventory_path == tmp_path / "inventory.yml"
    assert box.sshd_pid("node1") is None and not box.sshd_alive("node1")
    with pytest.raises(UserError, match="no node named 'node9'"):
        box.ip("node9")


def test_a_state_of_another_version_is_refused(tmp_path):
    write_state(tmp_path, version=STATE_VERSION + 1)
    with pytest.raises(MlxopsError, match="unknown state version"):
        Sandbox(tmp_path)


def test_rates_per_node_are_checked_before_anything_is_made():
    from mlxops.sandbox.layout import node_rates

    names = ["node1", "node2", "node3"]
    assert node_rates(["400mbit", "node3=100mbit"], names) == {
        "node1": "400mbit", "node2": "400mbit", "node3": "100mbit"}
    assert node_rates(["node2=1gbit"], names) == {"node1": None, "node2": "1gbit",
                                                  "node3": None}
    assert node_rates([], names) == dict.fromkeys(names)
    with pytest.raises(UserError, match="no node 'node9'"):
        node_rates(["node9=100mbit"], names)
    with pytest.raises(UserError, match="--rate"):
        node_rates(["node2=fast"], names)


def test_a_nodes_rate_is_read_back_and_older_states_have_one_for_all(tmp_path):
    write_state(tmp_path, rate="200mbit")
    box = Sandbox(tmp_path)
    assert box.rate("node1") == "200mbit"  # no per-node entry: the sandbox's rate
    state = json.loads((tmp_path / "state.json").read_text())
    state["nodes"][1]["rate"] = "100mbit"
    state["nodes"][1]["shaped"] = "50mbit"
    (tmp_path / "state.json").write_text(json.dumps(state))
    assert Sandbox(tmp_path).rate("node2") == "50mbit"


def test_a_mac_like_sandbox_is_read_back_with_its_tools_first_and_no_proc(tmp_path):
    """--flavour macos (mlxops/sandbox/darwin): the sessions' PATH starts with the shims,
the node's interface is en0, and every command on a node
    runs where /proc is hidden (an older state without a flavour is a plain sandbox)."""
    with pytest.raises(UserError, match="--flavour"):
        SandboxState(tmp_path / "new", flavour="windows")
    write_state(tmp_path / "plain")
    plain = Sandbox(tmp_path / "plain")
    assert (plain.flavour, plain.iface, plain.session_env()) == ("linux", "eth0", {})
    write_state(tmp_path / "mac", flavour="macos", login_shell="zsh", user="root")
    mac = Sandbox(tmp_path / "mac")
    assert mac.is_mac and mac.iface == "en0"
    env = mac.session_env()
    assert env["PATH"].startswith(f"{tmp_path / 'mac' / 'darwin' / 'bin'}:")
    assert "TMPDIR" not in env  # every account's own, Mac-like or not (test_sandbox_tmp.py)
    argv = mac.node_argv("node1", ["ps", "-A"], user=None)
    wrapper = argv[argv.index("-c") + 1]
    assert "mount -t tmpfs -o ro,mode=755 tmpfs /proc" in wrapper
    assert argv[-4:] == [str(tmp_path / "mac" / "nodes" / "node1" / "darwin"),
                         str(tmp_path / "mac" / "darwin" / "node"), "ps", "-A"]
    write_state(tmp_path / "plain", user="root")
    plain_argv = Sandbox(tmp_path / "plain").node_argv("node1", ["true"], user=None)
    assert "tmpfs /proc" not in " ".join(plain_argv)   # /proc stays (the cgroup mount may use one)

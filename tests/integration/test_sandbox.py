"""The sandbox itself: real sshd nodes with their own addresses, homes and interpreter,
a real MLX ring between namespaces, and a ``down`` that leaves nothing behind."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import textwrap
import uuid
from importlib import metadata

import pytest

from mlxops.errors import UserError
from mlxops.sandbox import Sandbox
from mlxops.sandbox.netns import link_exists, netns_exists, pid_alive

pytestmark = pytest.mark.integration


def ssh(box: Sandbox, node: str, command: str, timeout: float = 30) -> subprocess.CompletedProcess:
    """Real OpenSSH with the generated key, ssh_config and strict host key checking."""
    return subprocess.run(["ssh", "-F", str(box.ssh_config_path), node, command],
                          capture_output=True, text=True, timeout=timeout)


def test_every_node_answers_ssh_as_node_user_on_its_own_address(sandbox):
    assert len(sandbox.nodes) == 8
    ips = set()
    for node in sandbox.nodes:
        res = ssh(sandbox, node, "whoami; ip -4 -o addr show dev eth0")
        assert res.returncode == 0, res.stderr
        user, addr = res.stdout.splitlines()
        assert user == sandbox.user
        assert f"{sandbox.ip(node)}/" in addr
        ips.add(sandbox.ip(node))
    assert len(ips) == 8


def test_inventory_is_ready_to_use(sandbox):
    import yaml

    inv = yaml.safe_load(sandbox.inventory_path.read_text())["all"]
    assert inv["vars"]["ansible_user"] == sandbox.user
    assert inv["vars"]["ansible_ssh_private_key_file"] == str(sandbox.key_path)
    assert inv["vars"]["mlxops_known_hosts"] == str(sandbox.known_hosts_path)
    assert inv["vars"]["mlxops_python"] == sandbox.python
    hosts = inv["children"]["sandbox"]["hosts"]
    assert {n: h["ansible_host"] for n, h in hosts.items()} == sandbox.info.nodes
    known = sandbox.known_hosts_path.read_text().split()
    assert all(sandbox.ip(n) in known for n in sandbox.nodes)


def test_nodes_reach_each_other_and_the_controller_over_tcp(sandbox):
    server = textwrap.dedent("""
        import socket, sys
        s = socket.socket(); s.bind((sys.argv[1], 7000)); s.listen(1)
        print("ready", flush=True)
        c, addr = s.accept(); c.sendall(("hello from " + sys.argv[1]).encode()); c.close()
        print(addr[0], flush=True)
    """)
    client = ("import socket, sys; "
              "print(socket.create_connection((sys.argv[1], 7000), timeout=5).recv(100).decode())")
    node2 = sandbox.ip("node2")
    srv = sandbox.popen_in("node2", [sandbox.python, "-c", server, node2],
                           stdout=subprocess.PIPE, text=True)
    try:
        assert srv.stdout.readline().strip() == "ready"
        res = sandbox.exec_in("node1", [sandbox.python, "-c", client, node2], timeout=15)
        assert res.stdout.strip() == f"hello from {node2}", res.stderr
        assert srv.stdout.readline().strip() == sandbox.ip("node1")  # no NAT in between
    finally:
        srv.kill()
        srv.wait()
    # ...and the controller, on the bridge address, from the last node.
    with socket.create_server((sandbox.controller_ip, 0)) as listener:
        port = listener.getsockname()[1]
        res = sandbox.exec_in("node8", [sandbox.python, "-c",
                                        "import socket, sys; socket.create_connection("
                                        "(sys.argv[1], int(sys.argv[2])), timeout=5)",
                                        sandbox.controller_ip, str(port)], timeout=15)
        assert res.returncode == 0, res.stderr
        conn, addr = listener.accept()
        conn.close()
        assert addr[0] == sandbox.ip("node8")


def test_each_node_has_its_own_home(sandbox):
    marker = f"marker-{uuid.uuid4().hex}"
    assert ssh(sandbox, "node1", f"echo one > ~/{marker}").returncode == 0
    assert (sandbox.node_home("node1") / marker).read_text() == "one\n"
    assert not (sandbox.node_home("node2") / marker).exists()
    res = ssh(sandbox, "node2", f"test -e ~/{marker} && echo present || echo absent")
    assert res.stdout.strip() == "absent"
    # exec_in sees the node exactly as its ssh sessions do.
    assert sandbox.exec_in("node1", ["cat", f"/home/{sandbox.user}/{marker}"]).stdout == "one\n"


def test_node_python_imports_mlx_as_node_user(sandbox):
    res = ssh(sandbox, "node3",
              f"{sandbox.python} -c 'import mlx.core as mx, numpy, getpass; "
              f"print(getpass.getuser(), mx.__version__, mx.sum(mx.arange(5)).item())'")
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == [sandbox.user, metadata.version("mlx"), "10"]


def test_each_login_account_compiles_mlx_kernels_in_a_tmpdir_of_its_own(sandbox, zsh_sandbox):
    # MLX's CPU backend compiles kernels under $TMPDIR/mlx/<version>/, which belongs to the
    # account that compiled first: the bash and the zsh account must not share it.
    compiled = f"{sandbox.python} -c 'import mlx.core as mx; " \
               "print(mx.compile(lambda x: mx.exp(x) * 2 + 1)(mx.zeros(4)).tolist())'"
    tmpdirs = {}
    for box in (sandbox, zsh_sandbox):
        res = ssh(box, "node1", f'{compiled} && stat -c %U "$TMPDIR/mlx" && echo "$TMPDIR"')
        assert res.returncode == 0, res.stderr
        values, owner, tmpdirs[box.user] = res.stdout.splitlines()
        assert (values, owner) == ("[3.0, 3.0, 3.0, 3.0]", box.user)
    assert len(set(tmpdirs.values())) == 2, tmpdirs


def test_mlx_ring_all_sum_between_two_namespaces(sandbox):
    """A real 2-rank ring: rank 0 on node1's address, rank 1 on node2's, as launch.py
    sets it up (MLX_RANK + MLX_HOSTFILE naming a JSON list of ["ip:port"] per rank)."""
    ranks = ["node1", "node2"]
    hostfile = json.dumps([[f"{sandbox.ip(n)}:5520"] for n in ranks])
    script = textwrap.dedent("""
        import mlx.core as mx
        g = mx.distributed.init(strict=True, backend="ring")
        x = mx.distributed.all_sum(mx.array([g.rank() + 1.0, 10.0]), group=g)
        mx.eval(x)
        print(g.rank(), g.size(), x.tolist(), flush=True)
    """)
    procs = []
    for rank, node in enumerate(ranks):
        path = sandbox.write_node_file(node, "ring-hostfile.json", hostfile)
        env = {"MLX_RANK": str(rank), "MLX_HOSTFILE": f"/home/{sandbox.user}/{path.name}"}
        procs.append(sandbox.popen_in(node, [sandbox.python, "-c", script], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True))
    try:
        outs = [p.communicate(timeout=60) for p in procs]
    finally:
        for p in procs:  # a hung collective never ends by itself
            p.kill()
    for rank, (p, (out, err)) in enumerate(zip(procs, outs, strict=True)):
        assert p.returncode == 0, err
        assert out.strip().split(maxsplit=2) == [str(rank), "2", "[3.0, 20.0]"]


def test_stopped_node_refuses_and_unknown_host_key_is_rejected(sandbox_mut):
    box = sandbox_mut
    box.stop_node("node4")
    res = ssh(box, "node4", "true")
    assert res.returncode == 255 and "refused" in res.stderr
    assert ssh(box, "node5", "true").returncode == 0  # only node4 is down
    box.start_node("node4")
    assert ssh(box, "node4", "true").returncode == 0

    box.forget_host_key("node5")
    res = ssh(box, "node5", "true")
    assert res.returncode == 255 and "Host key verification failed" in res.stderr
    box.trust_host_key("node5")
    assert ssh(box, "node5", "true").returncode == 0

    box.regenerate_host_key("node6")
    res = ssh(box, "node6", "true")
    assert res.returncode == 255 and "IDENTIFICATION HAS CHANGED" in res.stderr


def test_up_with_rate_then_down_removes_everything(sandbox, subnet_pool):
    """A second, small sandbox beside the session one (own dir, prefix, subnet)."""
    path = f"/tmp/mlxops-test-sandbox-extra-{os.getpid()}"
    box = Sandbox(path, prefix=f"mxu{os.getpid() % 10**6}")
    try:
        info = box.up(2, rate="200mbit", subnet_pool=subnet_pool)
        assert oct(os.stat(path).st_mode & 0o777) == "0o755"
        with pytest.raises(UserError, match="down"):
            Sandbox(path).up(2)
        tc = subprocess.run(["tc", "qdisc", "show", "dev", box.node_layout("node1").veth],
                            capture_output=True, text=True).stdout
        assert "tbf" in tc and "200Mbit" in tc
        res = ssh(box, "node2", "true")
        assert res.returncode == 0, res.stderr
        made = [box.node_layout(n) for n in info.nodes]
        pids = [box.sshd_pid(n) for n in info.nodes]
        bridge = box.layout.bridge
    finally:
        Sandbox(path).down()  # a fresh object: down works from state.json alone
    assert not any(netns_exists(n.netns) for n in made)
    assert not any(link_exists(n.veth) for n in made)
    assert not link_exists(bridge)
    assert not any(pid_alive(p) for p in pids)
    assert not os.path.exists(path)
    Sandbox(path).down()  # idempotent

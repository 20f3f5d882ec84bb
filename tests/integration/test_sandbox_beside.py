"""Sandboxes beside each other and beside what else runs on the machine (issue 34).

- ``up`` takes the node account under the machine's sandbox lock (shown by holding it);
  several ``up`` at once, in separate processes, for one node account that does not exist
  yet (as the suite's xdist workers on a fresh machine): every node of every sandbox lets
  its client in. Two ``useradd`` of one name at once both succeed and the second gives the
  account a new uid; a sandbox that read the first made its nodes' homes that uid's and
  its sshd refused the key (mlxops/sandbox/hostlock.py).
- A machine with another program's network namespace and sshd (a route to a subnet the
  sandbox would pick, an sshd on the address its node1 would have, a pid file of its
  own): the sandbox takes another subnet, refuses that one when told to use it, and leaves
  the other program's namespace, route and sshd as they were.
"""

from __future__ import annotations

import ipaddress
import json
import os
import pwd
import shutil
import subprocess
import sys
import time

import pytest

from mlxops.errors import MlxopsError, UserError
from mlxops.sandbox import Sandbox, hostlock
from mlxops.sandbox.layout import SubnetPool
from mlxops.sandbox.netns import link_exists, netns_exists, pick_subnet, pid_alive

pytestmark = [pytest.mark.integration, pytest.mark.slow]

# One sandbox's `up`, in a process of its own, started at a given time so that all of
# them make the account at once.
_UP = """
import json, sys, time
from mlxops.sandbox import Sandbox, hostlock
from mlxops.sandbox.layout import SubnetPool
path, prefix, user, python, seed, start = sys.argv[1:]
box = Sandbox(path, prefix=prefix, user=user)
time.sleep(max(0.0, float(start) - time.time()))
info = box.up(2, python=python, subnet_pool=SubnetPool(range(232, 240), int(seed)))
print(json.dumps({"subnet": str(box.layout.subnet)}))
"""


def ssh(box: Sandbox, node: str, command: str) -> subprocess.CompletedProcess:
    return subprocess.run(["ssh", "-F", str(box.ssh_config_path), node, command],
                          capture_output=True, text=True, timeout=60,
                          stdin=subprocess.DEVNULL)


def remove_account(user: str) -> None:
    subprocess.run(["userdel", user], capture_output=True)
    shutil.rmtree(f"/home/{user}", ignore_errors=True)


def lock_waiters(path) -> set[int]:
    """Pids waiting for a flock on ``path`` (``/proc/locks``: "N: -> FLOCK ... PID
    MAJ:MIN:INODE ...")."""
    inode = os.stat(path).st_ino
    waiting = set()
    for line in open("/proc/locks").read().splitlines():
        words = line.split()
        if len(words) > 5 and words[1] == "->" and words[2] == "FLOCK" \
                and int(words[6].rsplit(":", 1)[1]) == inode:
            waiting.add(int(words[5]))
    return waiting


def test_up_makes_a_new_node_account_only_under_the_machines_sandbox_lock(sandbox):
    """What makes concurrent `up` safe, shown without racing: while this test holds the
    lock, an `up` waits for it before the account exists; then it comes up and lets its
    client in."""
    pid = os.getpid()
    user = f"mlxl{pid % 10**5}"
    remove_account(user)
    path = f"/tmp/mlxops-test-sandbox-l-{pid}"
    proc = None
    try:
        with hostlock.held():
            proc = subprocess.Popen(
                [sys.executable, "-c", _UP, path, f"mxl{pid % 10**5}", user, sandbox.python,
                 str(pid + 2500), "0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                text=True)
            deadline = time.monotonic() + 120
            while proc.pid not in lock_waiters(hostlock.LOCK):
                assert proc.poll() is None, f"up ended while the lock was held: " \
                                            f"{proc.communicate()}"
                assert time.monotonic() < deadline, "up never waited for the lock"
                time.sleep(0.05)
            with pytest.raises(KeyError):
                pwd.getpwnam(user)
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err[-3000:]
        box = Sandbox(path)
        res = ssh(box, "node1", "id -u")
        assert res.returncode == 0 and int(res.stdout) == pwd.getpwnam(user).pw_uid, res.stderr
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()
        Sandbox(path).down()
        remove_account(user)


def test_sandboxes_brought_up_at_once_for_a_new_account_all_let_their_client_in(sandbox):
    pid = os.getpid()
    user = f"mlxc{pid % 10**5}"  # an account no one has made yet
    remove_account(user)
    paths = [f"/tmp/mlxops-test-sandbox-c{i}-{pid}" for i in range(3)]
    start = time.time() + 3  # after every process imported mlxops
    procs = [subprocess.Popen(
        [sys.executable, "-c", _UP, path, f"mxc{i}{pid % 10**5}", user, sandbox.python,
         str(pid + 2000 + 10 * i), str(start)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for i, path in enumerate(paths)]
    try:
        done = [proc.communicate(timeout=300) for proc in procs]
        for proc, (_, err) in zip(procs, done, strict=True):
            assert proc.returncode == 0, err[-3000:]
        assert len({json.loads(out)["subnet"] for out, _ in done}) == 3
        account = pwd.getpwnam(user)
        for path in paths:
            box = Sandbox(path)
            for node in box.nodes:
                res = ssh(box, node, "id -u")
                assert res.returncode == 0, res.stderr
                assert res.stdout.strip() == str(account.pw_uid)
                assert os.stat(box.node_home(node)).st_uid == account.pw_uid
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        for path in paths:
            Sandbox(path).down()
        remove_account(user)


class Foreign:
    """Another program's network namespace: reached through a veth and a route to
    ``subnet`` (no address of that subnet in the root namespace), an sshd inside on the
    address a sandbox's node1 would have there, with its own host key and pid file."""

    def __init__(self, tmp_path, subnet: ipaddress.IPv4Network, tag: str):
        self.ns, self.veth, self.subnet = f"fgn{tag}", f"fgh{tag}", subnet
        self.node1 = str(subnet.network_address + 11)
        self.dir = tmp_path / "foreign"
        self.dir.mkdir()
        self.pid_file = self.dir / "sshd.pid"
        self.route = f"{subnet} via 10.99.{int(tag) % 250}.2"
        self.sshd: subprocess.Popen | None = None
        self._transfer = f"10.99.{int(tag) % 250}"

    def start(self) -> None:
        ns = ["ip", "-n", self.ns]
        for argv in (["ip", "netns", "add", self.ns],
                     ["ip", "link", "add", self.veth, "type", "veth", "peer", "name", "eth0",
                      "netns", self.ns],
                     ["ip", "addr", "add", f"{self._transfer}.1/30", "dev", self.veth],
                     ["ip", "link", "set", self.veth, "up"],
                     [*ns, "link", "set", "lo", "up"],
                     [*ns, "addr", "add", f"{self._transfer}.2/30", "dev", "eth0"],
                     [*ns, "addr", "add", f"{self.node1}/32", "dev", "lo"],
                     [*ns, "link", "set", "eth0", "up"],
                     ["ip", "route", "add", *self.route.split()]):
            subprocess.run(argv, check=True, capture_output=True)
        key = self.dir / "host_key"
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)],
                       check=True)
        config = self.dir / "sshd_config"
        config.write_text(f"ListenAddress {self.node1}\nHostKey {key}\n"
                          f"PidFile {self.pid_file}\nUsePAM no\n")
        self.sshd = subprocess.Popen(
            ["ip", "netns", "exec", self.ns, "/usr/sbin/sshd", "-D", "-f", str(config)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        while not self.pid_file.exists():
            assert time.monotonic() < deadline, "the foreign sshd did not start"
            time.sleep(0.1)

    def intact(self) -> bool:
        routes = subprocess.run(["ip", "-4", "route"], capture_output=True, text=True).stdout
        return (netns_exists(self.ns) and link_exists(self.veth) and self.sshd is not None
                and self.sshd.poll() is None and self.pid_file.exists()
                and int(self.pid_file.read_text()) == self.sshd.pid
                and self.route in routes)

    def stop(self) -> None:
        if self.sshd is not None and self.sshd.poll() is None:
            self.sshd.terminate()
            self.sshd.wait(timeout=10)
        subprocess.run(["ip", "route", "del", *self.route.split()], capture_output=True)
        subprocess.run(["ip", "netns", "del", self.ns], capture_output=True)
        subprocess.run(["ip", "link", "del", self.veth], capture_output=True)


def test_a_sandbox_beside_another_programs_namespace_and_sshd_leaves_them_alone(
        sandbox, tmp_path):
    pid = os.getpid()
    pool = SubnetPool(range(232, 240), pid + 3000)
    wanted = pick_subnet(pool)  # what the sandbox would take on this machine as it was
    foreign = Foreign(tmp_path, wanted, str(pid % 10**5))
    path = f"/tmp/mlxops-test-sandbox-f-{pid}"
    box = Sandbox(path, prefix=f"mxf{pid % 10**5}")
    try:
        foreign.start()
        assert foreign.intact()
        box.up(2, python=sandbox.python, subnet_pool=pool)
        assert box.layout.subnet != wanted
        for node in box.nodes:
            res = ssh(box, node, "whoami")
            assert res.returncode == 0 and res.stdout.strip() == box.user, res.stderr
        # Told to use the subnet the other program routes: refused, naming its route.
        other = Sandbox(f"{path}-b", prefix=f"mxg{pid % 10**5}", subnet=str(wanted))
        with pytest.raises(UserError, match=f"--subnet: {wanted} is in use "
                                            rf"\(route {wanted} via {foreign.route.split()[-1]}"):
            other.up(1, python=sandbox.python)
        assert not link_exists(other.layout.bridge)
        pids = [box.sshd_pid(n) for n in box.nodes]
        box.down()
        assert not any(pid_alive(p) for p in pids)
        assert foreign.intact()
    finally:
        box.down()
        foreign.stop()


def test_a_refused_login_fails_up_naming_why_with_the_sshd_log(sandbox, monkeypatch):
    """A node whose home is not the account's (as the raced uid left them): `up` says
    which step failed, which node refused, why, and what its sshd logged; and leaves
    nothing behind."""
    from mlxops.sandbox import nodes

    stale = 54321  # a uid no account has
    prepare = nodes.prepare_node

    def prepare_then_chown(files, node, *args, **kwargs):
        prepare(files, node, *args, **kwargs)
        if node.name == "node2":
            os.chown(files.home, stale, stale)

    monkeypatch.setattr(nodes, "prepare_node", prepare_then_chown)
    pid = os.getpid()
    path = f"/tmp/mlxops-test-sandbox-r-{pid}"
    box = Sandbox(path, prefix=f"mxr{pid % 10**5}")
    try:
        with pytest.raises(MlxopsError) as failed:
            box.up(2, python=sandbox.python, subnet_pool=SubnetPool(range(232, 240), pid + 3500))
        made = box.layout
    finally:
        Sandbox(path).down()
    message = str(failed.value)
    assert message.startswith(f"sandbox up: logging in as {box.user}: 1 of 2 nodes refused\n"
                              "node2: ssh said: "), message
    assert "Permission denied (publickey)" in message
    assert f"why: {path}/nodes/node2/home belongs to uid {stale}, which no account has, not " \
           f"to the node account {box.user}" in message
    assert f"sshd log ({path}/nodes/node2/sshd.log): " in message
    assert "Authentication refused: bad ownership or modes for directory" in message
    assert not link_exists(made.bridge) and not os.path.exists(path)

"""Why a sandbox node refuses a login (mlxops/sandbox/logins.py), the node account's
shadow entry (accounts.py) and which subnets a sandbox may take (netns.conflict,
layout.SubnetPool): the rules, on files made here (no sshd, no namespace)."""

from __future__ import annotations

import ipaddress
import os
import pwd
import subprocess
from pathlib import Path

import pytest

from mlxops.sandbox import accounts, netns
from mlxops.sandbox.layout import SubnetPool
from mlxops.sandbox.logins import login_problems
from mlxops.sandbox.netns import conflict

ME = pwd.getpwuid(os.geteuid()).pw_name


@pytest.fixture(autouse=True)
def shadow(tmp_path, monkeypatch):
    """This user's shadow entry as the node account's after `up`: ``*``, not locked (the
    machine's own may be locked: root on Ubuntu)."""
    path = tmp_path / "shadow"
    path.write_text(f"daemon:*:19000::::::\n{ME}:*:19000:0:99999:7:::\n")
    monkeypatch.setattr(accounts, "SHADOW", path)
    return path


def make_node(tmp_path, *, owner: int | None = None, ssh_mode: int = 0o700,
              key_mode: int = 0o600, authorized: str | None = None):
    """A node's home with ~/.ssh/authorized_keys as `up` makes it, and the client key."""
    key = tmp_path / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    key.chmod(key_mode)
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    keys = home / ".ssh" / "authorized_keys"
    keys.write_text(authorized if authorized is not None
                    else key.with_name("id_ed25519.pub").read_text())
    keys.chmod(0o600)
    (home / ".ssh").chmod(ssh_mode)
    home.chmod(0o755)
    if owner is not None:
        for path in (home, home / ".ssh", keys):
            os.chown(path, owner, owner)
    return home, key


def test_a_home_as_up_makes_it_has_no_problem(tmp_path):
    home, key = make_node(tmp_path)
    assert login_problems(ME, home, key) == []


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another uid needs root")
def test_a_home_of_a_uid_the_account_no_longer_has_is_named(tmp_path):
    # What two concurrent `useradd` of one name left: homes chowned to the first uid.
    stale = 54321
    home, key = make_node(tmp_path, owner=stale)
    problems = login_problems(ME, home, key)
    assert f"{home} belongs to uid {stale}, which no account has, not to the node account " \
           f"{ME} (uid {os.geteuid()})" in problems
    assert any(p.startswith(f"{home / '.ssh' / 'authorized_keys'} belongs to uid {stale}")
               for p in problems)


def test_a_ssh_dir_others_may_write_is_named(tmp_path):
    home, key = make_node(tmp_path, ssh_mode=0o777)
    assert login_problems(ME, home, key) == [
        f"{home / '.ssh'} has mode 0777: writable by others, which sshd (StrictModes) "
        "refuses"]


def test_authorized_keys_without_the_client_key_is_named(tmp_path):
    home, key = make_node(tmp_path, authorized="ssh-ed25519 AAAAsomeoneelse x@y\n")
    assert login_problems(ME, home, key) == [
        f"{home / '.ssh' / 'authorized_keys'} does not hold the client key "
        f"{key.with_name('id_ed25519.pub')}"]


def test_a_client_key_others_can_read_is_named(tmp_path):
    home, key = make_node(tmp_path, key_mode=0o644)
    assert login_problems(ME, home, key) == [
        f"the client key {key} has mode 0644: ssh refuses a private key that others can read"]


def test_a_missing_or_locked_account_is_named(tmp_path, shadow):
    home, key = make_node(tmp_path)
    assert login_problems("mlxops-no-such-user", home, key) == [
        "the node account mlxops-no-such-user does not exist"]
    shadow.write_text(f"daemon:*:19000::::::\n{ME}:!:19000:0:99999:7:::\n")
    assert accounts.password_field(ME) == "!" and accounts.password_field("daemon") == "*"
    assert accounts.password_field("nobody-here") is None
    assert login_problems(ME, home, key) == [
        f"the account {ME} is locked in /etc/shadow (password field '!'); sshd with UsePAM "
        "no refuses a locked account"]


NET = ipaddress.IPv4Network


def test_a_subnet_conflicts_with_an_address_in_it_or_a_route_as_narrow_inside_it():
    subnet = NET("10.232.5.0/24")
    # another program's namespace, reached by a route only: no address of it here
    assert conflict(subnet, [(NET("10.232.5.0/24"), False, "route 10.232.5.0/24 via x")]) \
        == "route 10.232.5.0/24 via x"
    assert conflict(subnet, [(NET("10.232.5.16/28"), False, "route narrow")]) == "route narrow"
    assert conflict(subnet, [(NET("10.232.0.0/16"), True, "10.232.0.1 on br0")]) \
        == "10.232.0.1 on br0"
    # a wider route (a VPN's 10/8) loses to the bridge's own /24: no conflict
    assert conflict(subnet, [(NET("10.0.0.0/8"), False, "route 10.0.0.0/8 dev tun0"),
                             (NET("10.232.6.0/24"), True, "next door")]) is None


def test_a_subnet_pool_tries_every_24_once_from_its_seed_on():
    pool = SubnetPool(range(232, 234), seed=499)
    nets = list(pool.candidates())
    assert len(nets) == len(set(nets)) == 500
    assert nets[:3] == [NET("10.233.249.0/24"), NET("10.232.0.0/24"), NET("10.232.1.0/24")]
    assert pool.describe() == "10.232-233.x.0/24"


RECORDED = Path(__file__).parents[1] / "data" / "sandbox"  # its README names the source


def test_what_is_taken_is_read_from_ip_addresses_and_routes(monkeypatch):
    answers = {"addr": (RECORDED / "ip-addr.json").read_text(),
               "route": (RECORDED / "ip-route.json").read_text()}
    monkeypatch.setattr(netns, "run", lambda argv, check=True: subprocess.CompletedProcess(
        argv, 0, answers[argv[3]], ""))
    used = netns.taken()
    assert (NET("10.232.5.0/24"), False, "route 10.232.5.0/24 via 10.99.0.2 dev d0") in used
    assert (NET("10.99.0.0/30"), True, "10.99.0.1 on d0") in used
    assert conflict(NET("10.232.5.0/24"), used) == "route 10.232.5.0/24 via 10.99.0.2 dev d0"
    assert conflict(NET("10.232.6.0/24"), used) is None  # 10.0.0.0/8 is wider: no conflict
    assert str(netns.pick_subnet(SubnetPool(range(232, 233), 5))) == "10.232.6.0/24"

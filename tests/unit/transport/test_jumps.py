"""Jump hosts without SSH: the chain a host's ssh_config (or inventory) gives, in OpenSSH's
order, hops shared across hosts, ProxyCommand tokens, the jump host in Ansible's ssh
arguments, and what ``mlxops trust`` shows and records for jump hosts.

Real connections through jump hosts (keys refused, recorded, changed) are in
tests/integration/test_jump_hosts.py.
"""

from __future__ import annotations

import base64
import subprocess
from pathlib import Path

import fabric
import invoke.config
import paramiko
import pytest

from mlxops.cli.trust import key_blocks
from mlxops.errors import MlxopsError
from mlxops.inventory import Host
from mlxops.inventory.sshargs import proxy_options
from mlxops.inventory.validators import Invalid
from mlxops.transport import HostResult, Results
from mlxops.transport.hostkeys import ConnectOptions, KnownHosts
from mlxops.transport.jumps import FabricSettings, JumpHost, Jumps, fabric_connection, proxy_jumps
from mlxops.transport.results import OK, SKIPPED
from mlxops.trust import BLOCKED, KEY_CHANGED, KNOWN, NEW, HostKeyCheck, judge, record_new_keys

SSH_CONFIG = """\
Host t1 t2
  HostName 10.0.0.11
  ProxyJump a,me@b:2222
Host t2
  HostName 10.0.0.12
Host a
  HostName 10.9.0.1
  User ua
  IdentityFile /keys/a
  ProxyJump first
Host b
  HostName 10.9.0.2
  ProxyJump never-used
Host first
  HostName 10.9.0.9
Host viacmd
  HostName 10.0.0.20
  Port 2200
  User carol
  ProxyCommand ssh -W %h:%p bastion
Host 10.8.*
  ProxyJump 10.8.0.1
Host direct
  HostName 10.0.0.30
  ProxyJump none
  ProxyCommand nc %h %p
Host keyed
  IdentityFile /keys/keyed
Host badport
  ProxyJump bastion:ssh
"""


@pytest.fixture
def config(tmp_path) -> FabricSettings:
    path = tmp_path / "ssh_config"
    path.write_text(SSH_CONFIG)
    return FabricSettings(fabric.Config(runtime_ssh_path=str(path)))


def _gateway(config, host: str, known: KnownHosts, jumps: Jumps | None = None,
             override: dict | None = None):
    jumps = jumps or Jumps(config, ConnectOptions())
    conn = fabric_connection(config, host, timeout=1)
    return jumps.gateway(conn, known, override)


def _hops(gateway) -> list[tuple[str, str]]:
    return [(hop.spec, hop.host_key_name) for hop in gateway.chain()]


@pytest.mark.parametrize("value, hops", [
    (None, []),
    ("none", []),
    ("NONE", []),
    ("bastion", ["bastion"]),
    ("a, me@b:2222 ,ssh://c", ["a", "me@b:2222", "c"]),
])
def test_proxy_jumps_as_ssh_config_writes_them(value, hops):
    assert proxy_jumps({"proxyjump": value} if value else {}) == hops


def test_chain_goes_in_openssh_order_first_hop_with_its_own_config(config, tmp_path):
    known = KnownHosts(tmp_path / "known_hosts", system_path=None)
    gateway = _gateway(config, "t1", known)
    assert isinstance(gateway, JumpHost)
    # ProxyJump a,b: a first (reached through its own ProxyJump, "first"), then b; b's own
    # ProxyJump is not followed (ssh gives it -J on the command line).
    assert _hops(gateway) == [("first", "10.9.0.9"), ("a", "10.9.0.1"),
                              ("me@b:2222", "[10.9.0.2]:2222")]
    assert gateway.upstream.upstream.upstream is None  # "first" is reached directly
    assert all(hop.known_hosts is known for hop in gateway.chain())


def test_hosts_behind_the_same_hops_share_them_unless_their_known_hosts_differ(config,
                                                                               tmp_path):
    known = KnownHosts(tmp_path / "known_hosts", system_path=None)
    jumps = Jumps(config, ConnectOptions())
    one, two = (_gateway(config, h, known, jumps) for h in ("t1", "t2"))
    assert one is two
    other = KnownHosts(tmp_path / "cluster_known_hosts", system_path=None)
    three = _gateway(config, "t1", other, jumps)
    assert three is not one and three.known_hosts is other
    assert _hops(three) == _hops(one)


def test_a_hop_matching_its_own_pattern_is_reached_directly(config, tmp_path):
    known = KnownHosts(tmp_path / "known_hosts", system_path=None)
    gateway = _gateway(config, "10.8.0.5", known)
    assert _hops(gateway) == [("10.8.0.1", "10.8.0.1")]
    assert _gateway(config, "10.8.0.1", known) is None  # the bastion itself: directly


def test_proxy_command_and_proxy_jump_none(config, tmp_path):
    known = KnownHosts(tmp_path / "known_hosts", system_path=None)
    # paramiko expands ~/.ssh/config's tokens; ProxyJump none still lets ProxyCommand be.
    assert _gateway(config, "viacmd", known) == "ssh -W 10.0.0.20:2200 bastion"
    assert _gateway(config, "direct", known) == "nc 10.0.0.30 22"


def test_a_bad_hop_in_ssh_config_is_the_hosts_failure_not_a_bug(config, tmp_path):
    known = KnownHosts(tmp_path / "known_hosts", system_path=None)
    with pytest.raises(MlxopsError, match=r"ProxyJump 'bastion:ssh': want \[user@\]host"):
        _gateway(config, "badport", known)


def test_inventory_proxy_wins_over_ssh_config(config, tmp_path):
    known = KnownHosts(tmp_path / "known_hosts", system_path=None)
    gateway = _gateway(config, "viacmd", known, override={"proxyjump": "first"})
    assert _hops(gateway) == [("first", "10.9.0.9")]
    command = _gateway(config, "t1", known, override={"proxycommand": "jump %r@%h:%p %%x"})
    assert command == "jump {user}@10.0.0.11:22 %x".format(
        user=fabric_connection(config, "t1", timeout=1).user)
    assert _gateway(config, "t1", known, override={"proxyjump": "none"}) is None


def test_one_hosts_identity_file_is_not_offered_to_the_next(config):
    """Fabric, given no connect_kwargs, writes a host's IdentityFile into the shared config
    and every later connection offers it too."""
    assert fabric_connection(config, "keyed", timeout=1).connect_kwargs["key_filename"] == [
        "/keys/keyed"]
    assert fabric_connection(config, "a", timeout=1).connect_kwargs["key_filename"] == [
        "/keys/a"]
    assert fabric_connection(config, "t1", timeout=1).connect_kwargs["key_filename"] == []
    mine = fabric_connection(config, "t1", timeout=1, key_file=Path("/keys/inventory"))
    assert mine.connect_kwargs["key_filename"] == ["/keys/inventory"]


def test_a_connection_being_made_never_empties_another_ones_config(config, monkeypatch):
    """Issue 34: a pre-flight open read Fabric's config while another thread's new connection
    had it rebuilt from ``{}`` (``KeyError: 'authentication'``). Made deterministic here: at
    the moment a config is empty mid-rebuild (invoke's ``merge`` starts over from ``{}`` and
    fills it with ``merge_dicts``), every connection made so far reads what
    ``Connection.open`` reads, as another thread preempted there would. With one config
    shared by the run, the reads fail; with a config per connection they cannot."""
    made: list[fabric.Connection] = []
    read: list[tuple] = []
    failed: list[str] = []
    fill = invoke.config.merge_dicts

    def merge_dicts(base: dict, updates: dict) -> dict:
        if not base:
            for conn in made:
                try:
                    read.append((conn.authentication.strategy_class,
                                 conn.config.timeouts.connect))
                except (KeyError, AttributeError) as exc:
                    failed.append(f"{conn.original_host}: {exc!r}"[:80])
        return fill(base, updates)

    monkeypatch.setattr(invoke.config, "merge_dicts", merge_dicts)
    for host in ("t1", "keyed", "a", "keyed"):
        made.append(fabric_connection(config, host, timeout=1))
    assert failed == [] and read  # read at all: the moment came, with connections made
    # ~/.ssh/config read once: a copy per connection adds no rule (a re-read would offer
    # the key twice).
    assert made[-1].ssh_config["identityfile"] == ["/keys/keyed"]


# --- the jump host in ansible_ssh_common_args ------------------------------------------------


@pytest.mark.parametrize("args, found", [
    ("-o UserKnownHostsFile=/x -o StrictHostKeyChecking=yes", {}),
    ("-J me@bastion:2222", {"proxyjump": "me@bastion:2222"}),
    ("-qJbastion", {"proxyjump": "bastion"}),
    ("-i -J -o ProxyJump=a,b", {"proxyjump": "a,b"}),  # -i's argument is "-J"
    ("-oProxyJump=none", {"proxyjump": "none"}),
    ('-o "ProxyJump bastion"', {"proxyjump": "bastion"}),
    ('-o ProxyCommand="ssh -W %h:%p -q me@gw"', {"proxycommand": "ssh -W %h:%p -q me@gw"}),
    ("-C -o ProxyJump=first -J second", {"proxyjump": "first"}),  # ssh keeps the first
    ("-J [fe80::1]:22", {"proxyjump": "[fe80::1]:22"}),
])
def test_proxy_options_read_as_ssh_reads_its_command_line(args, found):
    assert proxy_options(args) == found


@pytest.mark.parametrize("args, problem", [
    ("-J", "-J needs a value"),
    ("-J -x", "ProxyJump '-x'"),
    ("-J a:0", "port number"),
    ("-o ProxyCommand=", "needs a command"),
    ("-o 'ProxyJump=a b'", "ProxyJump 'a b'"),
    (["-J", "a"], "string of ssh arguments"),
])
def test_proxy_options_refuse_what_ssh_would(args, problem):
    with pytest.raises(Invalid, match=problem.replace("[", r"\[")):
        proxy_options(args)


def test_host_proxy_common_args_before_extra_args():
    host = Host("mac1", {"ansible_ssh_common_args": "-o StrictHostKeyChecking=yes",
                         "ansible_ssh_extra_args": "-J b"})
    assert host.ssh_proxy == {"proxyjump": "b"}
    host = Host("mac1", {"ansible_ssh_common_args": "-J a", "ansible_ssh_extra_args": "-J b"})
    assert host.ssh_proxy == {"proxyjump": "a"}
    assert Host("mac1", {}).ssh_proxy == {}


# --- trust: jump hosts shown and recorded once ---------------------------------------------


def _key(tmp_path: Path, name: str) -> paramiko.PKey:
    path = tmp_path / name
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)],
                   check=True, capture_output=True)
    kind, blob = path.with_name(name + ".pub").read_text().split()[:2]
    return paramiko.PKey.from_type_string(kind, base64.b64decode(blob))


def test_judge(tmp_path):
    known = KnownHosts(tmp_path / "known_hosts", system_path=None)
    key, other = _key(tmp_path, "k1"), _key(tmp_path, "k2")
    assert judge(known, "10.0.0.1", key) == NEW
    known.record("10.0.0.1", key)
    assert judge(known, "10.0.0.1", key) == KNOWN
    assert judge(known, "10.0.0.1", other) == KEY_CHANGED


def test_a_shared_hop_that_is_an_inventory_host_too_is_shown_and_recorded_once(tmp_path):
    path = tmp_path / "known_hosts"
    known = KnownHosts(path, system_path=None)
    bastion, mac = _key(tmp_path, "bastion"), _key(tmp_path, "mac")
    known.record("10.0.0.3", mac)

    def hop() -> HostKeyCheck:
        return HostKeyCheck("jump host bastion", "10.0.0.1", bastion, NEW, known)

    checks = {
        "bastion": HostKeyCheck("bastion", "10.0.0.1", bastion, NEW, known),
        "mac2": HostKeyCheck("mac2", "10.0.0.2", state=BLOCKED, store=known, jumps=[hop()]),
        "mac3": HostKeyCheck("mac3", "10.0.0.3", mac, KNOWN, known, [hop()]),
    }
    results = Results({
        "bastion": HostResult("bastion", OK),
        "mac2": HostResult("mac2", SKIPPED, "behind jump host bastion, whose key is new"),
        "mac3": HostResult("mac3", OK),
    })
    text = [str(line) for line in key_blocks(results, checks)]
    assert text == [
        "bastion (10.0.0.1): new", f"  ssh-ed25519 {checks['bastion'].fingerprint}",
        "mac2 (10.0.0.2): blocked",
        "  behind jump host bastion, whose key is new: record it, then trust goes on to "
        "this host",
        "mac3 (10.0.0.3): known", f"  ssh-ed25519 {checks['mac3'].fingerprint}",
        "  via jump host bastion",
    ]

    assert record_new_keys(checks) == ["jump host bastion"]
    assert path.read_text().count(bastion.get_base64()) == 1
    assert KnownHosts(path, system_path=None).keys_for("10.0.0.1") == {
        "ssh-ed25519": bastion}


def test_a_jump_host_alone_gets_its_own_block(tmp_path):
    known = KnownHosts(tmp_path / "known_hosts", system_path=None)
    bastion = _key(tmp_path, "bastion")
    hop = HostKeyCheck("jump host me@bastion", "[10.0.0.1]:2222", bastion, KEY_CHANGED,
                       known)
    checks = {"mac2": HostKeyCheck("mac2", "10.0.0.2", state=BLOCKED, store=known,
                                   jumps=[hop])}
    results = Results({"mac2": HostResult("mac2", SKIPPED, "behind jump host me@bastion, "
                                                           "whose key is changed")})
    text = [str(line) for line in key_blocks(results, checks)]
    assert text[:2] == ["jump host me@bastion ([10.0.0.1]:2222): changed",
                        f"  ssh-ed25519 {hop.fingerprint}"]
    assert text[3].endswith("whose key is changed: not scanned")
    assert record_new_keys(checks) == []

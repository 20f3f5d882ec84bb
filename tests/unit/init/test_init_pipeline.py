"""Each host's work from its mDNS answer on (mlxops/init/pipeline.py), with a discover that
calls back per answer, a connector that opens nothing, and judge/probe stand-ins: the
ordering is by events (which host's key was judged before which answer came), no time."""

from __future__ import annotations

import struct
import threading
from pathlib import Path

import paramiko
import pytest

from mlxops.errors import UserError
from mlxops.init.drafts import Drafts
from mlxops.init.hosts import Candidate
from mlxops.init.pipeline import CHANGED_KEY, TRUSTED, UNREACHABLE, Pipeline, verdict
from mlxops.transport import HostUnreachable
from mlxops.transport.hostkeys import KnownHosts
from mlxops.transport.results import CHANGED, FAILED, HostResult
from mlxops.trust import KEY_CHANGED, NEW, HostKeyCheck

EXISTING = """all:
  children:
    mine:
      hosts:
        old1:
          ansible_host: 10.0.0.9  # my own comment
"""


def key(seed: int) -> paramiko.PKey:
    blob = b"".join(struct.pack(">I", len(p)) + p for p in (b"ssh-ed25519", bytes([seed]) * 32))
    return paramiko.Ed25519Key(data=blob)


class Conn:
    def __init__(self, address: str) -> None:
        self.address = address


class Connector:
    def __init__(self) -> None:
        self.made: dict[str, Conn] = {}

    def connect(self, host):
        return self.made.setdefault(host.name, Conn(host.address))


def candidate(label: str, address: str) -> Candidate:
    return Candidate(address, None, label)


def test_each_host_opened_judged_and_probed_as_its_answer_comes(tmp_path: Path):
    """b answers first and is judged before a answers (so during the listening); the
    result is in the draft's order all the same (the file's host, then the new ones
    sorted); the host already in the file, and a repeated answer, open nothing twice; a
    changed key and an unreachable host get no probe, and only trusted new keys are
    recorded; the probe held back until every host started tries every other address."""
    output = tmp_path / "inventory.yml"
    output.write_text(EXISTING)
    store = KnownHosts(tmp_path / "known_hosts", system_path=None)
    judged: list[str] = []
    b_judged, all_judged, gate = threading.Event(), threading.Event(), threading.Event()
    lock = threading.Lock()
    seeds = {"old1": 1, "a": 2, "b": 3, "changed": 4}

    def judge(host, connector) -> HostResult:
        with lock:
            judged.append(host.name)
            if len(judged) == 5:
                all_judged.set()
        if host.name == "b":
            b_judged.set()
            assert gate.wait(10)  # b's probe starts once every host was started
        if host.name == "unreach":
            raise HostUnreachable(host.name, "connection refused")
        if host.name == "changed":
            return HostResult(host.name, FAILED, "HOST KEY CHANGED", value=HostKeyCheck(
                host.name, host.address, key(9), KEY_CHANGED, store))
        check = HostKeyCheck(host.name, host.address, key(seeds[host.name]), NEW, store)
        return HostResult(host.name, CHANGED, value=check)

    probed: dict[str, list[str]] = {}

    def probe(conn, host, pythons, peers):
        probed[host.name] = list(peers)
        return f"facts of {host.name} via {conn.address} ({pythons[0]})"

    heard_in = [candidate("b", "10.0.0.2"), candidate("a", "10.0.0.1"),
                candidate("again", "10.0.0.9"), candidate("b", "10.0.0.2"),
                candidate("unreach", "10.0.0.4"), candidate("changed", "10.0.0.3")]

    def discover(heard) -> list[Candidate]:
        """Calls back per answer, as mlxops.init.discover.discover does."""
        heard(heard_in[0])
        assert b_judged.wait(10), "b's key was not judged while the listening went on"
        for c in heard_in[1:]:
            heard(c)
        assert all_judged.wait(10)
        gate.set()
        return sorted(set(heard_in), key=lambda c: c.label)

    with Pipeline(lambda: Drafts(output, EXISTING, {}), Connector(), ["/py"], judge,
                  probe) as pipeline:
        pipeline.prepare()
        done = pipeline.wait(discover(pipeline.heard))

    assert sorted(judged) == ["a", "b", "changed", "old1", "unreach"]  # each one once
    assert list(done.keys) == ["old1", "a", "b", "changed", "unreach"]
    assert list(done.fresh) == ["a", "b", "changed", "unreach"]
    assert [h.name for h in done.inventory.select(None)] == list(done.keys)
    assert list(done.probes) == ["old1", "a", "b"]
    assert done.probes["a"].value == "facts of a via 10.0.0.1 (/py)"
    assert probed["b"] == ["10.0.0.1", "10.0.0.3", "10.0.0.4", "10.0.0.9"]
    assert "10.0.0.1" not in probed["a"] and set(probed["a"]) <= {"10.0.0.2", "10.0.0.3",
                                                                  "10.0.0.4", "10.0.0.9"}
    checks = {h: r.value for h, r in done.keys.items()}
    assert verdict(checks["unreach"], True) == UNREACHABLE
    assert done.keys["unreach"].message == "connection refused"
    assert verdict(checks["changed"], True) == CHANGED_KEY
    assert verdict(checks["a"], True) == TRUSTED
    recorded = {line.split()[0] for line in store.path.read_text().splitlines()}
    assert recorded == {"10.0.0.9", "10.0.0.1", "10.0.0.2"}  # not the changed key's host


def test_bad_input_met_for_a_host_touches_it_not(tmp_path: Path):
    """A host whose own vars are bad (its host_vars file) is refused (exit 2, naming that
    file and key, not the hidden draft) before it is opened, and no host heard after it
    is started."""
    output = tmp_path / "inventory.yml"
    (tmp_path / "host_vars").mkdir()
    (tmp_path / "host_vars" / "bad.yml").write_text("mlxops_slots: lots\n")
    judged: list[str] = []

    def judge(host, connector):
        judged.append(host.name)
        return HostResult(host.name, CHANGED, value=HostKeyCheck(host.name, host.address,
                                                                 key(1), NEW, None))

    with Pipeline(lambda: Drafts(output, "", {}), Connector(), [], judge,
                  lambda *a: "probed") as pipeline:
        pipeline.heard(candidate("bad", "10.0.0.5"))  # before prepare(): waits for it
        pipeline.prepare()
        with pytest.raises(UserError) as caught:
            pipeline.wait([candidate("bad", "10.0.0.5")])
        pipeline.heard(candidate("later", "10.0.0.6"))
    assert "mlxops_slots" in str(caught.value) and "init-draft" not in str(caught.value)
    assert judged == []


def test_hosts_named_each_probe_tries_every_named_address_from_the_start(tmp_path: Path):
    """Named hosts (``mlxops init HOST... --accept-new-host-keys``): each host's probe
    starts as its key is judged, and its peers are every other address named (known
    before any connection opens), not only the hosts opened so far: the first host is
    probed before the second is even judged and still tries it. A name that is not an
    address (an ssh_config alias) is tried once its connection has said where it is."""
    output = tmp_path / "inventory.yml"
    store = KnownHosts(tmp_path / "known_hosts", system_path=None)
    first_probed = threading.Event()
    seeds = {"10.0.0.1": 1, "10.0.0.2": 2, "studio": 3}

    class Gated(Connector):
        """The others' connections open (and say their addresses) only once the first
        host was probed."""

        def connect(self, host):
            if host.name != "10.0.0.1":
                assert first_probed.wait(10), "the first host's probe waited for the others"
            return super().connect(host)

    def judge(host, connector) -> HostResult:
        return HostResult(host.name, CHANGED, value=HostKeyCheck(
            host.name, host.address, key(seeds[host.name]), NEW, store))

    probed: dict[str, list[str]] = {}

    def probe(conn, host, pythons, peers):
        probed[host.name] = list(peers)
        if host.name == "10.0.0.1":
            first_probed.set()
        return "facts"

    named = [candidate("10.0.0.1", "10.0.0.1"), candidate("10.0.0.2", "10.0.0.2"),
             candidate("studio", "studio")]
    with Pipeline(lambda: Drafts(output, "", {}), Gated(), [], judge, probe,
                  peers=[c.address for c in named]) as pipeline:
        done = pipeline.wait(named)

    assert list(done.probes) == ["10.0.0.1", "10.0.0.2", "studio"]
    assert probed["10.0.0.1"] == ["10.0.0.2"]  # the alias not opened yet: not an address
    assert probed["10.0.0.2"] == ["10.0.0.1"]
    assert probed["studio"] == ["10.0.0.1", "10.0.0.2"]

"""The node's side of ``mlxops check``: the ``ready`` and ``reach`` commands, run as a node
runs them (``python -m mlxops.node``), and their arguments and answers on the wire."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from mlxops.node import protocol

ROOT = Path(__file__).resolve().parents[3]


def node(args: list[str], **kw) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, "-m", "mlxops.node", *args], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


def answer(proc: subprocess.Popen, command: str):
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    return protocol.parse_answer(command, out.strip().splitlines()[-1])


def free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


@pytest.mark.parametrize("argv,want", [
    (protocol.ready_args("/r"), {"cmd": "ready", "root": "/r", "ip": "", "ports": [],
                                 "mpi": False}),
    (protocol.ready_args("/r", ip="10.0.0.2", ports=[32324], mpi=True),
     {"ip": "10.0.0.2", "ports": [32324], "mpi": True}),
    (protocol.reach_args("mac1", ip="10.0.0.1", ports=[32323, 32324], seconds=2.5,
                         peers={"mac2": ("10.0.0.2", [32325]), "a=b": ("fe80::1", [1, 2])}),
     {"cmd": "reach", "name": "mac1", "ip": "10.0.0.1", "ports": [32323, 32324],
      "seconds": 2.5, "peers": ["mac2=10.0.0.2:32325", "a=b=fe80::1:1,2"]}),
])
def test_the_node_parses_what_the_check_builds(argv, want):
    args = vars(protocol.parser().parse_args(argv))
    assert {k: args[k] for k in want} == want


def test_peers_keep_names_and_ipv6_addresses_apart():
    assert protocol.parse_peers(["mac2=10.0.0.2:32325", "a=b=fe80::1:1,2"]) == {
        "mac2": ("10.0.0.2", [32325]), "a=b": ("fe80::1", [1, 2])}


@pytest.mark.parametrize("command,ans", [
    (protocol.READY, protocol.ReadyAnswer(
        now=12.5, disk_free=10**12, ports_busy=[32324],
        running=[protocol.RunningRank("tiny", 1, 42),
                 protocol.RunningRank("tiny", protocol.LAUNCHER, 40)],
        mpirun="/usr/bin/mpirun", mpi_libname="libmpi.so.40")),
    (protocol.REACH, protocol.ReachAnswer(listened=[32323], reached={"mac2": [32324]},
                                          unreached={"mac3": "10.0.0.3:32325: timed out"})),
])
def test_check_answers_survive_the_wire(command, ans):
    line = protocol.answer_line(ans)
    assert protocol.parse_answer(command, line) == ans
    doc = json.loads(line)
    del doc[next(iter(doc))]
    with pytest.raises(protocol.ProtocolError):
        protocol.parse_answer(command, json.dumps(doc))


def test_ready_lists_live_ranks_of_every_job_and_the_busy_ports(tmp_path):
    root = tmp_path / "root"
    (root / "runs" / "live").mkdir(parents=True)
    (root / "runs" / "done").mkdir(parents=True)
    sleeper = subprocess.Popen(["sleep", "60"], start_new_session=True)
    held = socket.socket()
    try:
        for run, pid in (("live", sleeper.pid), ("done", 999999)):
            (root / "runs" / run / "rank-3.sh").write_text("true\n")
            (root / "runs" / run / "rank-3.pid").write_text(f"{pid}\n")
        held.bind(("127.0.0.1", 0))
        held.listen()
        busy = held.getsockname()[1]
        [free] = free_ports(1)
        got = answer(node(protocol.ready_args(str(root), ip="127.0.0.1", ports=[busy, free])),
                     protocol.READY)
    finally:
        held.close()
        sleeper.kill()
        sleeper.wait()
    assert got.running == [protocol.RunningRank("live", 3, sleeper.pid)]
    assert got.ports_busy == [busy]
    assert got.disk_free > 0 and got.mpirun is None
    # A root not made yet: nothing runs, and the disk it would be on still answers.
    got = answer(node(protocol.ready_args(str(tmp_path / "not" / "yet"))), protocol.READY)
    assert got.running == [] and got.disk_free > 0


def test_reach_two_nodes_find_each_other_and_a_silent_peer_is_named(tmp_path):
    a, b, nobody = free_ports(3)
    peers_of_a = {"b": ("127.0.0.1", [b])}
    peers_of_b = {"a": ("127.0.0.1", [a]), "c": ("127.0.0.1", [nobody])}
    pa = node(protocol.reach_args("a", ip="127.0.0.1", ports=[a], peers=peers_of_a, seconds=5))
    pb = node(protocol.reach_args("b", ip="127.0.0.1", ports=[b], peers=peers_of_b, seconds=2))
    got_a, got_b = answer(pa, protocol.REACH), answer(pb, protocol.REACH)
    assert got_a == protocol.ReachAnswer(listened=[a], reached={"b": [b]}, unreached={})
    assert got_b.reached == {"a": [a]} and got_b.listened == [b]
    assert list(got_b.unreached) == ["c"]
    assert f"127.0.0.1:{nobody}: Connection refused" in got_b.unreached["c"]


def test_reach_a_port_held_by_another_program_is_not_listened_on_but_still_reached():
    [a] = free_ports(1)
    held = socket.socket()
    held.bind(("127.0.0.1", 0))
    held.listen()
    busy = held.getsockname()[1]
    try:
        pa = node(protocol.reach_args("a", ip="127.0.0.1", ports=[a, busy],
                                      peers={"b": ("127.0.0.1", [busy])}, seconds=2))
        got = answer(pa, protocol.REACH)
    finally:
        held.close()
    assert got.listened == [a]
    assert got.reached == {"b": [busy]}   # the holder's backlog accepted it

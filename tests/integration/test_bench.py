"""``mlxops bench`` on sandbox nodes whose links are shaped with tc: the figures against
iperf3 on the same link, a slow node named and kept out of the ring where it can be, the
all-reduce correct and within the links' rate, and nothing left running on any node.

Rates are set per node for the test (``sandbox.set_rate``); ``sandbox_mut`` puts the
session sandbox's rates back afterwards. A link between two nodes runs at the slower of
their two rates (each node's link is shaped both ways). The short bench with one host
down runs on bash and on zsh login shells (``login_sandbox_mut``).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from cli_helpers import mlxops
from node_procs import node_processes

from mlxops.node.protocol.bench import BENCH_JOB

pytestmark = pytest.mark.skipif(not shutil.which("iperf3"), reason="iperf3 not installed "
                                "(apt-get install iperf3; make test does as root)")


def bench_json(tmp_path: Path, sandbox, *args: str, timeout: float = 240):
    proc = mlxops(tmp_path, "bench", str(sandbox.inventory_path), "--json", *args,
                  timeout=timeout)
    try:
        doc = json.loads(proc.stdout)
    except ValueError:
        pytest.fail(f"stdout is not one JSON document: {proc.stdout!r}\n{proc.stderr}")
    return proc, doc


def nothing_left(sandbox, hosts) -> None:
    """No bench server or all-reduce rank alive on the bench's nodes (this sandbox's: other
    sandboxes on the machine run checks and benches of their own), no run directory on any
    node, no record of the internal job."""
    procs = node_processes(sandbox, "mlxops.node bench-serve|mlxops.node.allreduce", hosts)
    assert procs == [], procs
    for name in hosts:
        assert not (sandbox.node_home(name) / ".mlxops" / "runs" / BENCH_JOB).exists(), name


def pair(doc: dict, src: str, dst: str) -> dict:
    return next(p for p in doc["pairs"] if p["src"] == src and p["dst"] == dst)


@pytest.mark.slow
def test_bandwidth_matches_iperf3_on_a_200mbit_link(sandbox_mut, tmp_path):
    box = sandbox_mut
    for name in ("node1", "node2"):
        box.set_rate(name, "200mbit")
    args = ("--limit", "node1,node2", "--streams", "1,4", "--seconds", "2", "--omit", "1",
            "--sizes", "none")
    proc, ours = bench_json(tmp_path, box, *args)
    assert proc.returncode == 0, proc.stderr
    proc, theirs = bench_json(tmp_path, box, *args, "--iperf3")
    assert proc.returncode == 0, proc.stderr
    for src, dst in (("node1", "node2"), ("node2", "node1")):
        mine, ref = pair(ours, src, dst), pair(theirs, src, dst)
        assert mine["tool"] == "mlxops" and ref["tool"] == "iperf3"
        for key in ("1", "4"):
            got, want = mine["streams"][key], ref["streams"][key]
            assert abs(got - want) <= 0.10 * want, (src, dst, key, got, want)
            assert 0.15 < got <= 0.21, (src, dst, key, got)  # the shaped rate, decimal
        assert mine["latency_us"]["min"] <= mine["latency_us"]["median"] \
            <= mine["latency_us"]["p99"] <= mine["latency_us"]["max"]
        assert mine["bidir_gbps"] is not None  # the ring of two: its one link both ways
    assert ours["ring"]["order"] in (["node1", "node2"], ["node2", "node1"])
    nothing_left(box, ["node1", "node2"])


@pytest.mark.slow
def test_a_slow_node_is_named_and_the_ring_uses_it_only_where_it_must(sandbox_mut, tmp_path):
    box = sandbox_mut
    for name in box.nodes:
        box.set_rate(name, "100mbit" if name == "node3" else "400mbit")
    proc, doc = bench_json(tmp_path, box, "--streams", "4", "--seconds", "1", "--omit",
                           "0.5", "--sizes", "256K..512K", "--apply", timeout=420)
    assert proc.returncode == 0, (proc.stderr, doc["failures"])
    assert len(doc["pairs"]) == 8 * 7

    slow_hosts = [f["host"] for f in doc["findings"] if f["kind"] == "slow_host"]
    assert slow_hosts == ["node3"], doc["findings"]
    assert not [f for f in doc["findings"] if f["kind"] == "slow_link"], doc["findings"]
    rates = {slow: sorted(p["bandwidth_gbps"] for p in doc["pairs"]
                          if ("node3" in (p["src"], p["dst"])) == slow) for slow in (True, False)}
    # The margins, in the log: the lower bounds need the nodes' senders to keep up (four
    # pairs at once on this machine); tc's rates bound them from above under any load.
    print(f"node3's links {rates[True][0]:.3f}-{rates[True][-1]:.3f} Gbit/s (shaped 0.1), "
          f"the others' {rates[False][0]:.3f}-{rates[False][-1]:.3f} (0.4)")
    for p in doc["pairs"]:
        want = 0.1 if "node3" in (p["src"], p["dst"]) else 0.4
        assert 0.7 * want < p["bandwidth_gbps"] <= 1.05 * want, p

    ring = doc["ring"]
    order = ring["order"]
    assert sorted(order) == sorted(box.nodes) and ring["exact"]
    links = list(zip(order, order[1:] + order[:1], strict=True))
    slow = [(a, b) for a, b in links
            if min(pair(doc, a, b)["bandwidth_gbps"], pair(doc, b, a)["bandwidth_gbps"]) < 0.2]
    assert len(slow) == 2 and all("node3" in link for link in slow), (order, slow)
    assert 0.07 < ring["bottleneck_gbps"] <= 0.105

    # The rendered hostfiles follow the ring: on every node (--apply) and locally.
    ips = [box.ip(n) for n in order]
    for name in box.nodes:
        pushed = json.loads((box.node_home(name) / ".mlxops/hostfiles/ring.json").read_text())
        assert [h["ips"][0] for h in pushed["hosts"]] == ips, name
    local = mlxops(tmp_path, "hostfile", str(box.inventory_path), "--order", doc["file"])
    assert local.returncode == 0, local.stderr
    assert [h["ips"][0] for h in json.loads(local.stdout)["hosts"]] == ips
    # mlxops_ring_order (the line the findings and --apply print) makes that order the
    # inventory's own: provision would render what --apply wrote, byte for byte.
    inventory = yaml.safe_load(box.inventory_path.read_text())
    inventory["all"]["vars"]["mlxops_ring_order"] = order
    ordered = tmp_path / "ordered.yml"
    ordered.write_text(yaml.safe_dump(inventory))
    rendered = mlxops(tmp_path, "hostfile", str(ordered), "-o", str(tmp_path / "ring.json"))
    assert rendered.returncode == 0, rendered.stderr
    assert (tmp_path / "ring.json").read_bytes() == \
        (box.node_home("node1") / ".mlxops/hostfiles/ring.json").read_bytes()
    # mlxops check names the order the nodes' hostfiles are in, and the line; with the
    # line in the inventory, the hostfiles check passes.
    for inventory_path, want in ((box.inventory_path, "another order"), (ordered, None)):
        checked = mlxops(tmp_path, "check", str(inventory_path), "--json", "--limit", "node1")
        got = next(r for r in json.loads(checked.stdout)["results"]
                   if r["check"] == "check_hostfiles")
        if want is None or order == sorted(order):  # the ring found may be file order
            assert got["outcome"] == "passed", got
        else:
            assert got["outcome"] == "failed" and want in got["message"], got
            assert f"mlxops_ring_order: [{', '.join(order)}]" in got["message"], got

    rows = doc["allreduce"]
    # Two sizes: the bound below holds at every size (each costs 8 ranks a warm-up and
    # timed calls of all_sum and all_gather over the shaped links).
    assert [r["bytes"] for r in rows] == [256 << 10, 512 << 10]
    assert all(r["wrong"] == 0 for r in rows), rows
    assert doc["allreduce_info"]["ranks"] == 8
    # MLX's ring sends both ways: the bus bandwidth is bounded by the slowest ring link's
    # two directions together (node3: 0.1 Gbit/s each way).
    for r in rows:
        assert 0 < r["busbw_gbps"] <= 1.1 * 2 * 0.1, r
    nothing_left(box, box.nodes)


def test_an_unreachable_host_is_reported_and_the_others_measured(login_sandbox_mut, tmp_path):
    box = login_sandbox_mut
    first, second, down = box.nodes[-3:]
    box.stop_node(down)
    proc, doc = bench_json(tmp_path, box, "--limit", f"{first},{second},{down}", "--streams",
                           "1", "--seconds", "0.5", "--omit", "0", "--sizes", "4K,64K")
    assert proc.returncode == 3, proc.stderr
    assert list(doc["unreachable"]) == [down]
    assert {(p["src"], p["dst"]) for p in doc["pairs"]} == {(first, second), (second, first)}
    assert doc["allreduce_info"]["ranks"] == 2 and all(r["wrong"] == 0
                                                       for r in doc["allreduce"])
    box.start_node(down)
    nothing_left(box, [first, second, down])


def test_ctrl_c_during_the_all_reduce_leaves_nothing_running(sandbox_mut, tmp_path):
    box = sandbox_mut
    for name in ("node1", "node4"):
        box.set_rate(name, "50mbit")  # 16 MiB per call: seconds, time enough to interrupt
    env = {**os.environ, "MLXOPS_HOME": str(tmp_path / "mlxops-home")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "mlxops", "bench", str(box.inventory_path), "--limit",
         "node1,node4", "--streams", "1", "--seconds", "0.5", "--omit", "0", "--sizes",
         "4M..16M"], env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            if len(node_processes(box, "mlxops.node.allreduce", ["node1", "node4"])) >= 2:
                break
            time.sleep(0.2)
        assert proc.poll() is None, proc.communicate()
        time.sleep(1.0)  # the ranks are in their sweep
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    nothing_left(box, ["node1", "node4"])
    assert not (tmp_path / "mlxops-home" / "jobs" / BENCH_JOB).exists()

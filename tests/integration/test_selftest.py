"""``mlxops selftest`` through the real CLI, on sandbox nodes that log in to bash and to zsh:
every step passes, the summary (text, JSON) says what happened, and nothing of it is left
on any node: no process, no run directory, no controller record. A node whose key is
unknown and one that is down fail the run at its first step, naming them; Ctrl-C during
the job still stops it and leaves nothing.

Each run has its own ``mlxops_root`` (:data:`ROOT`), so that what is left under
``runs/`` and which processes name it are the selftest's alone. A full selftest is a
minute or more on a busy 2-core machine, so each login shell's passing run happens once
per module (``bash_run``, ``zsh_run``: what it left is read as it ends) and several tests
assert on its summary. The bash run takes three nodes (three links for the ring search to
choose from), the zsh run two (what it proves is the login shell: one link, a ring of two,
the kill of rank 1; a third node cost it ~30 s of a 2-core machine), and the selftest has
no shorter bench or job settings: ``--timeout`` is a bound, not a length.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import NamedTuple

import pytest
import yaml
from cli_helpers import host_key_fingerprint, mlxops

from mlxops.sandbox.kernels import link_root_cache

pytestmark = pytest.mark.integration

ROOT = ".mlxops-selftest-it"      # under the node's home; unique to these tests
NAME = "mlxops-selftest"
STEPS = ["trust", "provision", "check", "bench", "job", "stop"]
TIMEOUT = 300
BASH_HOSTS = ["node1", "node2", "node3"]
#: The passing runs' links: a Mac's built-in Ethernet. The bench step streams for a fixed
#: time, so on an unshaped veth (~25 Gbit/s here) its copies took both cores: 21 of a
#: 3-node run's 27 CPU-s without the job, 7 at 2 Gbit/s (the step's seconds the same).
LINK_RATE = "1gbit"


@contextlib.contextmanager
def links_at(box, hosts: list[str], rate: str):
    """The hosts' links shaped to ``rate`` for the block, then back to what they were."""
    before = {host: box.rate(host) for host in hosts}
    try:
        for host in hosts:
            box.set_rate(host, rate)
        yield
    finally:
        for host, was in before.items():
            box.set_rate(host, was)


def inventory(box, tmp_path: Path, hosts: list[str] | None = None) -> Path:
    """The sandbox's inventory with the selftest's own root; only ``hosts``, if given.

    Each node's root gets the sandbox user's shared kernel cache, as the default root has
    (mlxops/sandbox/kernels.py): a root of its own compiled every MLX CPU kernel of the
    job again on every node, 115 g++ runs a suite (~60 CPU-s), for nothing these tests
    look at."""
    account = pwd.getpwnam(box.user)
    for host in hosts if hosts is not None else box.nodes:
        link_root_cache(Path(box.node_home(host)) / ROOT, account)
    doc = yaml.safe_load(Path(box.inventory_path).read_text())
    doc["all"]["vars"]["mlxops_root"] = f"~/{ROOT}"
    if hosts is not None:
        for group in doc["all"]["children"].values():
            group["hosts"] = {h: v for h, v in group["hosts"].items() if h in hosts}
    path = tmp_path / "inventory.yml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def left_behind(box, tmp_path: Path) -> dict[str, list[str]]:
    """What the selftest may leave: processes naming its root (every node shares this
    machine's PID namespace), entries under each node's ``<root>/runs/``, its record."""
    out = subprocess.run(["pgrep", "-af", f"/{ROOT}/runs/"], capture_output=True, text=True)
    found = {"processes": [p for p in out.stdout.splitlines() if "pgrep" not in p]}
    for node in box.nodes:
        runs = Path(box.node_home(node)) / ROOT / "runs"
        found[node] = sorted(os.listdir(runs)) if runs.is_dir() else []
    home = tmp_path / "mlxops-home" / "jobs"
    found["records"] = sorted(os.listdir(home)) if home.is_dir() else []
    return {k: v for k, v in found.items() if v}


def steps_in_text(text: str) -> dict[str, str]:
    """``{step: result}`` from the summary's step table."""
    table = text.split("\nstep ", 1)[1].split("\n\n", 1)[0]
    return {m.group(1): m.group(2) for m in
            re.finditer(r"^(\w+) +(ok|failed|unreachable|skipped|not run|interrupted)\b",
                        table, re.M)}


class Run(NamedTuple):
    """One selftest's CLI result and what it left behind, read as soon as it ended."""

    proc: subprocess.CompletedProcess
    left: dict[str, list[str]]


@pytest.fixture(scope="module")
def bash_run(sandbox, tmp_path_factory) -> Run:
    """The full selftest on three bash nodes, once for the module; text summary."""
    tmp_path = tmp_path_factory.mktemp("selftest-bash")
    with links_at(sandbox, BASH_HOSTS, LINK_RATE):
        proc = mlxops(tmp_path, "selftest", str(inventory(sandbox, tmp_path)),
                      "--limit", ",".join(BASH_HOSTS), timeout=TIMEOUT)
    return Run(proc, left_behind(sandbox, tmp_path))


@pytest.fixture(scope="module")
def zsh_run(zsh_sandbox, tmp_path_factory) -> Run:
    """The full selftest on two zsh nodes (an inventory of those two, so no --limit),
    once for the module; ``--json``."""
    tmp_path = tmp_path_factory.mktemp("selftest-zsh")
    path = inventory(zsh_sandbox, tmp_path, hosts=zsh_sandbox.nodes[:2])
    with links_at(zsh_sandbox, zsh_sandbox.nodes[:2], LINK_RATE):
        proc = mlxops(tmp_path, "selftest", str(path), "--json", timeout=TIMEOUT)
    return Run(proc, left_behind(zsh_sandbox, tmp_path))


def test_selftest_passes_on_bash_nodes_and_leaves_nothing(bash_run):
    text = bash_run.proc.stdout
    assert bash_run.proc.returncode == 0, text + bash_run.proc.stderr
    assert text.startswith("mlxops selftest: PASSED (exit 0) in ")
    assert steps_in_text(text) == dict.fromkeys(STEPS, "ok"), text
    assert "problems:" not in text
    assert bash_run.left == {}


def test_the_text_summary_has_the_hosts_links_all_reduce_and_recovery(bash_run):
    text = bash_run.proc.stdout
    for host in BASH_HOSTS:  # the host table: system, Python and MLX from the facts
        assert re.search(rf"^{host} +Linux .* 3\.\d+\.\d+ +\d+\.\d+\.\d+$", text, re.M), text
    links = re.findall(r"^(node\d) <> (node\d) +([\d.]+) +([\d.]+) +([\d.]+)$", text, re.M)
    assert {(a, b) for a, b, *_ in links} == {("node1", "node2"), ("node1", "node3"),
                                              ("node2", "node3")}, text
    assert re.search(r"^all-reduce: 3 ranks \(ring\), busbw [\d.]+ Gbit/s", text, re.M), text
    assert re.search(r"^recovery: [\d.]+ s from kill -9 of rank 2 on node3 \(at step \d+\) "
                     r"to every rank training again from step \d+; the watchdog: rank 2 on "
                     r"node3 exited with code 137", text, re.M), text


def zsh_document(run: Run) -> dict:
    doc = json.loads(run.proc.stdout)  # --json: one document, nothing else on stdout
    assert run.proc.returncode == 0 and doc["ok"] and doc["exit_code"] == 0, \
        json.dumps(doc, indent=1) + run.proc.stderr
    return doc


def test_selftest_passes_on_zsh_nodes_and_leaves_nothing(zsh_run, zsh_sandbox):
    doc = zsh_document(zsh_run)
    assert [(s["name"], s["result"]) for s in doc["steps"]] == [(s, "ok") for s in STEPS]
    assert all(s["seconds"] > 0 for s in doc["steps"])
    assert doc["hosts"] == zsh_sandbox.nodes[:2]
    assert doc["steps"][1]["data"]["counts"]  # provision ran its tasks on every host
    assert zsh_run.left == {}


def test_the_json_summary_has_the_hosts_links_all_reduce_and_recovery(zsh_run):
    doc = zsh_document(zsh_run)
    hosts = doc["hosts"]
    assert [h["name"] for h in doc["host_info"]] == hosts
    assert {h["os"] for h in doc["host_info"]} == {"Linux"}
    assert {h["mlx"] for h in doc["host_info"]} == {doc["controller"]["mlx"]}
    n = len(hosts)
    assert len(doc["links"]) == n * (n - 1) // 2
    # Measured on the links as shaped (LINK_RATE): up to 1 Gbit/s, and most of it.
    assert all(0.5 < x[way] <= 1.0 for x in doc["links"] for way in ("a_to_b_gbps",
                                                                     "b_to_a_gbps")), doc["links"]
    assert doc["allreduce"]["ranks"] == n and doc["allreduce"]["wrong"] == 0
    assert doc["allreduce"]["busbw_gbps"] > 0
    r = doc["recovery"]
    assert (r["rank"], r["host"]) == (n - 1, hosts[-1])
    assert r["reason"] == f"rank {n - 1} on {hosts[-1]} exited with code 137"
    # A checkpoint every 20 steps, the kill once every rank passed 22 (the killed rank's
    # heartbeat may be half a second older than the newest checkpoint).
    assert r["resumed_from"] >= 20 and r["resumed_from"] % 20 == 0
    assert r["killed_at_step"] >= 22
    assert 0 < r["restart_seconds"] <= r["recovered_seconds"]


def test_an_unknown_key_and_a_node_down_fail_the_run_at_trust_naming_both(sandbox_mut,
                                                                          tmp_path):
    box = sandbox_mut
    box.forget_host_key("node2")
    box.stop_node("node3")
    proc = mlxops(tmp_path, "selftest", str(inventory(box, tmp_path)), "--json",
                  "--limit", "node1,node2,node3", "--connect-timeout", "5", timeout=120)
    doc = json.loads(proc.stdout)
    assert proc.returncode == 3 and doc["exit_code"] == 3, proc.stderr
    results = {s["name"]: s["result"] for s in doc["steps"]}
    assert results == {"trust": "unreachable", **dict.fromkeys(STEPS[1:], "not run")}
    trust = doc["steps"][0]
    fingerprint = host_key_fingerprint(box, "node2")
    assert any(p.startswith("node2: unknown host key ssh-ed25519 " + fingerprint)
               for p in trust["problems"]), trust
    assert any(p.startswith("node3: unreachable") for p in trust["problems"]), trust
    assert trust["data"]["node1"]["state"] == "known"
    assert doc["steps"][1]["detail"] == "after trust: unreachable"
    assert left_behind(box, tmp_path) == {}
    # The text names the step and both hosts too.
    text = mlxops(tmp_path, "selftest", str(inventory(box, tmp_path)), "--limit",
                  "node2", timeout=120).stdout
    assert "mlxops selftest: FAILED (exit 1)" in text
    assert f"  trust: node2: unknown host key ssh-ed25519 {fingerprint}" in text


def test_ctrl_c_during_the_job_stops_it_and_leaves_nothing(sandbox, tmp_path):
    env = {**os.environ, "MLXOPS_HOME": str(tmp_path / "mlxops-home")}
    cli = subprocess.Popen(
        [sys.executable, "-m", "mlxops", "selftest", str(inventory(sandbox, tmp_path)),
         "--limit", "node1,node2", "--skip", "provision,check,bench"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        stdin=subprocess.DEVNULL)
    record = tmp_path / "mlxops-home" / "jobs" / NAME / "record.json"
    try:
        deadline = time.monotonic() + 60
        while not record.exists():  # launched: its ranks run on both nodes
            assert cli.poll() is None and time.monotonic() < deadline, cli.communicate()
            time.sleep(0.1)
        cli.send_signal(signal.SIGINT)
        out, err = cli.communicate(timeout=120)
    finally:
        if cli.poll() is None:
            cli.kill()
            cli.wait()
    assert cli.returncode == 130, out + err
    assert out.startswith("mlxops selftest: INTERRUPTED (exit 130)"), out
    steps = steps_in_text(out)
    assert steps["job"] == "interrupted" and steps["stop"] == "ok", out
    assert left_behind(sandbox, tmp_path) == {}

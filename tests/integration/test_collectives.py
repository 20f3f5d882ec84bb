"""The collectives check on sandbox sshd nodes (bash and zsh login shells): pre-flight's
check proves every collective on the job's hosts and backend and leaves nothing behind,
and refuses a backend whose ``all_gather`` (or ``send``) answers wrong, shown with the
fault hook (``MLXOPS_FAULT_COLLECTIVE``) that makes one rank's answer wrong as a broken
backend's would; ``mlxops check`` fails the host that got the wrong answer."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest
import yaml
from node_procs import node_processes

from mlxops.jobs.jobdirs import job_dir
from mlxops.jobs.launch import launch
from mlxops.jobs.placement import place_ranks
from mlxops.jobs.preflight import PreflightError, verify_collectives
from mlxops.jobs.selection import select_hosts
from mlxops.jobs.spec import load_job
from mlxops.node.protocol.collectives import COLLECTIVES, COLLECTIVES_JOB, FAULT_ENV

pytestmark = pytest.mark.integration

HOSTS = "node1,node2,node3"
TRAINER = {"model": {"dims": 32, "layers": 1, "heads": 2, "vocab_size": 64, "seq_len": 16},
           "data": {"source": "synthetic", "seed": 0}, "train": {"steps": 4, "global_batch": 6}}


def _job(tmp_path: Path, sandbox) -> Path:
    path = tmp_path / "job.yml"
    path.write_text(yaml.safe_dump({"name": "coll", "inventory": str(sandbox.inventory_path),
                                    "hosts": HOSTS, "backend": "ring", "trainer": TRAINER}))
    return path


def _nothing_left(sandbox) -> None:
    procs = node_processes(sandbox, "mlxops.node.collectives")  # not another sandbox's
    assert procs == [], procs
    for node in HOSTS.split(","):
        assert not (sandbox.node_home(node) / ".mlxops" / "runs" / COLLECTIVES_JOB).exists()
    assert not job_dir(COLLECTIVES_JOB).exists()


def test_preflight_proves_the_collectives_and_refuses_a_wrong_all_gather(
        login_sandbox, tmp_path, connector, monkeypatch):
    sandbox = login_sandbox
    spec = load_job(_job(tmp_path, sandbox))
    ranks = place_ranks(select_hosts(spec, ()), spec.base_port)
    verify_collectives(spec, ranks, connector, launch, ops=COLLECTIVES)  # right: passes
    _nothing_left(sandbox)

    monkeypatch.setenv(FAULT_ENV, "all_gather:1")
    with pytest.raises(PreflightError) as refused:
        verify_collectives(spec, ranks, connector, launch, ops=COLLECTIVES)
    line = str(refused.value)
    assert line.startswith(f"pre-flight failed: the ring backend (MLX {version('mlx')}) "
                           "returned wrong data: all_gather float32 x 1031: rank 1 got rank "
                           "1's values where rank 0's belong (order wrong)"), line
    assert "\n" not in line
    _nothing_left(sandbox)


def test_preflight_refuses_a_corrupted_send_between_ring_neighbours(
        sandbox, tmp_path, connector, monkeypatch):
    spec = load_job(_job(tmp_path, sandbox))
    ranks = place_ranks(select_hosts(spec, ()), spec.base_port)
    monkeypatch.setenv(FAULT_ENV, "send_recv:2")
    with pytest.raises(PreflightError, match=r"send_recv float32 x 1031: rank 0 received 1 "
                                             r"of 1031 values from rank 2 wrong"):
        verify_collectives(spec, ranks, connector, launch, ops=("all_sum", "send_recv"))
    _nothing_left(sandbox)


def test_check_fails_the_host_whose_all_gather_answered_wrong(login_sandbox, tmp_path):
    sandbox = login_sandbox
    home = tmp_path / "home"
    env = {**os.environ, "MLXOPS_HOME": str(home),
           FAULT_ENV: "all_gather:1"}

    def mlxops(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "mlxops", *args], capture_output=True,
                              text=True, timeout=400, env=env, stdin=subprocess.DEVNULL)

    # Provisioned into a root of its own (the check only reads: its code must be current).
    doc = yaml.safe_load(Path(sandbox.inventory_path).read_text())
    doc["all"]["vars"]["mlxops_root"] = "~/.coll"
    inventory = tmp_path / "inventory.yml"
    inventory.write_text(yaml.safe_dump(doc, sort_keys=False))
    proc = mlxops("provision", str(inventory), "--limit", HOSTS)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr
    proc = mlxops("check", str(inventory), "--limit", HOSTS, "--json")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    doc = json.loads(proc.stdout)
    got = {(r["check"], r["host"]): r for r in doc["results"]}
    assert got[("check_all_sum", "node2")]["outcome"] == "passed"
    assert [got[("check_collectives", n)]["outcome"] for n in HOSTS.split(",")] == [
        "passed", "failed", "passed"]
    message = got[("check_collectives", "node2")]["message"]
    assert message.startswith(f"node2: the ring backend (MLX {version('mlx')}) returned "
                              "wrong data: all_gather float32 x 1031: rank 1 got rank 1's "
                              "values where rank 0's belong (order wrong)"), message
    _nothing_left(sandbox)

"""The optimised BLAS on the sandbox's Linux nodes: ranks run with the node's OpenBLAS
preloaded and their share of its cores, ring and mpi alike; ``blas: off`` leaves MLX's own;
``provision`` reports the library (docs/job-file.md, "What each rank gets").

Nodes share this machine's filesystem, so they have the OpenBLAS this machine has, and its
PID namespace, so a rank's /proc is readable from here.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from job_helpers import inventory_with_slots, run_dir, wait_for_step

from mlxops.jobs.launch import launch
from mlxops.jobs.spec import load_job
from mlxops.jobs.stop import stop_job
from mlxops.node.blas import find_openblas, thread_env, usable_cpus

OPENBLAS = find_openblas()
pytestmark = pytest.mark.skipif(
    OPENBLAS is None, reason="no OpenBLAS on this machine (apt-get install "
                             "libopenblas0-pthread; `make test` installs it when root)")

TRAINER = {
    "model": {"dims": 32, "layers": 1, "heads": 2, "vocab_size": 256, "seq_len": 32},
    "data": {"source": "synthetic", "seed": 0},
    "train": {"steps": 100000, "global_batch": 6, "micro_batch": 1, "lr": 3e-3,
              "checkpoint_every": 0, "log_every": 1},
}


@pytest.fixture
def inventory(sandbox, tmp_path) -> Path:
    """The sandbox inventory with 2 slots on node7: ranks 0 on node6, 1 and 2 on node7."""
    return inventory_with_slots(sandbox, tmp_path, {"node7": 2})


def write_job(tmp_path: Path, inventory: Path, name: str, **extra) -> Path:
    job = {"name": name, "inventory": str(inventory), "hosts": "node6,node7",
           "trainer": TRAINER, "stop_grace": 2, "restart": {"max_restarts": 0}, **extra}
    path = tmp_path / f"{name}.yml"
    path.write_text(yaml.safe_dump(job))
    return path


def trainer_process(sandbox, node: str, name: str, rank: int) -> int:
    """The pid of a rank's trainer: the python its start script (rank-<r>.pid) runs."""
    pid = int((run_dir(sandbox, node, name) / f"rank-{rank}.pid").read_text())
    children = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True)
    found = [int(p) for p in children.stdout.split()]
    assert len(found) == 1, (pid, found)
    return found[0]


def environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(item.decode().split("=", 1) for item in raw if b"=" in item)


def job_preload(sandbox, env: dict[str, str]) -> str | None:
    """A rank's ``LD_PRELOAD`` less the sandbox nodes' own library, which every session
    there preloads (mlxops/sandbox/nospin.py) and a job's preload goes in front of."""
    own = sandbox.session_env().get("LD_PRELOAD")
    parts = env.get("LD_PRELOAD", "").split(":")
    if own:
        assert parts[-1] == own, parts
    return ":".join(p for p in parts if p and p != own) or None


def mapped(pid: int) -> set[str]:
    """The files a process maps (libraries included)."""
    lines = Path(f"/proc/{pid}/maps").read_text().splitlines()
    return {line.split(None, 5)[5] for line in lines if len(line.split(None, 5)) == 6}


def ranks_of(sandbox, name: str) -> dict[int, int]:
    """rank -> its trainer's pid (node6: rank 0; node7: ranks 1, 2)."""
    where = {0: "node6", 1: "node7", 2: "node7"}
    return {r: trainer_process(sandbox, node, name, r) for r, node in where.items()}


@pytest.mark.parametrize("backend", ["ring", "mpi"])
def test_every_rank_preloads_the_nodes_openblas_with_its_share_of_the_cores(
        sandbox, inventory, tmp_path, connector, backend):
    if backend == "mpi" and shutil.which("mpirun") is None:
        pytest.skip("mpi: mpirun not found (apt-get install openmpi-bin)")
    name = f"blas-{backend}"
    spec = load_job(write_job(tmp_path, inventory, name, backend=backend))
    record = launch(spec, connector, fresh=True)
    try:
        wait_for_step(record, connector, 2, timeout=120)
        library = os.path.realpath(OPENBLAS)
        cpus = usable_cpus()  # the nodes' CPUs are this machine's
        for rank, pid in ranks_of(sandbox, name).items():
            env = environ(pid)
            assert job_preload(sandbox, env) == OPENBLAS, (rank, env.get("LD_PRELOAD"))
            per_host = 1 if rank == 0 else 2
            assert {k: env[k] for k in env if k.startswith("OPENBLAS_")} \
                == thread_env(cpus, per_host), rank
            assert library in mapped(pid), (rank, sorted(mapped(pid)))
    finally:
        stop_job(record, connector)


def test_blas_off_and_the_users_own_value_win(sandbox, inventory, tmp_path, connector):
    name = "blas-off"
    spec = load_job(write_job(tmp_path, inventory, name, blas="off"))
    record = launch(spec, connector, fresh=True)
    try:
        wait_for_step(record, connector, 2, timeout=120)
        for rank, pid in ranks_of(sandbox, name).items():
            env = environ(pid)
            assert job_preload(sandbox, env) is None, rank
            assert not any(k.startswith("OPENBLAS_") for k in env), rank
            assert os.path.realpath(OPENBLAS) not in mapped(pid), rank
    finally:
        stop_job(record, connector)
    name = "blas-mine"
    spec = load_job(write_job(tmp_path, inventory, name, env={"OPENBLAS_NUM_THREADS": 7}))
    record = launch(spec, connector, fresh=True)
    try:
        wait_for_step(record, connector, 1, timeout=120)
        for rank, pid in ranks_of(sandbox, name).items():
            env = environ(pid)
            assert (job_preload(sandbox, env), env["OPENBLAS_NUM_THREADS"]) == (OPENBLAS, "7"), \
                rank
    finally:
        stop_job(record, connector)


def test_provision_reports_each_linux_nodes_openblas(sandbox, tmp_path):
    argv = [sys.executable, "-m", "mlxops", "provision", str(sandbox.inventory_path),
            "--tags", "blas", "--limit", "node6,node7", "--json"]
    env = {**os.environ, "MLXOPS_HOME": str(tmp_path / "home")}
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    task = next(t for t in doc["tasks"] if t["task"] == "blas")
    assert task["hosts"] == {n: {"status": "ok", "message": OPENBLAS}
                             for n in ("node6", "node7")}

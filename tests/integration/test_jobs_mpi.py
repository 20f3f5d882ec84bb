"""``backend: mpi`` jobs on 3 sandbox nodes (4 ranks: node2 has 2 slots), through mpirun.

mpirun runs on node1 (the job's first host) and reaches node2 and node3 over node-to-node
SSH as the node user, the way Open MPI does on Macs; each rank runs its own start script.
The trainer is deterministic, so an mpi run must log the losses of the same ring run.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
import yaml
from job_helpers import BackgroundWatchdog, Hold, inventory_with_slots, losses, run_dir

from mlxops.jobs.launch import launch
from mlxops.jobs.logs import fetch, prefixed
from mlxops.jobs.record import load_record
from mlxops.jobs.spec import load_job
from mlxops.jobs.status import job_status
from mlxops.jobs.stop import stop_job
from mlxops.jobs.watch import supervise
from mlxops.sandbox.netns import netns_pids

pytestmark = pytest.mark.skipif(
    shutil.which("mpirun") is None or shutil.which("orted") is None,
    reason="mpi jobs: mpirun/orted not found (apt-get install openmpi-bin; `make test` "
           "installs it when root)")

HOSTS = "node1,node2,node3"
TRAINER = {
    "model": {"dims": 32, "layers": 1, "heads": 2, "vocab_size": 256, "seq_len": 32},
    "data": {"source": "synthetic", "seed": 0},
    "train": {"steps": 16, "global_batch": 8, "micro_batch": 2, "lr": 3e-3,
              "checkpoint_every": 4, "keep": 2, "log_every": 1},
}


SLOTS = {"node2": 2}  # ranks 0 | 1 2 | 3


@pytest.fixture
def inventory(sandbox, tmp_path) -> Path:
    """The sandbox inventory with 2 slots on node2: ranks 0 | 1 2 | 3."""
    return inventory_with_slots(sandbox, tmp_path, SLOTS)


def write_job(tmp_path: Path, inventory: Path, name: str, backend: str, steps: int,
              max_restarts: int = 0, stall_timeout: float = 60,
              env: dict[str, str] | None = None) -> Path:
    trainer = json.loads(json.dumps(TRAINER))
    trainer["train"]["steps"] = steps
    job = {"name": name, "inventory": str(inventory), "hosts": HOSTS, "backend": backend,
           "trainer": trainer, "stop_grace": 3,
           "restart": {"max_restarts": max_restarts, "stall_timeout": stall_timeout}}
    if env:
        job["env"] = env
    path = tmp_path / f"{name}.yml"
    path.write_text(yaml.safe_dump(job))
    return path


def _zombie(pid: str) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return True  # gone


def job_node_pids(sandbox) -> set[int]:
    """Processes in the network namespaces of the job's nodes: this machine's other test
    sessions (other sandboxes, xdist workers) run their own mpirun, orted and jobs of the
    same name, in one PID namespace with these."""
    return {pid for node in HOSTS.split(",")
            for pid in netns_pids(sandbox.node_layout(node).netns)}


def in_job_nodes(sandbox, pid: int) -> bool:
    """``pid`` is in one of the job's nodes' network namespaces (its ``ns/net`` inode)."""
    try:
        inode = os.stat(f"/proc/{pid}/ns/net").st_ino
    except OSError:
        return False  # gone
    return any(os.stat(f"/run/netns/{sandbox.node_layout(node).netns}").st_ino == inode
               for node in HOSTS.split(","))


def leftovers(sandbox, name: str) -> list[str]:
    """Live processes of the job on any of its nodes, and any MPI daemon there (a zombie
    its parent has not reaped yet runs nothing)."""
    found = []
    for args in (["-af", f"/runs/{name}/"], ["-ax", "orted"], ["-ax", "mpirun"]):
        out = subprocess.run(["pgrep", *args], capture_output=True, text=True).stdout
        found += [line for line in out.splitlines()
                  if "pgrep" not in line and not _zombie(line.split()[0])]
    ours = job_node_pids(sandbox) if found else set()
    # `ip netns pids` and the inode of each pid's namespace: either says it is the job's
    # (one full scan of /proc against one stat per pid, in case the scan misses one)
    return [line for line in found
            if int(line.split()[0]) in ours or in_job_nodes(sandbox, int(line.split()[0]))]


def no_leftovers(sandbox, name: str, within: float = 5.0) -> list[str]:
    deadline = time.monotonic() + within
    while (left := leftovers(sandbox, name)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


def logs(record, connector) -> str:
    """The job's merged logs: printed whole (pytest shows it on failure), the tail returned
    for the assertion message (which pytest shortens)."""
    text = "\n".join(prefixed(fetch(record, connector, {})))
    print(text)
    return text[-3000:]


def test_mpi_job_finishes_with_the_losses_of_the_same_ring_job(
        login_sandbox, tmp_path, connector):
    # On zsh nodes too: mpirun starts each remote orted over node-to-node ssh, under the
    # node user's login shell.
    sandbox = login_sandbox
    inventory = inventory_with_slots(sandbox, tmp_path, SLOTS)
    ring = launch(load_job(write_job(tmp_path, inventory, "m-ring", "ring", 16)), connector)
    assert supervise(ring, connector).state == "finished"

    # No restart allowed. Open MPI's orteds failed at start now and then while the sandbox
    # nodes shared one hostname (and $TMPDIR): their session directories collided. Each
    # node has its own name now; whatever happens is printed (pytest shows it on failure).
    record = launch(load_job(write_job(tmp_path, inventory, "m-mpi", "mpi", 16)), connector)
    assert [(r.rank, r.host) for r in record.ranks] == [
        (0, "node1"), (1, "node2"), (2, "node2"), (3, "node3")]
    script = (run_dir(sandbox, "node1", "m-mpi") / "launcher.sh").read_text()
    assert "mpirun" in script and "-host" in script
    final = supervise(record, connector, on_event=print)
    assert final.state == "finished", (final.to_dict(), logs(record, connector))
    assert all(r.state == "finished" and r.step == 16 for r in final.ranks)
    assert final.launcher and final.launcher.exit == 0
    # Each rank records its own pid (mpirun started it) and logs to its own file.
    for rank, node in ((1, "node2"), (2, "node2"), (3, "node3")):
        assert (run_dir(sandbox, node, "m-mpi") / f"rank-{rank}.pid").exists()
        assert (run_dir(sandbox, node, "m-mpi") / f"rank-{rank}.exit").read_text() == "0\n"
    want, got = losses(sandbox, "m-ring"), losses(sandbox, "m-mpi")
    assert sorted(got) == sorted(want) == list(range(1, 17))
    for step in want:
        assert abs(got[step] - want[step]) <= 1e-5, (step, got[step], want[step])
    assert no_leftovers(sandbox, "m-mpi") == []
    # `mlxops logs` shows mpirun's own log (first) beside the ranks'.
    merged = list(prefixed(fetch(record, connector, {})))
    assert any(line.startswith("[node1 r0] ") for line in merged)  # rank 0 prints
    assert merged[0].startswith("[node1 mpirun] mlxops: starting ")


def test_stop_mid_run_leaves_no_process_on_any_node_and_resume_finishes(
        sandbox, tmp_path, inventory, connector):
    # Held at step 5 until stopped: it is running when stopped, however fast the machine.
    hold = Hold(sandbox, "m-stop", HOSTS, at=5)
    spec = load_job(write_job(tmp_path, inventory, "m-stop", "mpi", 30, env=hold.env))
    record = launch(spec, connector)
    with hold:
        deadline = time.monotonic() + 60
        while (job_status(record, connector).step or 0) < 5:
            status = job_status(record, connector)
            assert status.state == "running", (status.to_dict(), logs(record, connector))
            assert time.monotonic() < deadline, "no progress"
            time.sleep(0.3)
        running = leftovers(sandbox, "m-stop")  # seen while it runs: ranks, orted, mpirun
        assert any("orted" in p for p in running) and any("mpirun" in p for p in running), (
            running, subprocess.run(["pgrep", "-a", "orted|mpirun|rank-"],
                                    capture_output=True, text=True).stdout)
        results = stop_job(record, connector)
    assert results.exit_code == 0, {h: r.message for h, r in results.items()}
    assert no_leftovers(sandbox, "m-stop", within=1.0) == []
    status = job_status(load_record("m-stop"), connector)
    assert status.state == "stopped", status.to_dict()
    assert stop_job(load_record("m-stop"), connector).exit_code == 0  # idempotent

    # Resume on the same layout: continues from the newest common checkpoint.
    resumed = launch(spec, connector, resume=True, previous=load_record("m-stop"))
    assert resumed.message.startswith("resumed from step")
    final = supervise(resumed, connector)
    assert final.state == "finished", (final.to_dict(), logs(resumed, connector))
    assert no_leftovers(sandbox, "m-stop") == []


def mpi_trainer_pid(sandbox, name: str, rank: int, node: str) -> int:
    """mpirun started the rank's script (its pid file holds the sh); the trainer is its child."""
    script_pid = (run_dir(sandbox, node, name) / f"rank-{rank}.pid").read_text().strip()
    trainer = subprocess.run(["pgrep", "-P", script_pid], capture_output=True, text=True)
    return int(trainer.stdout.split()[0])


@pytest.mark.parametrize("sig, name, stall_timeout, reason", [
    (signal.SIGKILL, "m-kill", 60, "rank 3"),    # a rank that vanishes: mpirun notices too
    (signal.SIGSTOP, "m-stall", 6, "stalled"),   # a rank that hangs: only the watchdog can
])
def test_a_dead_or_stuck_mpi_rank_is_restarted_by_the_watchdog(
        sandbox, tmp_path, inventory, connector, sig, name, stall_timeout, reason):
    hold = Hold(sandbox, name, HOSTS, at=6)  # released once the rank is hit
    spec = load_job(write_job(tmp_path, inventory, name, "mpi", 40, max_restarts=1,
                              stall_timeout=stall_timeout, env=hold.env))
    record = launch(spec, connector)
    watchdog = BackgroundWatchdog(record, connector)
    with hold:
        deadline = time.monotonic() + 60
        while (job_status(record, connector).step or 0) < 6:
            assert time.monotonic() < deadline, "no progress"
            time.sleep(0.3)
        os.kill(mpi_trainer_pid(sandbox, name, 3, "node3"), sig)
    final = watchdog.result(timeout=180)
    assert final.state == "finished", (final.to_dict(), watchdog.events,
                                       logs(record, connector))
    restarts = load_record(name).restarts
    assert len(restarts) == 1 and reason in restarts[0].reason, restarts
    assert no_leftovers(sandbox, name) == []

"""mlxops's Mac paths end to end, on sandbox nodes that answer as a Mac (``mac_sandbox``).

The nodes log in to zsh, answer ``uname``, ``sw_vers``, ``sysctl``, ``pmset``, ``vm_stat``,
``ioreg`` and ``ifconfig`` from output recorded on a real Mac (mlxops/sandbox/darwin/
recorded/README.md), keep the wired limit and the sleep setting as state, have BSD ``ps``,
``stat -f`` and bsdtar as ``tar``, and no /proc. So the controller takes its Darwin
branches (facts, the macos task, check_macos) and the node helpers theirs (the process
table through ps, memory through sysctl and vm_stat, the GPU through ioreg).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import yaml
from cli_helpers import mlxops
from job_helpers import BackgroundWatchdog, Hold, losses, run_dir, wait_for_step

from mlxops.hostfacts import MacState
from mlxops.inventory import load_inventory
from mlxops.jobs.launch import launch
from mlxops.jobs.logs import fetch, prefixed
from mlxops.jobs.record import load_record
from mlxops.jobs.spec import load_job
from mlxops.jobs.status import job_status
from mlxops.jobs.stop import stop_job
from mlxops.jobs.watch import supervise
from mlxops.node import protocol
from mlxops.node.sample import ioreg_gpu, vm_stat_used
from mlxops.sandbox import darwin
from mlxops.sandbox.darwin.shim import recorded_sysctl
from mlxops.tasks.facts import ask_facts
from mlxops.transport.nodecmd import run_node

RECORDED = Path(darwin.__file__).parent / "recorded"
MAC = recorded_sysctl(RECORDED)
WANT_LIMIT = int(MAC["hw.memsize"]) * 3 // 4 // 2**20  # the playbook's wired_share: 0.75


@pytest.fixture(scope="module")
def become_inventory(mac_sandbox, tmp_path_factory) -> Path:
    """The Mac-like sandbox's inventory with ``ansible_become: true``."""
    doc = yaml.safe_load(mac_sandbox.inventory_path.read_text())
    doc["all"]["vars"]["ansible_become"] = True
    path = tmp_path_factory.mktemp("mac") / "inventory.yml"
    path.write_text(yaml.safe_dump(doc))
    return path


def node_state(sandbox, node: str, key: str) -> str:
    return (darwin.node_dir(sandbox.dir, node) / key).read_text().strip()


def on_node(sandbox, node: str, command: str) -> str:
    done = sandbox.exec_in(node, ["sh", "-c", command])
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_facts_are_the_recorded_mac(mac_sandbox, connector):
    host = load_inventory(mac_sandbox.inventory_path).hosts["node1"]
    facts = ask_facts(connector.connect(host), host)
    assert (facts.system, facts.arch, facts.hostname) == ("Darwin", "arm64", "node1")
    assert facts.chip == MAC["machdep.cpu.brand_string"] == "Apple M1 Pro"
    assert facts.memory_bytes == int(MAC["hw.memsize"])
    assert (facts.cpu_cores, facts.perf_cores) == (10, 8)
    assert (facts.macos_version, facts.macos_build) == ("14.4.1", "23E224")
    assert facts.interfaces["en0"] == [mac_sandbox.ip("node1")]   # the node's own wire
    assert facts.interfaces["lo0"] == ["127.0.0.1"]
    assert facts.macos == MacState(
        wired_limit_mb=int(node_state(mac_sandbox, "node1", "iogpu.wired_limit_mb")),
        sleep=int(node_state(mac_sandbox, "node1", "sleep")),
        thunderbolt_bridge_up=False,
        # networksetup's recorded ports, en0 (the node's wire) the Ethernet adapter.
        hardware_ports={"en0": "Ethernet Adapter (en0)", "bridge0": "Thunderbolt Bridge",
                        "en3": "Wi-Fi", "en1": "Thunderbolt 1", "en6": "Thunderbolt 2",
                        "en2": "Thunderbolt 3"})
    assert facts.rdma.enabled is True and facts.rdma.device("rdma_en2").port_state \
        == "PORT_ACTIVE"
    # The node really has no /proc, and its tools are the BSD ones.
    assert on_node(mac_sandbox, "node1", "ls -A /proc") == ""
    assert "bsdtar" in on_node(mac_sandbox, "node1", "tar --version")
    assert subprocess.run(mac_sandbox.node_argv("node1", ["stat", "-c", "%a", "/"]),
                          capture_output=True).returncode != 0


def test_provision_tunes_the_mac_with_become_and_check_holds_it(mac_sandbox, become_inventory,
                                                                 tmp_path):
    plain = mlxops(tmp_path, "provision", str(mac_sandbox.inventory_path), "--tags", "macos",
                   "--json")
    macos = {h: r["status"] for h, r in _task(plain, "macos").items()}
    assert macos == {"node1": "skipped", "node2": "skipped"}, plain.stdout[-2000:]
    assert node_state(mac_sandbox, "node1", "iogpu.wired_limit_mb") != str(WANT_LIMIT)

    first = mlxops(tmp_path, "provision", str(become_inventory), "--json")
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr
    assert {r["status"] for r in _task(first, "macos").values()} == {"changed"}
    for node in mac_sandbox.nodes:   # set through the sudo shim, kept by the nodes
        assert node_state(mac_sandbox, node, "iogpu.wired_limit_mb") == str(WANT_LIMIT)
        assert node_state(mac_sandbox, node, "sleep") == "0"
    again = mlxops(tmp_path, "provision", str(become_inventory), "--json")
    assert again.returncode == 0
    assert {r["status"] for t in ("macos", "env", "sync") for r in _task(again, t).values()} \
        == {"ok"}   # env: mode read by BSD stat -f; sync: the manifest, through bsdtar before

    check = mlxops(tmp_path, "check", str(become_inventory), timeout=120)
    assert check.returncode == 0, check.stdout[-3000:]
    # Changed back behind mlxops's back: check says so, provision puts it right.
    on_node(mac_sandbox, "node2", "sudo -n sysctl -w iogpu.wired_limit_mb=0 && "
                                   "sudo -n pmset -a sleep 10")
    broken = mlxops(tmp_path, "check", str(become_inventory), "--limit", "node2", "--json",
                    timeout=120)
    assert broken.returncode == 1
    failed = {(r["host"], r["check"]) for r in _results(broken) if r["outcome"] == "failed"}
    assert failed == {("node2", "check_wired_limit"), ("node2", "check_sleep")}, failed
    fixed = mlxops(tmp_path, "provision", str(become_inventory), "--tags", "macos", "--json")
    assert _task(fixed, "macos")["node2"]["status"] == "changed"


def test_a_job_runs_stops_and_recovers_through_bsd_ps(mac_sandbox, become_inventory,
                                                      tmp_path, connector):
    # Held at step 8 (then at 5) however fast the machine is: the job is running when
    # the test reads it and acts.
    hold = Hold(mac_sandbox, "m-kill", MAC_HOSTS, at=8)
    spec = load_job(_write_job(tmp_path, become_inventory, "m-kill", steps=60, env=hold.env))
    record = launch(spec, connector, fresh=True)
    watchdog = BackgroundWatchdog(record, connector)
    with hold:
        wait_for_step(record, connector, 8, timeout=240)   # a cold kernel cache: g++ runs
        status = job_status(record, connector)   # pids read through the ps shim: no /proc
        assert status.state == "running" and all(r.pid and r.state == "running"
                                                 for r in status.ranks), status.to_dict()
        os.kill(_trainer_pid(mac_sandbox, "m-kill", 1, "node2"), signal.SIGKILL)
    final = watchdog.result(timeout=180)
    assert final.state == "finished", final.to_dict()
    assert "rank 1 on node2" in load_record("m-kill").restarts[0].reason
    assert losses(mac_sandbox, "m-kill")[60] < losses(mac_sandbox, "m-kill")[1]
    assert _job_processes("m-kill") == []

    hold = Hold(mac_sandbox, "m-stop", MAC_HOSTS, at=5)
    spec = load_job(_write_job(tmp_path, become_inventory, "m-stop", steps=40, env=hold.env))
    record = launch(spec, connector, fresh=True)
    with hold:
        wait_for_step(record, connector, 5)
        assert stop_job(record, connector).exit_code == 0
    assert _job_processes("m-stop") == []
    assert job_status(load_record("m-stop"), connector).state == "stopped"
    assert supervise(load_record("m-stop"), connector).state == "stopped"


def test_an_mpi_job_gets_the_dyld_path_a_mac_needs(mac_sandbox, become_inventory, tmp_path,
                                                    connector):
    """On Darwin, ranks get DYLD_LIBRARY_PATH beside MLX_MPI_LIBNAME (Homebrew's libmpi);
    here Open MPI is Debian's at /usr/bin, so the path is /usr/lib and ld.so ignores it."""
    spec = load_job(_write_job(tmp_path, become_inventory, "m-mpi", steps=20, backend="mpi"))
    record = launch(spec, connector, fresh=True)
    script = (run_dir(mac_sandbox, "node2", "m-mpi") / "rank-1.sh").read_text()
    assert "DYLD_LIBRARY_PATH=/usr/lib" in script and "MLX_MPI_LIBNAME=" in script
    final = supervise(record, connector)
    logs = "\n".join(prefixed(fetch(record, connector, {})))
    assert final.state == "finished", (final.to_dict(), logs[-3000:])
    assert _job_processes("m-mpi") == []


def test_the_monitor_samples_a_mac_through_sysctl_vm_stat_and_ioreg(mac_sandbox, connector):
    host = load_inventory(mac_sandbox.inventory_path).hosts["node1"]
    code = f"{on_node(mac_sandbox, 'node1', 'echo $HOME').strip()}/.mlxops/code"
    answer = run_node(connector.connect(host), mac_sandbox.python, code,
                      protocol.sample_args())
    assert answer.system == "Darwin"
    assert answer.memory_total == int(MAC["hw.memsize"])
    assert answer.memory_used == vm_stat_used((RECORDED / "vm_stat.txt").read_text())
    assert answer.gpu == ioreg_gpu((RECORDED / "ioreg-IOAccelerator.txt").read_text())
    assert answer.gpu.utilization == 2.0


# --- helpers -------------------------------------------------------------------------------


def _task(proc: subprocess.CompletedProcess, name: str) -> dict:
    """``provision --json``: {host: result} of one task."""
    import json

    doc = json.loads(proc.stdout)
    task = next(t for t in doc["tasks"] if t["task"] == name)
    return task["hosts"]


def _results(proc: subprocess.CompletedProcess) -> list[dict]:
    import json

    return json.loads(proc.stdout)["results"]


MAC_HOSTS = "node1,node2"


def _write_job(tmp_path: Path, inventory: Path, name: str, *, steps: int,
               backend: str = "ring", env: dict[str, str] | None = None) -> Path:
    """``env``: the job's ``env:`` (a :class:`Hold`'s, for a test that acts on the job
    while it runs)."""
    trainer = {
        "model": {"dims": 32, "layers": 1, "heads": 2, "vocab_size": 256, "seq_len": 32},
        "data": {"source": "synthetic", "seed": 0},
        "train": {"steps": steps, "global_batch": 4, "micro_batch": 2, "lr": 3e-3,
                  "checkpoint_every": 10, "keep": 2, "log_every": 1},
    }
    job = {"name": name, "inventory": str(inventory), "hosts": MAC_HOSTS,
           "backend": backend, "trainer": trainer,
           # the watchdog looks twice a second (the selftest's pace), not every 2 s as a
           # 120 s stall timeout would have it: the tests wait on what it sees
           "restart": {"max_restarts": 2, "stall_timeout": 120, "poll_interval": 0.5}}
    if env:
        job["env"] = env
    path = tmp_path / f"{name}.yml"
    path.write_text(yaml.safe_dump(job))
    return path


def _trainer_pid(sandbox, name: str, rank: int, node: str) -> int:
    pgid = int((run_dir(sandbox, node, name) / f"rank-{rank}.pid").read_text())
    children = subprocess.run(["pgrep", "-P", str(pgid)], capture_output=True, text=True)
    return int(children.stdout.split()[0])


def _job_processes(name: str) -> list[str]:
    deadline = time.monotonic() + 5
    while True:
        out = subprocess.run(["pgrep", "-af", f"/runs/{name}/"], capture_output=True,
                             text=True).stdout
        found = [line for line in out.splitlines() if "pgrep" not in line]
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(0.2)

"""A rank that does not go away when killed (a wedged GPU on a Mac), on the sandbox: node4's
rank processes alone frozen with the cgroup freezer (v1: a frozen process cannot be killed
until thawed; its sshd still answers, as a Mac whose GPU is wedged does).

The other ranks stall in their all-reduce, the watchdog stops every rank, node4's survives
SIGKILL: node4 is recorded as needing a reboot (record, status, a ``needs_reboot`` event),
the job goes on without it on the three others, and is never placed there again. Once
thawed, the process is reaped (the host is kept as a stray until then).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest
import yaml
from job_helpers import BackgroundWatchdog, wait_for_step

from mlxops import events as job_events
from mlxops.jobs import watch
from mlxops.jobs.launch import launch
from mlxops.jobs.record import load_record
from mlxops.jobs.spec import load_job
from mlxops.jobs.status import job_status
from mlxops.jobs.stop import stop_job
from mlxops.sandbox import freezer
from mlxops.transport import ConnectOptions, Connector

NODES = ["node1", "node2", "node3", "node4"]
NAME = "t-wedged"
GROUP = "mlxops-test-wedged"
TRAINER = {
    "model": {"dims": 32, "layers": 1, "heads": 2, "vocab_size": 256, "seq_len": 32},
    "data": {"source": "synthetic", "seed": 0},
    "train": {"steps": 100_000, "global_batch": 12, "micro_batch": 1, "lr": 3e-3,
              "checkpoint_every": 5, "keep": 3, "log_every": 1},
}


def group_members(pid: int) -> list[int]:
    """Every process of ``pid``'s process group (the rank and what it forked)."""
    pgid = os.getpgid(pid)
    out = subprocess.run(["ps", "-e", "-o", "pid=,pgid="], capture_output=True, text=True)
    return [int(p) for p, g in (line.split() for line in out.stdout.splitlines())
            if int(g) == pgid]


def wait_until(what: str, ready, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        assert time.monotonic() < deadline, f"not {what} after {timeout}s"
        time.sleep(0.3)


def test_a_rank_that_survives_sigkill_marks_its_node_needs_reboot_and_the_job_goes_on(
        sandbox_mut, tmp_path, monkeypatch):
    if freezer.usable() is not None or not freezer.V1.exists():
        pytest.skip("needs cgroup v1's freezer (a frozen process ignores SIGKILL there)")
    monkeypatch.setattr(watch, "STRAY_RETRY", 2.0)
    job = {"name": NAME, "inventory": str(sandbox_mut.inventory_path),
           "hosts": ",".join(NODES), "backend": "ring", "trainer": TRAINER, "stop_grace": 1,
           "restart": {"max_restarts": 2, "stall_timeout": 6}}
    path = tmp_path / f"{NAME}.yml"
    path.write_text(yaml.safe_dump(job))
    frozen: list[int] = []
    with Connector(ConnectOptions(connect_timeout=2)) as connector:
        record = launch(load_job(path), connector)
        watchdog = BackgroundWatchdog(record, connector)
        try:
            wait_for_step(record, connector, 3)
            rank = next(r for r in job_status(record, connector).ranks if r.host == "node4")
            frozen = group_members(rank.pid)
            freezer.freeze(GROUP, frozen)
            wait_until("node4 marked needs reboot",
                       lambda: load_record(NAME).needs_reboot == ["node4"], 120)
            wait_until("restarted on the other three",
                       lambda: load_record(NAME).world_size == 3, 120)
            resumed = load_record(NAME)
            assert "node4" in resumed.excluded
            assert "node4" not in {r.host for r in resumed.ranks}
            status = job_status(resumed, connector)
            assert status.to_dict()["needs_reboot"] == ["node4"]
            wait_for_step(resumed, connector, (status.step or 0) + 3, timeout=120)  # goes on
            assert all(os.path.exists(f"/proc/{pid}") for pid in frozen)  # SIGKILL pending
        finally:
            freezer.thaw(GROUP)
            for pid in frozen:  # the pending SIGKILL takes it once thawed; make sure
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        wait_until("node4 forgotten as a stray once its rank went",
                   lambda: load_record(NAME).stray == [], 60)
        stopped = stop_job(load_record(NAME), connector)
        final = watchdog.result(timeout=60)
    assert stopped.exit_code == 0, {h: r.message for h, r in stopped.items()}
    assert final.state == "stopped", (final.to_dict(), watchdog.events)
    said = [e for e in job_events.read(NAME) if e.kind == job_events.NEEDS_REBOOT]
    assert len(said) == 1 and "node4 needs reboot" in said[0].message, said
    assert any("node4 needs reboot" in e for e in watchdog.events), watchdog.events
    assert load_record(NAME).needs_reboot == ["node4"]  # kept: a reboot is the user's
    assert load_record(NAME).world_size == 3

"""A Mac that falls asleep mid-run, on the sandbox: every process of node4 frozen with the
cgroup freezer (its sshd and its rank too; ``mlxops sandbox sleep``), so its connections
stay open and answer nothing, then thawed.

Events, in order: node4's watch channel goes quiet and it is asked again (never counted as
a death), the other ranks stall, the watchdog restarts without node4 at the same global
batch, node4 wakes, the watchdog kills the rank it still ran; nothing written is damaged.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import yaml
from job_helpers import BackgroundWatchdog, run_dir, wait_for_step

from mlxops.jobs import watch
from mlxops.jobs.launch import launch
from mlxops.jobs.record import load_record
from mlxops.jobs.spec import load_job
from mlxops.jobs.status import job_status
from mlxops.jobs.stop import stop_job
from mlxops.node import protocol
from mlxops.node.protocol.metrics import read_line
from mlxops.transport import ConnectOptions, Connector

NODES = ["node1", "node2", "node3", "node4"]
TRAINER = {
    "model": {"dims": 32, "layers": 1, "heads": 2, "vocab_size": 256, "seq_len": 32},
    "data": {"source": "synthetic", "seed": 0},
    "train": {"steps": 100_000, "global_batch": 12, "micro_batch": 1, "lr": 3e-3,
              "checkpoint_every": 5, "keep": 3, "log_every": 1},
}


def job_processes(name: str) -> list[str]:
    out = subprocess.run(["pgrep", "-af", f"/runs/{name}/"], capture_output=True, text=True)
    return [line for line in out.stdout.splitlines() if "pgrep" not in line]


def wait_until(what: str, ready, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        assert time.monotonic() < deadline, f"not {what} after {timeout}s"
        time.sleep(0.3)


def test_a_mac_falling_asleep_is_left_behind_and_its_rank_killed_when_it_wakes(
        sandbox_mut, tmp_path, monkeypatch):
    sandbox = sandbox_mut
    monkeypatch.setattr(watch, "STRAY_RETRY", 2.0)  # look for node4's return every 2 s
    job = {"name": "t-sleep", "inventory": str(sandbox.inventory_path),
           "hosts": ",".join(NODES), "backend": "ring", "trainer": TRAINER,
           "restart": {"max_restarts": 1, "stall_timeout": 6, "exclude_unreachable": True}}
    path = tmp_path / "t-sleep.yml"
    path.write_text(yaml.safe_dump(job))
    with Connector(ConnectOptions(connect_timeout=2)) as connector:
        record = launch(load_job(path), connector)
        watchdog = BackgroundWatchdog(record, connector)
        events = watchdog.events
        wait_for_step(record, connector, 7)
        sandbox.sleep_node("node4")
        slept = time.monotonic()
        try:
            # Without node4, from the newest checkpoint the others share.
            wait_until("restarted without node4, remembered as stray",
                       lambda: [h.name for h in load_record("t-sleep").stray] == ["node4"], 120)
            resumed = load_record("t-sleep")
            assert resumed.world_size == 3 and resumed.excluded == ["node4"]
            now = job_status(resumed, connector).step or 0
            wait_for_step(resumed, connector, now + 3, timeout=120)  # it goes on
        finally:
            sandbox.wake_node("node4")
        wait_until("node4's rank stopped",
                   lambda: any("node4 is back" in e for e in events), 120)
        stopped = stop_job(load_record("t-sleep"), connector)
        final = watchdog.result(timeout=60)
    assert stopped.exit_code == 0, {h: r.message for h, r in stopped.items()}
    assert final.state == "stopped", (final.to_dict(), events)

    # The order of what the watchdog saw: the channel went quiet (asked again, not a
    # death), then a stall, then the restart without node4, then node4 back.
    first = {key: next(i for i, e in enumerate(events) if key in e) for key in (
        "node4: watch channel lost", "restarting (", "continuing without node4",
        "node4 is back")}
    assert list(first) == sorted(first, key=first.get), events
    found = watchdog.times[first["restarting ("]] - slept
    print(f"node4 asleep -> the watchdog restarting: {found:.1f} s (stall_timeout 6 s)")
    reason = load_record("t-sleep").restarts[0].reason
    assert "stalled" in reason and "exited" not in reason and "vanished" not in reason, reason
    assert len(load_record("t-sleep").restarts) == 1
    assert load_record("t-sleep").stray == []
    assert job_processes("t-sleep") == []

    # The same global batch on 3 ranks.
    config = json.loads((run_dir(sandbox, "node1", "t-sleep") / "trainer.json").read_text())
    assert config["train"]["global_batch"] == 12
    # Nothing damaged: every checkpoint on every node complete, `latest` names one, and
    # every line of rank 0's metrics readable.
    for node in NODES:
        ckpt = run_dir(sandbox, node, "t-sleep") / protocol.CKPT_DIR
        steps = [d for d in ckpt.iterdir() if protocol.checkpoint_step(d.name) is not None]
        assert steps and all(protocol.checkpoint_complete(d) for d in steps), (node, steps)
        latest = (ckpt / protocol.LATEST).read_text().strip()
        assert protocol.checkpoint_complete(ckpt / latest), (node, latest)
    metrics = (run_dir(sandbox, "node1", "t-sleep") / protocol.METRICS).read_text()
    assert all(read_line(line) is not None for line in metrics.splitlines())
    assert Path(run_dir(sandbox, "node4", "t-sleep")).is_dir()

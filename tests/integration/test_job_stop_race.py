"""`mlxops stop` while the watchdog is restarting the job: the stop wins.

The watchdog and `mlxops stop` both write the job's record. A rank is killed (kill -9), the
watchdog begins its restart, and the user's `mlxops stop` (the real command, in another
process) lands at a chosen point of that restart: the window is made deterministic by
running the stop from inside the watchdog's own steps.

* ``before-start``: right after the watchdog stopped the old ranks, before it starts the
  new attempt: it must see the stop and start nothing.
* ``while-starting``: after the watchdog decided to go on and before its new ranks start
  (they start after the user's stop has looked at the nodes): it must stop them itself.

Either way: the job stays stopped, nothing of it runs on any node, its ports are free, and
the watchdog does not restart it afterwards.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
from job_helpers import BackgroundWatchdog, Hold
from test_jobs import HOSTS, job_processes, trainer_pid, wait_for_step, write_job

from mlxops.jobs import watch
from mlxops.jobs.launch import launch
from mlxops.jobs.record import load_record
from mlxops.jobs.spec import load_job
from mlxops.jobs.stop import stop_job


def user_stop(name: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mlxops", "stop", name], capture_output=True,
                          text=True, timeout=180, env=dict(os.environ))


@pytest.mark.parametrize("when", ["before-start", "while-starting"])
def test_stop_during_a_restart_stays_stopped(sandbox, tmp_path, connector, monkeypatch, when):
    name = f"t-race-{when}"
    stops: list[subprocess.CompletedProcess] = []

    real_stop, real_launch = watch.stop_job, watch.launch

    def watchdog_stop(record, connector, **kwargs):
        results = real_stop(record, connector, **kwargs)
        if when == "before-start" and not stops:
            stops.append(user_stop(name))  # the old ranks are stopped; nothing new yet
        return results

    def watchdog_launch(spec, connector, **kwargs):
        if when == "while-starting" and not stops:
            stops.append(user_stop(name))  # the new ranks start after the stop looked
        return real_launch(spec, connector, **kwargs)

    monkeypatch.setattr(watch, "stop_job", watchdog_stop)
    monkeypatch.setattr(watch, "launch", watchdog_launch)

    hold = Hold(sandbox, name, HOSTS, at=12)  # the kill lands mid-run, however fast
    spec = load_job(write_job(tmp_path, sandbox, name, steps=400, env=hold.env,
                              restart={"max_restarts": 3, "stall_timeout": 30}))
    record = launch(spec, connector)
    watchdog = BackgroundWatchdog(record, connector)
    with hold:
        wait_for_step(record, connector, 12)
        os.kill(trainer_pid(sandbox, name, 2, "node3"), signal.SIGKILL)

    final = watchdog.result(timeout=240)
    events = watchdog.events
    assert len(stops) == 1, events
    assert stops[0].returncode == 0, stops[0].stdout + stops[0].stderr
    assert final.state == "stopped", (final.to_dict(), events)
    assert any("not restarting" in e for e in events), events
    # Before the start, nothing was started; while starting, the watchdog stopped its own.
    started = any("stopping them again" in e for e in events)
    assert started == (when == "while-starting"), events

    now = load_record(name)
    assert now.state == "stopped" and now.attempt == 1, now
    assert job_processes(name) == []
    # Nothing alive and every ring port free, on every node (stop verifies both).
    check = stop_job(load_record(name), connector)
    assert check.exit_code == 0, {h: r.message for h, r in check.items()}
    assert all(not r.data.get("signalled") for r in check.values()), \
        {h: r.data for h, r in check.items()}
    # And nothing restarts it later: the watchdog has ended, nothing came back (a spawn
    # still under way would have its ranks up well within a second).
    time.sleep(1)
    assert job_processes(name) == []
    assert load_record(name).state == "stopped"

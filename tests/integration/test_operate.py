"""Issue 22 end to end on a real run (inventory of this machine, local connection, 2 ranks):
kill -9 of a rank, the watchdog's restart, the timeline, the notifications to a real
webhook and a real command (the webhook hanging all the while, which delays no restart),
and Debian's ``prometheus`` scraping ``mlxops dashboard --metrics-only`` and answering a
query with the values the run wrote."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import yaml

from mlxops.devtools.webhook import Receiver
from mlxops.sandbox.kernels import link_root_cache

ROOT = Path(__file__).resolve().parents[2]
NAME = "operated"
STEPS = 60
PROMETHEUS = shutil.which("prometheus")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(check, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        time.sleep(0.3)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture
def run(tmp_path):
    home, node_root = tmp_path / "home", tmp_path / "node"
    inventory = tmp_path / "local.yml"
    inventory.write_text(yaml.safe_dump({"all": {"hosts": {"localhost": {
        "ansible_connection": "local", "mlxops_slots": 2, "mlxops_root": str(node_root)}}}}))
    env = {**os.environ, "MLXOPS_HOME": str(home)}
    if os.geteuid() == 0:
        link_root_cache(node_root, pwd.getpwuid(0))  # as test_local_job: warm kernels

    def mlxops(*args: str, **kw) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "mlxops", *args], capture_output=True,
                              text=True, env=env, cwd=ROOT, timeout=120,
                              stdin=subprocess.DEVNULL, **kw)

    return tmp_path, inventory, env, node_root, mlxops


def test_a_killed_rank_is_restarted_on_the_timeline_notified_once_and_scraped(run):
    tmp_path, inventory, env, node_root, mlxops = run
    hook = Receiver(hang=True)
    heard = tmp_path / "heard.txt"
    command = [sys.executable, "-c", "import os, sys; open(sys.argv[1], 'a').write("
               "os.environ['MLXOPS_EVENT_KIND'] + '\\n')", str(heard)]
    # The ranks wait after step 12 while this file says 12 (the trainer's test hook,
    # docs/trainer.md "Environment"): rank 1 is killed mid-run however fast the machine is.
    hold = tmp_path / "hold"
    hold.write_text("12\n")
    job = tmp_path / "job.yml"
    job.write_text(yaml.safe_dump({
        "name": NAME, "inventory": str(inventory), "backend": "ring",
        "trainer": {"model": {"dims": 32, "layers": 1, "heads": 2, "seq_len": 32},
                    "train": {"steps": STEPS, "global_batch": 4, "micro_batch": 2,
                              "checkpoint_every": 10, "log_every": 1}},
        "env": {"MLXOPS_TRAINER_HOLD": str(hold)},
        "restart": {"max_restarts": 1, "stall_timeout": 120},
        "notify": {"webhook": hook.url, "command": command, "timeout": 120,
                   "events": ["started", "restarted", "finished"]}}))
    timeline_file = tmp_path / "home" / "jobs" / NAME / "events.jsonl"
    released: list[float] = []

    def release_once_finished() -> None:
        # The webhook hangs until the run is over; then it answers, and the watchdog's
        # notifier (which delivers what is pending as it ends) sends the rest.
        while not hook.release.is_set():
            if timeline_file.exists() and '"kind":"finished"' in timeline_file.read_text():
                released.append(time.time())
                hook.release.set()
            time.sleep(0.1)

    threading.Thread(target=release_once_finished, daemon=True).start()
    launch = subprocess.Popen([sys.executable, "-m", "mlxops", "launch", str(job)], env=env,
                              cwd=ROOT, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
    try:
        def rank1_past_step_12():
            # Read on the node's side (the node is this machine): quicker than a status.
            progress = node_root / "runs" / NAME / "progress"
            try:
                steps = [json.loads((progress / f"rank-{r}.json").read_text())["step"]
                         for r in (0, 1)]
            except (OSError, ValueError, KeyError):
                return None
            if None in steps or min(steps) < 12:   # starting (no step yet), or before 12
                return None
            # The rank's process group leader runs the trainer as its child (as
            # tests/integration/test_jobs.py kills one).
            leader = (node_root / "runs" / NAME / "rank-1.pid").read_text().strip()
            child = subprocess.run(["pgrep", "-P", leader], capture_output=True, text=True)
            return int(child.stdout.split()[0]) if child.stdout.split() else None

        os.kill(wait_until(rank1_past_step_12, 180, "step 12"), signal.SIGKILL)
        hold.unlink()  # the restart runs to the end
        out, _ = launch.communicate(timeout=300)
    finally:
        if launch.poll() is None:
            launch.kill()
        hook.close()
    assert launch.returncode == 0, out[-3000:]
    timeline = json.loads(mlxops("events", NAME, "--json").stdout)["events"]
    # Alerts are left out: whether a step is slow or a heartbeat late depends on the
    # machine's load (a CI run put a heartbeat alert between started and restarted).
    kinds = [e["kind"] for e in timeline
             if e["kind"] not in ("notified", "notify_failed", "alert")]
    assert kinds == ["started", "restarted", "finished"], timeline
    restarted = next(e for e in timeline if e["kind"] == "restarted")
    assert "rank 1 on localhost" in restarted["message"] and restarted["attempt"] == 1
    # The webhook held its first request (started) through the kill, the restart and the
    # end of the run: the watchdog never waited for it.
    first_post = hook.bodies[0][0]
    finished = next(e for e in timeline if e["kind"] == "finished")
    assert hook.bodies[0][1]["kind"] == "started"
    assert first_post < restarted["time"] < finished["time"] <= released[0]
    # Each event reached each target once (the webhook's after its release, as the
    # watchdog ended: its notifier delivers what is pending).
    assert sorted(hook.kinds()) == ["finished", "restarted", "started"]
    assert heard.read_text().split() == ["started", "restarted", "finished"]
    sent = sorted((e["detail"]["event_kind"], e["detail"]["target"]) for e in timeline
                  if e["kind"] == "notified")
    assert sent == sorted((k, t) for k in ("started", "restarted", "finished")
                          for t in ("command", "webhook"))
    scrape_with_prometheus(tmp_path, env, node_root)


def scrape_with_prometheus(tmp_path: Path, env: dict, node_root: Path) -> None:
    if PROMETHEUS is None:
        pytest.skip("no prometheus binary (make test installs Debian's package when root)")
    lines = [json.loads(line) for line in
             (node_root / "runs" / NAME / "metrics.jsonl").read_text().splitlines()]
    port, prom_port = free_port(), free_port()
    dashboard = subprocess.Popen([sys.executable, "-m", "mlxops", "dashboard", "--offline",
                                  "--metrics-only", "--port", str(port)], env=env, cwd=ROOT,
                                 stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL)
    config = tmp_path / "prometheus.yml"
    config.write_text(yaml.safe_dump({
        "global": {"scrape_interval": "1s"},
        "scrape_configs": [{"job_name": "mlxops",
                            "static_configs": [{"targets": [f"127.0.0.1:{port}"]}]}]}))
    prometheus = subprocess.Popen([PROMETHEUS, f"--config.file={config}",
                                   f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                                   f"--web.listen-address=127.0.0.1:{prom_port}"],
                                  stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL)

    def query(expr: str) -> float | None:
        url = (f"http://127.0.0.1:{prom_port}/api/v1/query?"
               + urllib.parse.urlencode({"query": expr}))
        try:
            with urllib.request.urlopen(url, timeout=5) as answer:
                result = json.load(answer)["data"]["result"]
        except OSError:
            return None
        return float(result[0]["value"][1]) if result else None

    try:
        step = wait_until(lambda: query(f'mlxops_job_step{{job_name="{NAME}"}}'), 90,
                          "prometheus to scrape the run")
        assert step == STEPS == lines[-1]["step"]
        assert query(f'mlxops_job_loss{{job_name="{NAME}"}}') == pytest.approx(lines[-1]["loss"])
        assert query(f'mlxops_job_restarts_total{{job_name="{NAME}"}}') == 1
        assert query(f'mlxops_job_state{{job_name="{NAME}",state="finished"}}') == 1
        assert query(f'mlxops_job_events_total{{job_name="{NAME}",kind="restarted"}}') == 1
        assert query(f'count(mlxops_rank_step{{job_name="{NAME}"}})') == 2
    finally:
        for proc in (prometheus, dashboard):
            proc.send_signal(signal.SIGTERM)
        for proc in (prometheus, dashboard):
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()

"""Monitoring end to end: the report in headless Chromium with no network at all, the
dashboard page requesting nothing outside its origin, and on sandbox nodes a running job
in the dashboard (its curve growing, a restart marker after a rank is killed, a
screenshot) and in ``mlxops monitor`` inside a real terminal (tmux), on bash and on zsh
login shells (``login_sandbox``), its samples of every node in the mirror.

Chromium is Debian's ``chromium`` and tmux Debian's ``tmux`` (``make test`` installs both as
root); without them these tests skip, saying so.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import replace
from pathlib import Path

import pytest
from job_helpers import BackgroundWatchdog
from test_jobs import trainer_pid, wait_for_step, write_job

from mlxops import events
from mlxops.jobs.launch import launch
from mlxops.jobs.record import load_record
from mlxops.jobs.spec import load_job
from mlxops.jobs.status import job_status
from mlxops.jobs.stop import stop_job
from mlxops.monitor import files

ROOT = Path(__file__).resolve().parents[2]
RECORDED = ROOT / "tests" / "unit" / "data" / "monitor"
CHROMIUM = next((p for p in map(shutil.which, ("chromium", "chromium-browser")) if p), None)
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None, reason="headless Chromium is not installed (Debian: apt-get install "
                             "chromium; `make test` installs it when run as root)")
needs_tmux = pytest.mark.skipif(
    shutil.which("tmux") is None, reason="tmux is not installed (Debian: apt-get install "
                                         "tmux; `make test` installs it when run as root)")
HOSTS = "node1,node2,node3"


def chromium(url: str, *flags: str, offline: bool = False, timeout: float = 90) -> str:
    """Headless Chromium on ``url`` (its own throwaway profile); its stdout. ``offline``:
    in a network namespace of its own, with no interface up (root only)."""
    profile = tempfile.mkdtemp(prefix="mlxops-chromium-")
    argv = [CHROMIUM, "--headless", "--disable-gpu", "--no-first-run",
            "--disable-background-networking", "--disable-component-update",
            "--hide-scrollbars", f"--user-data-dir={profile}", *flags, url]
    if os.geteuid() == 0:
        argv.insert(1, "--no-sandbox")   # Chromium's own sandbox refuses to run as root
    if offline:
        argv = ["unshare", "--net", *argv]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    finally:
        shutil.rmtree(profile, ignore_errors=True)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def charts(dom: str) -> dict[str, int]:
    """``{chart: points drawn}`` of every chart in a dumped DOM."""
    return {m.group(1): int(m.group(2)) for m in re.finditer(
        r'<svg[^>]*data-chart="([\w-]+)"[^>]*data-points="(\d+)"', dom)}


def loss_chart(dom: str) -> str:
    match = re.search(r'<svg[^>]*data-chart="loss".*?</svg>', dom, re.S)
    return match.group(0) if match else ""


@pytest.fixture
def recorded(tmp_path):
    """The recorded finished run as this controller's job (MLXOPS_HOME is the test's)."""
    shutil.copytree(RECORDED / "finished", Path(os.environ["MLXOPS_HOME"]) / "jobs")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Dashboard:
    """``mlxops dashboard`` in a subprocess, as a user starts it."""

    def __init__(self, *args: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "mlxops", "dashboard", "--port", str(self.port), *args],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            env={**os.environ, "PYTHONPATH": str(ROOT)})
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(self.url + "api/jobs", timeout=5).read()
                return
            except OSError:
                assert self.proc.poll() is None, self.proc.stdout.read()
                assert time.monotonic() < deadline, "the dashboard did not start"
                time.sleep(0.2)

    def close(self) -> str:
        self.proc.send_signal(signal.SIGINT)
        try:
            out, _ = self.proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            out, _ = self.proc.communicate()
        return out


def recorded_timeline() -> None:
    """Events on the recorded run's timeline, at the times of its own metrics lines."""
    lines = [json.loads(line) for line in (RECORDED / "finished" / "tiny-lm" / "metrics.jsonl")
             .read_text().splitlines()]
    at = {line["step"]: line["time"] for line in lines}
    events.start_run(events.make("tiny-lm", events.STARTED, "3 ranks on 1 host(s)",
                                 now=at[5] - 2, attempt=1))
    events.record("tiny-lm", events.ALERT, "localhost: memory 3% in use (alert at 2%)",
                  now=at[100] + 0.1, attempt=1, alert="memory_share", host="localhost")
    events.record("tiny-lm", events.STALLED, "rank 2 on localhost: no progress for 21s",
                  now=at[150] + 0.2, attempt=1, ranks=[2], step=150)
    events.record("tiny-lm", events.FINISHED, "every rank finished (step 300)",
                  now=at[300] + 0.5, attempt=2, step=300)


@needs_chromium
def test_the_report_opens_offline_with_its_plots_drawn(recorded, tmp_path):
    recorded_timeline()
    target = tmp_path / "report.html"
    done = subprocess.run([sys.executable, "-m", "mlxops", "report", "tiny-lm", "-o",
                           str(target)], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr
    dom = chromium(target.as_uri(), "--dump-dom", offline=os.geteuid() == 0)
    assert re.search(r'<body[^>]*data-drawn="5"', dom), dom[:2000]
    drawn = charts(dom)
    assert drawn == {"loss": 60, "tokens": 60, "split": 120, "rank-tokens": 21, "memory": 8}
    assert loss_chart(dom).count('class="restart-marker"') == 1
    # The timeline's alert and stall are marked on the curves, every event is listed.
    assert re.findall(r'class="event-marker event-(\w+)"', loss_chart(dom)) == [
        "alert", "stalled"]
    assert dom.count('<li class="event-') == 4
    assert "rank 2 on localhost: no progress for 21s" in dom
    assert "Config (as launched)" in dom and '"global_batch": 24' in dom
    assert "attempt 1 ended after step 150" in dom
    shot = tmp_path / "report.png"
    chromium(target.as_uri(), f"--screenshot={shot}", "--window-size=1400,2600",
             offline=os.geteuid() == 0)
    print(f"report screenshot: {shot}")


def split_chart(dom: str) -> str:
    match = re.search(r'<svg[^>]*data-chart="split".*?</svg>', dom, re.S)
    return match.group(0) if match else ""


@needs_chromium
def test_the_first_step_is_kept_out_of_the_split_charts_scale_and_marked(tmp_path):
    """The recorded run with a first line as a cold Mac logs it (log_every 1: step 1's
    compute 6,000 ms while MLX compiles its kernels, as the issue's demo showed; the
    recorded run itself logs every 5 steps, so its first line is already warm): the
    compute/all-reduce chart scales to the steps after it, and marks it at its edge."""
    home = Path(os.environ["MLXOPS_HOME"]) / "jobs"
    shutil.copytree(RECORDED / "finished", home)
    metrics = home / "tiny-lm" / "metrics.jsonl"
    lines = metrics.read_text().splitlines()
    first = json.loads(lines[0])
    first.update(step=1, time=first["time"] - 7, compute_time=6.0, comm_time=0.25,
                 step_time=6.25)
    metrics.write_text("\n".join([json.dumps(first), *lines]) + "\n")
    target = tmp_path / "report.html"
    done = subprocess.run([sys.executable, "-m", "mlxops", "report", "tiny-lm", "-o",
                           str(target)], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr
    dom = chromium(target.as_uri(), "--dump-dom", offline=os.geteuid() == 0)
    chart = split_chart(dom)
    assert charts(dom)["split"] == 2 * 61               # the first step drawn, not hidden
    top = float(re.search(r'data-y-max="([\d.]+)"', chart).group(1))
    warm = max(json.loads(line)["comm_time"] for line in lines) * 1e3
    assert warm < top < 1.1 * warm, (top, warm)         # the scale of the steps after it
    assert re.search(r'data-first="6000"', chart), chart[:500]
    assert "first step: compiling, 6,000 ms" in chart
    assert chart.count('class="first-step-point"') == 2  # compute and all-reduce, marked
    shot = tmp_path / "first-step.png"
    chromium(target.as_uri(), f"--screenshot={shot}", "--window-size=1400,2600",
             offline=os.geteuid() == 0)
    print(f"report screenshot: {shot}")


@needs_chromium
def test_validation_is_the_loss_charts_second_curve_in_report_and_dashboard(tmp_path):
    """A recorded run with train.eval_every: its 6 validation losses drawn beside the
    training loss, in the report and in the dashboard (the same view.js)."""
    shutil.copytree(RECORDED / "validation", Path(os.environ["MLXOPS_HOME"]) / "jobs")
    target = tmp_path / "report.html"
    done = subprocess.run([sys.executable, "-m", "mlxops", "report", "tiny-val", "-o",
                           str(target)], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr
    dashboard = Dashboard("--offline")
    try:
        pages = [chromium(target.as_uri(), "--dump-dom", offline=os.geteuid() == 0),
                 chromium(dashboard.url + "#job=tiny-val", "--virtual-time-budget=5000",
                          "--dump-dom")]
    finally:
        dashboard.close()
    for dom in pages:
        chart = loss_chart(dom)
        assert charts(dom)["loss"] == 24 + 6      # every training line, every evaluation
        assert re.search(r'<path d="M[^"]*" class="series s3" data-name="validation"',
                         chart), chart[:3000]
        assert "validation loss" in dom and "1.0320 (best 1.0320 at step 120)" in dom


@needs_chromium
def test_the_dashboard_page_requests_nothing_outside_its_origin(recorded, tmp_path):
    dashboard = Dashboard("--offline")
    try:
        netlog = tmp_path / "netlog.json"
        dom = chromium(dashboard.url, "--virtual-time-budget=5000", f"--log-net-log={netlog}",
                       "--dump-dom")
        # What makes the browser refuse anything from elsewhere, had the page asked:
        csp = urllib.request.urlopen(dashboard.url).headers["Content-Security-Policy"]
    finally:
        dashboard.close()
    assert csp.startswith("default-src 'self'")
    assert charts(dom)["loss"] == 60 and 'class="restart-marker"' in loss_chart(dom)
    log = json.loads(netlog.read_text())
    kinds = {v: k for k, v in log["constants"]["logEventTypes"].items()}
    origin = dashboard.url.rstrip("/")
    site = "http://127.0.0.1"
    # Every request made for the page (its network isolation key is the page's site, or
    # the page started it) went to the page's own origin. The browser's own requests (its
    # updater, spelling dictionary) are not the page's: they carry other keys.
    starts = [e.get("params", {}) for e in log["events"]
              if kinds.get(e["type"]) == "URL_REQUEST_START_JOB"]
    page = [p["url"] for p in starts if "url" in p and (
        p.get("initiator") == origin or p.get("network_isolation_key", "").startswith(site))]
    assert {u.split("?")[0] for u in page} >= {
        f"{origin}/", f"{origin}/static/app.js", f"{origin}/static/chart.js",
        f"{origin}/static/view.js", f"{origin}/static/app.css", f"{origin}/api/jobs",
        f"{origin}/api/job/tiny-lm"}
    assert all(u.startswith(origin + "/") for u in page), page


#: A job these tests watch grow: it never ends on its own while they look (they stop it),
#: however fast the machine; 300-400 steps raced the looks (a Chromium start is seconds).
ENDLESS = 100_000


def three_node_job(tmp_path: Path, sandbox, name: str, steps: int):
    """A small trainer job on node1..node3 (3 ranks: a light load on 2 cores)."""
    spec = load_job(write_job(tmp_path, sandbox, name, steps=steps, global_batch=6))
    return replace(spec, hosts=HOSTS)


def mirrored_step(name: str) -> int:
    """The last step in the job's metrics mirror (what the dashboard draws); 0 before any."""
    try:
        lines = files.path(name, files.METRICS).read_text().splitlines()
    except FileNotFoundError:
        return 0
    steps = [0]
    for line in lines:
        try:
            steps.append(json.loads(line)["step"])
        except ValueError:   # a line being appended as we read
            pass
    return max(steps)


def wait_for_mirrored_step(name: str, step: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while mirrored_step(name) < step:
        assert time.monotonic() < deadline, f"the mirror of {name} never reached step {step}"
        time.sleep(0.2)


def look(dashboard: Dashboard, *flags: str) -> str:
    return chromium(dashboard.url + "#job=t-dash", "--virtual-time-budget=5000", *flags,
                    "--dump-dom")


@needs_chromium
def test_a_running_job_in_the_dashboard_grows_and_marks_its_restart(sandbox, tmp_path,
                                                                    connector):
    record = launch(three_node_job(tmp_path, sandbox, "t-dash", steps=ENDLESS), connector)
    # The watchdog restarts the job and is what feeds its mirror (here every second
    # rather than every 5 s, and at once when a rank dies): the dashboard only reads it
    # (its own looks: a unit test).
    watchdog = BackgroundWatchdog(record, connector, feed_interval=1.0)
    dashboard = Dashboard("--offline")
    try:
        wait_for_step(record, connector, 8)
        # Each look is a Chromium start (seconds on a busy 2-core machine): look once the
        # mirror, which the page draws, has what the look wants to see.
        wait_for_mirrored_step("t-dash", 1)
        first = second = 0
        deadline = time.monotonic() + 60
        while first == 0:
            first = charts(look(dashboard)).get("loss", 0)
            assert time.monotonic() < deadline, "the loss curve never showed"
        deadline = time.monotonic() + 60
        while second <= first:
            wait_for_mirrored_step("t-dash", mirrored_step("t-dash") + 3)
            second = charts(look(dashboard)).get("loss", 0)
            assert time.monotonic() < deadline, f"the curve stayed at {first} points"

        killed_at = job_status(record, connector).step or 0
        os.kill(trainer_pid(sandbox, "t-dash", 1, "node2"), signal.SIGKILL)
        deadline = time.monotonic() + 120
        while load_record("t-dash").attempt < 2:
            assert time.monotonic() < deadline, watchdog.events
            time.sleep(0.2)
        wait_for_step(load_record("t-dash"), connector, killed_at + 3)
        wait_for_mirrored_step("t-dash", killed_at + 3)
        deadline = time.monotonic() + 60
        while True:
            dom = look(dashboard)
            if 'class="restart-marker"' in loss_chart(dom):
                break
            assert time.monotonic() < deadline, "no restart marker on the loss curve"
            time.sleep(1)
        assert "rank 1 on node2" in dom
        shot = tmp_path / "dashboard.png"
        chromium(dashboard.url + "#job=t-dash", "--virtual-time-budget=5000",
                 f"--screenshot={shot}", "--window-size=1400,1500")
        assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000
        print(f"dashboard screenshot: {shot}")
    finally:
        out = dashboard.close()
        stop_job(load_record("t-dash"), connector)
        watchdog.result(timeout=120)
    assert "ssh -L" in out


def node_samples(name: str) -> list[dict]:
    """The mirror's ``samples.jsonl`` lines' ``nodes`` (what each look found per node)."""
    text = files.path(name, files.SAMPLES).read_text()
    return [json.loads(line)["nodes"] for line in text.splitlines()]


@needs_tmux
def test_the_monitor_follows_a_running_job_in_a_real_terminal(login_sandbox, tmp_path,
                                                              connector):
    sandbox = login_sandbox
    record = launch(three_node_job(tmp_path, sandbox, "t-mon", steps=ENDLESS), connector)
    socket_name = f"mlxops-test-{os.getpid()}"
    tmux = ["tmux", "-L", socket_name]
    command = shlex.join(["env", f"MLXOPS_HOME={os.environ['MLXOPS_HOME']}",
                          f"PYTHONPATH={ROOT}", "TERM=xterm-256color", sys.executable, "-m",
                          "mlxops", "monitor", "t-mon", "--interval", "1"])
    try:
        wait_for_step(record, connector, 5)
        subprocess.run([*tmux, "new-session", "-d", "-s", "mon", "-x", "120", "-y", "40",
                        command], check=True)

        def screen() -> str:
            return subprocess.run([*tmux, "capture-pane", "-p", "-t", "mon"], check=True,
                                  capture_output=True, text=True).stdout

        def step_shown(text: str) -> int:
            found = re.search(rf"t-mon\s+running\s+step (\d+)/{ENDLESS}", text)
            return int(found.group(1)) if found else -1

        deadline = time.monotonic() + 60
        while step_shown(first := screen()) < 0:
            assert time.monotonic() < deadline, first
            time.sleep(0.5)
        for node in HOSTS.split(","):
            assert re.search(rf"^\s+\d\s+{node}\s+running\s+\d+\s+\d\.\d{{4}}", first, re.M), first
        assert "tokens/s" in first and "all-reduce" in first
        deadline = time.monotonic() + 60
        while step_shown(second := screen()) <= step_shown(first):
            assert time.monotonic() < deadline, second
            time.sleep(0.5)
        print(second)
    finally:
        subprocess.run([*tmux, "kill-server"], capture_output=True)
        stop_job(load_record("t-mon"), connector)
    # What the monitor fed the mirror: every look sampled every node of the job.
    looks = node_samples("t-mon")
    assert len(looks) >= 2, looks
    for nodes in looks:
        assert set(nodes) == set(HOSTS.split(",")), nodes
        for node, figures in nodes.items():
            assert "error" not in figures, (node, figures)
            assert 0 < figures["memory_used"] < figures["memory_total"], (node, figures)
            assert figures["cpus"] and len(figures["load"]) == 3, (node, figures)

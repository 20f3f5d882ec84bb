"""Issue 31 end to end: a job supervised by node1, the controller gone (bash and zsh nodes).

``mlxops provision --tags supervisor`` readies node1 (its venv from a wheelhouse of the
controller's own dependency versions, since sandbox nodes have no index; its own key,
authorised on every node); ``mlxops launch --detach`` starts the ranks and node1's
watchdog and returns. With no mlxops process left on the controller, a ``kill -9`` of a
rank on node3 is restarted by node1 (losses bitwise equal to an uninterrupted run), the
restart reaches a webhook (listening on the bridge's controller-side address) once, and
``mlxops status`` shows it afterwards. A ``serve:`` job whose server is killed comes back
with no mlxops process on the controller. A ``stop`` leaves no supervisor and no rank.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import replace
from importlib import metadata
from pathlib import Path

import pytest
import yaml
from job_helpers import Hold, losses, run_dir
from test_serve import served_model, server_pid  # noqa: F401 - the module's fixture

from mlxops.devtools.webhook import Receiver
from mlxops.jobs.launch import launch
from mlxops.jobs.spec import load_job
from mlxops.jobs.watch import supervise
from mlxops.tasks.supervisor import DISTRIBUTIONS
from mlxops.transport import Connector

ROOT = Path(__file__).resolve().parents[2]
HOSTS = "node1,node2,node3"
STEPS = 30
WHEELHOUSE = Path(os.environ.get("MLXOPS_SANDBOX_CACHE", "/var/cache/mlxops-sandbox")) \
    / "wheelhouse-supervisor"
TRAINER = {
    "model": {"dims": 32, "layers": 1, "heads": 2, "vocab_size": 256, "seq_len": 32},
    "data": {"source": "synthetic", "seed": 0},
    "train": {"steps": STEPS, "global_batch": 6, "micro_batch": 2, "lr": 3e-3,
              "checkpoint_every": 10, "keep": 3, "log_every": 1},
}


def wheelhouse() -> Path:
    """The controller's dependency versions as wheels, downloaded once into the sandbox
    cache (the nodes install from it offline, as mlxops_wheelhouse)."""
    pins = [f"{name}=={metadata.version(name)}" for name in DISTRIBUTIONS]
    stamp = WHEELHOUSE / ".pins"
    if stamp.is_file() and stamp.read_text() == "\n".join(pins):
        return WHEELHOUSE
    WHEELHOUSE.mkdir(parents=True, exist_ok=True)
    done = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--only-binary=:all:",
                           "-d", str(WHEELHOUSE), *pins], capture_output=True, text=True,
                          timeout=600)
    if done.returncode:
        pytest.skip(f"no wheelhouse for the supervisor's venv: {done.stderr[-500:]}")
    stamp.write_text("\n".join(pins))
    return WHEELHOUSE


def cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mlxops", *args], capture_output=True,
                          text=True, timeout=timeout, cwd=ROOT, stdin=subprocess.DEVNULL)


def inventory(sandbox, tmp_path: Path) -> Path:
    doc = yaml.safe_load(sandbox.inventory_path.read_text())
    doc["all"]["vars"].update({"mlxops_supervisor": "node1",
                               "mlxops_wheelhouse": str(wheelhouse())})
    path = tmp_path / "inventory.yml"
    path.write_text(yaml.safe_dump(doc))
    return path


def job(tmp_path: Path, inv: Path, name: str, env: dict, notify: dict | None = None) -> Path:
    doc = {"name": name, "inventory": str(inv), "hosts": HOSTS, "backend": "ring",
           "trainer": TRAINER, "env": env,
           "restart": {"max_restarts": 2, "stall_timeout": 60}}
    if notify:
        doc["notify"] = notify
    path = tmp_path / f"{name}.yml"
    path.write_text(yaml.safe_dump(doc))
    return path


def mlxops_processes_here() -> list[str]:
    """mlxops processes of this test's controller: those whose environment has its
    ``MLXOPS_HOME`` (the CLI runs here inherit it; a supervisor on a node has its own; other
    people's mlxops on this machine have theirs), this process left out, and so are the
    sandbox's own helpers (its nodes' mDNS responders run here, from mlxops/sandbox/, and
    inherit the MLXOPS_HOME of the test during whose set-up the session sandbox came up)."""
    home = f"MLXOPS_HOME={os.environ['MLXOPS_HOME']}".encode()
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        command = b" ".join(argv)
        if (int(pid) != os.getpid() and home in environ and b"mlxops" in command
                and b"/mlxops/sandbox/" not in command):
            found.append(command.decode(errors="replace"))
    return found


def supervisor_record(sandbox, name: str) -> dict | None:
    path = Path(sandbox.node_home("node1")) / ".mlxops/supervisor/home/jobs" / name / \
        "record.json"
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def wait_until(check, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


def trainer_pid(sandbox, name: str, rank: int, node: str) -> int:
    pgid = int((run_dir(sandbox, node, name) / f"rank-{rank}.pid").read_text())
    children = subprocess.run(["pgrep", "-P", str(pgid)], capture_output=True, text=True)
    return int(children.stdout.split()[0])


def step_of(sandbox, name: str) -> int:
    steps = []
    for rank, node in enumerate(HOSTS.split(",")):
        progress = run_dir(sandbox, node, name) / "progress" / f"rank-{rank}.json"
        try:
            # A rank's first heartbeat (written as it starts) has no step yet: 0.
            steps.append(json.loads(progress.read_text())["step"] or 0)
        except (OSError, ValueError, KeyError):
            return 0
    return min(steps)


@pytest.fixture(scope="module")
def reference_losses(sandbox, tmp_path_factory) -> dict[int, float]:
    """step -> loss of the same job, uninterrupted and supervised here, made once for the
    module on the bash nodes: the recovered runs on bash and on zsh nodes both compare
    with it (the same trainer, interpreter and mlx compute the same losses whichever shell
    the node user logs in to; each run used to make its own)."""
    tmp = tmp_path_factory.mktemp("sv-reference")
    with pytest.MonkeyPatch.context() as patch, Connector() as connector:
        patch.setenv("MLXOPS_HOME", str(tmp / "home"))
        path = tmp / "inventory.yml"
        path.write_text(sandbox.inventory_path.read_text())
        spec = replace(load_job(job(tmp, path, "sv-reference", {})), supervisor="controller")
        assert supervise(launch(spec, connector), connector).state == "finished"
    return losses(sandbox, "sv-reference")


def test_a_node_supervises_with_the_controller_gone(login_sandbox, tmp_path, connector,
                                                   reference_losses):
    sandbox = login_sandbox
    inv = inventory(sandbox, tmp_path)
    # node1 made ready; a second run changes nothing, --check neither.
    first = cli("provision", str(inv), "--tags", "supervisor", timeout=900)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    again = cli("provision", str(inv), "--tags", "supervisor", "--json", timeout=300)
    assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-2000:]
    assert '"status": "changed"' not in again.stdout, again.stdout[-2000:]
    assert again.stdout.count("node1's key authorised") == len(sandbox.nodes)
    check = cli("provision", str(inv), "--tags", "supervisor", "--check", "--json")
    assert check.returncode == 0 and '"status": "changed"' not in check.stdout

    want = reference_losses

    name = f"sv-{sandbox.login_shell}"
    hook = Receiver(host=sandbox.controller_ip)
    hold = Hold(sandbox, name, HOSTS, at=12)
    try:
        path = job(tmp_path, inv, name, hold.env,
                   {"webhook": hook.url, "events": ["restarted", "finished"]})
        started = cli("launch", str(path), "--detach")
        assert started.returncode == 0, started.stdout + started.stderr
        assert mlxops_processes_here() == []  # the controller's part is over
        wait_until(lambda: step_of(sandbox, name) >= 12, 240, "step 12")
        os.kill(trainer_pid(sandbox, name, 2, "node3"), signal.SIGKILL)
        hold.release()
        ended = wait_until(lambda: (r := supervisor_record(sandbox, name))
                           and r["state"] in ("finished", "failed") and r, 300,
                           "node1's supervisor to see the job end")
        assert ended["state"] == "finished", ended
        assert len(ended["restarts"]) == 1 and "rank 2 on node3" in \
            ended["restarts"][0]["reason"]
        got = losses(sandbox, name)
        assert all(got[s] == want[s] for s in want), \
            [(s, want[s], got.get(s)) for s in want if got.get(s) != want[s]]
        wait_until(lambda: "finished" in hook.kinds(), 60, "the finished notification")
        assert hook.kinds().count("restarted") == 1, hook.kinds()
    finally:
        hold.release()
        hook.close()

    status = cli("status", name, "--json")
    doc = json.loads(status.stdout)
    assert doc["state"] == "finished" and len(doc["restarts"]) == 1, doc
    assert doc["supervisor"]["host"] == "node1" and doc["supervisor"]["running"] is False
    events = json.loads(cli("events", name, "--json").stdout)["events"]
    assert [e["kind"] for e in events if e["kind"] in ("started", "restarted", "finished")] \
        == ["started", "restarted", "finished"], events


def test_stop_leaves_no_supervisor_and_no_rank_and_resume_restarts_both(sandbox, tmp_path):
    """On bash nodes only: the issue asks both shells of the supervised recovery above,
    whose zsh case starts the supervisor under zsh; this one's zsh case cost ~50 s."""
    inv = inventory(sandbox, tmp_path)
    done = cli("provision", str(inv), "--tags", "supervisor", timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    name = f"sv-stop-{sandbox.login_shell}"

    def left() -> list[str]:
        ps = subprocess.run(["pgrep", "-af", f"mlxops watch {name}|/runs/{name}/"],
                            capture_output=True, text=True).stdout
        return [line for line in ps.splitlines() if "pgrep" not in line]

    with Hold(sandbox, name, HOSTS, at=3) as hold:
        started = cli("launch", str(job(tmp_path, inv, name, hold.env)), "--detach")
        assert started.returncode == 0, started.stdout + started.stderr
        shown = json.loads(cli("status", name, "--json").stdout)
        assert shown["supervisor"]["host"] == "node1" and shown["supervisor"]["running"]
        assert any(f"mlxops watch {name}" in line for line in left())
        stopped = cli("stop", name)
        assert stopped.returncode == 0, stopped.stdout + stopped.stderr
        assert left() == []
        doc = json.loads(cli("status", name, "--json").stdout)
        assert doc["state"] == "stopped" and doc["supervisor"]["running"] is False, doc

        resumed = cli("resume", name, "--detach")
        assert resumed.returncode == 0, resumed.stdout + resumed.stderr
        doc = json.loads(cli("status", name, "--json").stdout)
        assert doc["state"] == "running" and doc["attempt"] == 2, doc
        assert doc["supervisor"]["running"] and doc["supervisor"]["pid"] != \
            shown["supervisor"]["pid"], doc
        assert cli("stop", name).returncode == 0
    assert left() == []


def answers(sandbox, port: int) -> bool:
    """The server answers on node1's loopback (where it listens), asked on node1."""
    probe = (f"import urllib.request; urllib.request.urlopen("
             f"'http://127.0.0.1:{port}/v1/models', timeout=5).read()")
    return sandbox.exec_in("node1", [sandbox.python, "-c", probe]).returncode == 0


def test_a_served_model_comes_back_with_no_mlxops_on_the_controller(sandbox, tmp_path,
        served_model):  # noqa: F811 - the fixture imported from test_serve
    inv = inventory(sandbox, tmp_path)
    done = cli("provision", str(inv), "--tags", "supervisor", timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    name, port = "sv-serve", 8183
    path = tmp_path / f"{name}.yml"
    path.write_text(yaml.safe_dump({
        "name": name, "inventory": str(inv), "hosts": "node1",
        "restart": {"max_restarts": 2, "stall_timeout": 30, "poll_interval": 0.5},
        "serve": {"model": {"job": served_model[0]}, "port": port, "max_tokens": 16}}))
    started = cli("launch", str(path), "--detach")
    assert started.returncode == 0, started.stdout + started.stderr
    try:
        assert mlxops_processes_here() == []
        wait_until(lambda: answers(sandbox, port), 180, "the server to answer")
        os.kill(server_pid(sandbox, name), signal.SIGKILL)
        assert not answers(sandbox, port)
        record = wait_until(lambda: (r := supervisor_record(sandbox, name))
                            and r["restarts"] and r, 120, "node1's supervisor to restart it")
        assert len(record["restarts"]) == 1, record["restarts"]
        wait_until(lambda: answers(sandbox, port), 180, "the server to answer again")
        assert mlxops_processes_here() == []  # nobody here brought it back
        doc = json.loads(cli("status", name, "--json").stdout)
        assert doc["state"] == "running" and doc["attempt"] == 2, doc
        assert doc["supervisor"]["host"] == "node1" and doc["supervisor"]["running"], doc
    finally:
        stopped = cli("stop", name)
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    ps = subprocess.run(["pgrep", "-af", f"mlxops watch {name}|/runs/{name}/"],
                        capture_output=True, text=True).stdout
    assert [line for line in ps.splitlines() if "pgrep" not in line] == []


def test_check_job_asks_the_supervisor_host_to_reach_the_webhook(sandbox, tmp_path):
    inv = inventory(sandbox, tmp_path)
    hook = Receiver(host=sandbox.controller_ip)
    try:
        outcomes = {}
        for label, url in (("bridge", hook.url), ("its own loopback", "http://127.0.0.1:9/")):
            path = job(tmp_path, inv, "sv-check", {}, {"webhook": url})
            proc = cli("check", str(inv), "--job", str(path), "--limit", "node1", "--json")
            doc = json.loads(proc.stdout)
            found = [r for r in doc["results"]
                     if r["check"] == "check_supervisor_reaches_webhook"]
            assert [r["host"] for r in found] == ["node1"], (label, doc["results"])
            outcomes[label] = (found[0]["outcome"], found[0]["message"])
    finally:
        hook.close()
    assert outcomes["bridge"][0] == "passed", outcomes
    assert outcomes["its own loopback"][0] == "failed", outcomes
    assert "cannot reach its webhook at 127.0.0.1:9" in outcomes["its own loopback"][1]


def test_a_dead_supervisor_is_noticed_by_status_and_restarted_by_watch(sandbox, tmp_path):
    inv = inventory(sandbox, tmp_path)
    done = cli("provision", str(inv), "--tags", "supervisor", timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    name = "sv-dead"
    with Hold(sandbox, name, HOSTS, at=3) as hold:
        started = cli("launch", str(job(tmp_path, inv, name, hold.env)), "--detach")
        assert started.returncode == 0, started.stdout + started.stderr
        first = json.loads(cli("status", name, "--json").stdout)["supervisor"]
        os.kill(first["pid"], signal.SIGKILL)  # all nodes share this machine's pids
        shown = cli("status", name)
        assert "supervisor on node1 is not running" in shown.stdout, shown.stdout
        assert f"mlxops watch {name} starts it again" in shown.stdout
        watch = subprocess.Popen([sys.executable, "-m", "mlxops", "watch", name], cwd=ROOT,
                                 stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, text=True)
        try:
            again = wait_until(
                lambda: (s := json.loads(cli("status", name, "--json").stdout)["supervisor"])
                and s["running"] and s, 120, "watch to start the supervisor again")
            assert again["pid"] != first["pid"]
            hold.release()
            out, _ = watch.communicate(timeout=300)
        finally:
            if watch.poll() is None:
                watch.kill()
    assert watch.returncode == 0, out[-3000:]
    assert "node1 supervises this job: following only" in out
    assert "supervisor on node1 is not running: starting it again" in out
    assert json.loads(cli("status", name, "--json").stdout)["state"] == "finished"


def test_a_supervisor_without_its_environment_is_refused_before_anything_starts(
        sandbox, tmp_path):
    inv = inventory(sandbox, tmp_path)
    path = job(tmp_path, inv, "sv-noenv", {})
    doc = yaml.safe_load(path.read_text())
    doc["supervisor"] = "node6"  # never provisioned as a supervisor
    path.write_text(yaml.safe_dump(doc))
    refused = cli("launch", str(path), "--detach")
    assert refused.returncode != 0
    lines = refused.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        "mlxops: error: supervisor node6: no mlxops node environment for the supervisor"), lines
    ps = subprocess.run(["pgrep", "-af", "/runs/sv-noenv/"], capture_output=True, text=True)
    assert [line for line in ps.stdout.splitlines() if "pgrep" not in line] == []
    assert not run_dir(sandbox, "node1", "sv-noenv").exists()

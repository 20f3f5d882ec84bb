"""Jobs on 4 sandbox nodes: launch, stop, resume, and the watchdog's restarts.

Real sshd nodes, real detached ranks, a real MLX ring between network namespaces. Each
test runs its own job name (own ports, own run directory). The core scenarios (a fresh
launch to the end, stop + resume, kill -9 and recovery) run on bash and on zsh login
shells (``login_sandbox``).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from job_helpers import (
    BackgroundWatchdog,
    Hold,
    losses,
    run_dir,
    wait_for_record,
    wait_for_step,
)

from mlxops.inventory import load_inventory
from mlxops.jobs.launch import launch
from mlxops.jobs.preflight import PreflightError
from mlxops.jobs.record import load_record
from mlxops.jobs.spec import load_job
from mlxops.jobs.status import job_status
from mlxops.jobs.stop import stop_job
from mlxops.jobs.watch import supervise
from mlxops.transport import ConnectOptions, Connector, HostUnreachable

HOSTS = "node1,node2,node3,node4"
TRAINER = {
    "model": {"dims": 32, "layers": 1, "heads": 2, "vocab_size": 256, "seq_len": 32},
    "data": {"source": "synthetic", "seed": 0},
    "train": {"steps": 60, "global_batch": 8, "micro_batch": 2, "lr": 3e-3,
              "checkpoint_every": 10, "keep": 3, "log_every": 1},
}


def write_job(tmp_path: Path, sandbox, name: str, *, steps: int = 60,
              restart: dict | None = None, global_batch: int = 8,
              env: dict[str, str] | None = None) -> Path:
    trainer = json.loads(json.dumps(TRAINER))
    trainer["train"]["steps"] = steps
    trainer["train"]["global_batch"] = global_batch
    job = {"name": name, "inventory": str(sandbox.inventory_path), "hosts": HOSTS,
           "backend": "ring", "trainer": trainer,
           "restart": restart or {"max_restarts": 2, "stall_timeout": 30}}
    if env:
        job["env"] = env
    path = tmp_path / f"{name}.yml"
    path.write_text(yaml.safe_dump(job))
    return path


def job_processes(name: str) -> list[str]:
    """Every process on this machine (all nodes share its PID namespace) of the job."""
    out = subprocess.run(["pgrep", "-af", f"/runs/{name}/"], capture_output=True, text=True)
    return [line for line in out.stdout.splitlines() if "pgrep" not in line]




def wait_until_answers(connector, sandbox, node: str, timeout: float = 30) -> None:
    """A link just back up may drop the first packets (neighbour discovery): wait for it."""
    host = load_inventory(sandbox.inventory_path).hosts[node]
    deadline = time.monotonic() + timeout
    while True:
        try:
            connector.connect(host).run("true", timeout=5)
            return
        except HostUnreachable:
            assert time.monotonic() < deadline, f"{node} still unreachable after {timeout}s"
            time.sleep(1)


def trainer_pid(sandbox, name: str, rank: int, node: str) -> int:
    pgid = int((run_dir(sandbox, node, name) / f"rank-{rank}.pid").read_text())
    children = subprocess.run(["pgrep", "-P", str(pgid)], capture_output=True, text=True)
    return int(children.stdout.split()[0])


def test_launch_runs_to_finished_with_falling_loss(login_sandbox, tmp_path, connector):
    sandbox = login_sandbox
    spec = load_job(write_job(tmp_path, sandbox, "t-finish", steps=40))
    record = launch(spec, connector)
    assert record.world_size == 4
    assert {r.host for r in record.ranks} == set(HOSTS.split(","))
    final = supervise(record, connector)
    assert final.state == "finished", final.to_dict()
    assert all(r.state == "finished" and r.step == 40 for r in final.ranks)
    seen = losses(sandbox, "t-finish")
    assert seen[40] < seen[1]
    assert job_processes("t-finish") == []
    # Every node keeps its own checkpoint copy.
    for node in HOSTS.split(","):
        assert (run_dir(sandbox, node, "t-finish") / "ckpt" / "latest").exists()

    # The same name again is refused (it has checkpoints) unless told to start over.
    with pytest.raises(PreflightError, match="mlxops resume t-finish"):
        launch(spec, connector)
    # A few steps show it: the new run's lines only, not the old one's appended to.
    shorter = load_job(write_job(tmp_path, sandbox, "t-finish", steps=10))
    again = launch(shorter, connector, fresh=True)
    assert supervise(again, connector).state == "finished"
    steps = [json.loads(line)["step"] for line in
             (run_dir(sandbox, "node1", "t-finish") / "metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(1, 11))


#: The uninterrupted run the stop/resume scenarios compare with; they hold their job
#: (:class:`Hold`) where they stop it, so it need not be long for the stop to land mid-run
#: (a count "long enough" raced the machine: the fused step and OpenBLAS made 30 steps end
#: before a stop at step 12 could land). A global batch that 4 ranks and 3 both divide.
REFERENCE_STEPS, REFERENCE_BATCH = 40, 12


@pytest.fixture(scope="session")
def reference_losses(sandbox, tmp_path_factory) -> dict[int, float]:
    """step -> loss of one uninterrupted run on 4 bash nodes, made once for the session.

    The resumed runs on bash and on zsh nodes, and the one resumed without a node, all
    compare with it: the same trainer on the same interpreter and mlx computes the same
    losses whichever shell the node user logs in to (each run used to make its own)."""
    tmp = tmp_path_factory.mktemp("reference")
    with pytest.MonkeyPatch.context() as patch, Connector() as connector:
        patch.setenv("MLXOPS_HOME", str(tmp / "home"))
        spec = load_job(write_job(tmp, sandbox, "t-reference", steps=REFERENCE_STEPS,
                                  global_batch=REFERENCE_BATCH))
        assert supervise(launch(spec, connector), connector).state == "finished"
    return losses(sandbox, "t-reference")


@pytest.mark.slow
def test_stop_mid_run_leaves_nothing_and_resume_matches_an_uninterrupted_run(
        login_sandbox, tmp_path, connector, reference_losses):
    sandbox = login_sandbox
    hold = Hold(sandbox, "t-resume", HOSTS, at=24)
    spec = load_job(write_job(tmp_path, sandbox, "t-resume", steps=REFERENCE_STEPS,
                              global_batch=REFERENCE_BATCH, env=hold.env))
    record = launch(spec, connector)
    with hold:
        wait_for_step(record, connector, 24)
        results = stop_job(record, connector)
    assert results.exit_code == 0, {h: r.message for h, r in results.items()}
    assert job_processes("t-resume") == []
    assert job_status(load_record("t-resume"), connector).state == "stopped"
    assert stop_job(load_record("t-resume"), connector).exit_code == 0  # idempotent

    resumed = launch(spec, connector, resume=True, previous=load_record("t-resume"))
    start = int(resumed.message.removeprefix("resumed from step "))
    assert 20 <= start < REFERENCE_STEPS and start % 10 == 0, resumed.message  # ckpt every 10
    assert supervise(resumed, connector).state == "finished"
    want, got = reference_losses, losses(sandbox, "t-resume")
    after = [s for s in want if s > start]
    assert after and all(got[s] == want[s] for s in after), \
        [(s, want[s], got[s]) for s in after if got[s] != want[s]]


@pytest.mark.slow
def test_resume_without_a_node_keeps_the_global_batch(sandbox, tmp_path, connector,
                                                      reference_losses):
    """--exclude: 4 ranks -> 3, the same global batches, losses within 1e-4 relative."""
    steps = REFERENCE_STEPS
    hold = Hold(sandbox, "t-narrow", HOSTS, at=12)
    spec = load_job(write_job(tmp_path, sandbox, "t-narrow", steps=steps,
                              global_batch=REFERENCE_BATCH, env=hold.env))
    record = launch(spec, connector)
    with hold:
        wait_for_step(record, connector, 12)
        assert stop_job(record, connector).exit_code == 0
    resumed = launch(spec, connector, resume=True, exclude=["node4"],
                     previous=load_record("t-narrow"))
    assert resumed.world_size == 3 and resumed.excluded == ["node4"]
    start = int(resumed.message.removeprefix("resumed from step "))
    assert 10 <= start < steps and start % 10 == 0, resumed.message   # checkpoint_every 10
    assert supervise(resumed, connector).state == "finished"
    want, got = reference_losses, losses(sandbox, "t-narrow")
    for step in range(start + 1, steps + 1):
        assert abs(got[step] - want[step]) <= 1e-4 * abs(want[step]), (step, got[step],
                                                                       want[step])


def test_kill_9_of_one_rank_stops_the_rest_and_resumes_to_completion(
        login_sandbox, tmp_path, connector):
    sandbox = login_sandbox
    hold = Hold(sandbox, "t-kill", HOSTS, at=12)
    spec = load_job(write_job(tmp_path, sandbox, "t-kill", steps=40, env=hold.env))
    record = launch(spec, connector)
    watchdog = BackgroundWatchdog(record, connector)
    with hold:  # released once the rank is killed: the restart runs to the end
        wait_for_step(record, connector, 12)
        killed_at = time.time()
        os.kill(trainer_pid(sandbox, "t-kill", 2, "node3"), signal.SIGKILL)
    final = watchdog.result(timeout=180)
    assert final.state == "finished", final.to_dict()
    restarts = load_record("t-kill").restarts
    assert len(restarts) == 1 and "rank 2 on node3" in restarts[0].reason
    # The restart is recorded once every other rank has been stopped.
    assert restarts[0].time - killed_at < 10
    assert job_processes("t-kill") == []


def test_sigstop_of_one_rank_is_a_stall_and_recovers(sandbox, tmp_path, connector):
    hold = Hold(sandbox, "t-stall", HOSTS, at=12)
    spec = load_job(write_job(tmp_path, sandbox, "t-stall", steps=40, env=hold.env,
                              restart={"max_restarts": 2, "stall_timeout": 6}))
    record = launch(spec, connector)
    watchdog = BackgroundWatchdog(record, connector)
    with hold:
        wait_for_step(record, connector, 12)
        os.kill(trainer_pid(sandbox, "t-stall", 1, "node2"), signal.SIGSTOP)
    final = watchdog.result(timeout=180)
    assert final.state == "finished", final.to_dict()
    reasons = [r.reason for r in load_record("t-stall").restarts]
    assert len(reasons) == 1 and "stalled" in reasons[0], reasons
    assert job_processes("t-stall") == []


def test_controller_killed_mid_run_job_keeps_running_and_watch_reattaches(
        sandbox, tmp_path, connector):
    # Held at step 2, then let on to 10 with nobody watching: the job is running when
    # it is read, however fast the machine is (an 80-step run had already finished).
    with Hold(sandbox, "t-detach", HOSTS, at=2) as hold:
        path = write_job(tmp_path, sandbox, "t-detach", steps=40, env=hold.env)
        env = dict(os.environ)
        cli = subprocess.Popen([sys.executable, "-m", "mlxops", "launch", str(path)],
                               env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            record = wait_for_record("t-detach")
            wait_for_step(record, connector, 2)
        finally:
            cli.kill()  # SIGKILL: no chance to clean anything up
            cli.wait()
        assert job_status(record, connector).step == 2
        hold.at(10)
        wait_for_step(record, connector, 10)  # trains on with nobody watching
        status = job_status(record, connector)
        assert status.state == "running" and status.step == 10
        out = subprocess.run([sys.executable, "-m", "mlxops", "status", "t-detach", "--json"],
                             capture_output=True, text=True, env=env, timeout=60)
        assert out.returncode == 0, out.stderr
        doc = json.loads(out.stdout)
        assert doc["name"] == "t-detach" and doc["state"] == "running"
        assert [r["rank"] for r in doc["ranks"]] == [0, 1, 2, 3]
        hold.release()
        watch = subprocess.run([sys.executable, "-m", "mlxops", "watch", "t-detach"],
                               capture_output=True, text=True, env=env, timeout=240)
    assert watch.returncode == 0, watch.stderr
    assert "finished" in watch.stdout
    assert job_processes("t-detach") == []


def test_ctrl_c_while_following_detaches_and_never_kills(sandbox, tmp_path, connector):
    with Hold(sandbox, "t-ctrlc", HOSTS, at=3) as hold:
        path = write_job(tmp_path, sandbox, "t-ctrlc", steps=40, env=hold.env)
        cli = subprocess.Popen([sys.executable, "-m", "mlxops", "launch", str(path)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            record = wait_for_record("t-ctrlc")
            wait_for_step(record, connector, 3)
            cli.send_signal(signal.SIGINT)
            out, err = cli.communicate(timeout=30)
        finally:
            if cli.poll() is None:
                cli.kill()
        assert cli.returncode == 0, err
        assert "detached" in err and "mlxops watch t-ctrlc" in err
        before = job_status(record, connector)
        assert before.state == "running" and before.step == 3
        hold.at(5)
        wait_for_step(record, connector, 5)
        assert stop_job(load_record("t-ctrlc"), connector).exit_code == 0
    assert job_processes("t-ctrlc") == []


def test_a_node_going_down_mid_run_is_left_behind_when_the_job_allows_it(
        sandbox_mut, tmp_path):
    """restart.exclude_unreachable: node4's link goes down; the ranks stall, the watchdog
    stops them, finds node4 unreachable and resumes on 3 nodes, same global batch."""
    sandbox = sandbox_mut
    hold = Hold(sandbox, "t-down", HOSTS, at=12)
    spec = load_job(write_job(tmp_path, sandbox, "t-down", steps=40, global_batch=12,
                              env=hold.env,
                              restart={"max_restarts": 1, "stall_timeout": 6,
                                       "exclude_unreachable": True}))
    with Connector(ConnectOptions(connect_timeout=2)) as connector:
        record = launch(spec, connector)
        watchdog = BackgroundWatchdog(record, connector)
        events = watchdog.events
        with hold:
            wait_for_step(record, connector, 12)
            sandbox.disconnect_node("node4")
        try:
            final = watchdog.result(timeout=240)
            assert final.state == "finished", (final.to_dict(), events)
            now = load_record("t-down")
            assert now.excluded == ["node4"] and now.world_size == 3
            assert any("continuing without node4" in e for e in events), events
            assert len(now.restarts) == 1
            # node4's rank never heard of any of this: it still runs there, recorded.
            assert [h.name for h in now.stray] == ["node4"]
            # While it is still down, stop says so (exit 3) and keeps it on the list.
            down = stop_job(now, connector)
            assert down.exit_code == 3 and down.unreachable == ["node4"], down
            assert down["node4"].message.startswith(
                "left behind earlier, its ranks may still run: "), down["node4"].message
            assert [h.name for h in load_record("t-down").stray] == ["node4"]
        finally:
            sandbox.reconnect_node("node4")
        # Once node4 answers again, stop kills what it still runs and forgets it.
        wait_until_answers(connector, sandbox, "node4")
        stopped = stop_job(load_record("t-down"), connector)
    assert stopped.exit_code == 0, {h: r.message for h, r in stopped.items()}
    assert stopped["node4"].message == "left behind earlier: stopped what it still ran"
    assert load_record("t-down").stray == []
    assert job_processes("t-down") == []

"""The node's commands on a real run directory here: spawn, status, logs and stop, each
asked with the controller's argument list and answered as the controller reads it."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import time
from contextlib import redirect_stdout
from io import StringIO
from pathlib import Path

import pytest

from mlxops.node import protocol
from mlxops.node.__main__ import main
from mlxops.node.procs import alive, descendants, process_table
from mlxops.node.status import rank_status
from mlxops.transport import LocalConnection
from mlxops.transport.nodecmd import NodeCommandError, run_node

ROOT = Path(__file__).resolve().parents[3]


def ask(argv: list[str]):
    out = StringIO()
    with redirect_stdout(out):
        assert main(argv) == 0
    return protocol.parse_answer(argv[0], out.getvalue().strip())


def script(run_dir: Path, rank: int | str, body: str) -> None:
    """A start script that records its exit code, as placement.rank_script's do."""
    exit_file = run_dir / protocol.process_file(rank, protocol.EXIT)
    (run_dir / protocol.process_file(rank, protocol.SCRIPT)).write_text(
        f"{body}\ncode=$?\necho $code > '{exit_file}'\nexit $code\n")


def wait_for(predicate, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


@pytest.fixture
def run_dir(tmp_path):
    run_dir = tmp_path / "runs" / "j"
    run_dir.mkdir(parents=True)
    yield run_dir
    # Whatever a failed test left running goes with it.
    ask(protocol.stop_args(str(run_dir), 0))


def test_spawn_status_logs_stop(run_dir):
    script(run_dir, 0, "echo zero; exec sleep 30")
    script(run_dir, 1, "echo one; (exit 3)")
    (run_dir / protocol.STOPPED_MARKER).write_text("0\n")   # an earlier stop

    spawned = ask(protocol.spawn_args(str(run_dir), [0, 1]))
    assert set(spawned.pids) == {0, 1} and spawned.launcher is None
    assert not (run_dir / protocol.STOPPED_MARKER).exists()
    wait_for(lambda: (run_dir / protocol.process_file(1, protocol.EXIT)).exists())

    status = ask(protocol.status_args(str(run_dir)))
    zero, one = status.rank(0), status.rank(1)
    assert (zero.pid, zero.alive, zero.exit) == (spawned.pids[0], True, None)
    assert (one.alive, one.exit) == (False, 3) and one.ended_ago >= 0
    assert status.exists and not status.stopped and status.launcher is None

    wait_for(lambda: (run_dir / "rank-0.log").read_text() == "zero\n")
    logs = ask(protocol.logs_args(str(run_dir)))
    assert {k: c.text for k, c in logs.logs.items()} == {0: "zero\n", 1: "one\n"}
    again = ask(protocol.logs_args(str(run_dir), offsets={k: c.offset
                                                          for k, c in logs.logs.items()}))
    assert {k: c.text for k, c in again.logs.items()} == {0: "", 1: ""}
    assert ask(protocol.logs_args(str(run_dir), rank=1)).logs.keys() == {1}

    stopped = ask(protocol.stop_args(str(run_dir), 2))
    assert (stopped.signalled, stopped.killed, stopped.alive) == ([0], [], [])
    assert not alive(spawned.pids[0])
    after = ask(protocol.status_args(str(run_dir)))
    assert after.stopped and not after.rank(0).alive


def test_a_spawned_ranks_log_is_readable_by_its_owner_only_even_one_an_attempt_left(run_dir):
    log = run_dir / protocol.process_file(1, protocol.LOG)
    log.write_text("the previous attempt's lines\n")
    log.chmod(0o644)
    script(run_dir, 0, "echo zero")
    script(run_dir, 1, "echo one")
    old_umask = os.umask(0o022)
    try:
        ask(protocol.spawn_args(str(run_dir), [0, 1]))
    finally:
        os.umask(old_umask)
    for rank in (0, 1):
        wait_for(lambda r=rank: (run_dir / protocol.process_file(r, protocol.EXIT)).exists())
        mode = (run_dir / protocol.process_file(rank, protocol.LOG)).stat().st_mode
        assert stat.S_IMODE(mode) == 0o600, rank
    assert log.read_text() == "the previous attempt's lines\none\n"


def test_a_launcher_is_spawned_reported_and_stopped_with_what_it_started(run_dir):
    script(run_dir, 0, f"echo $$ > '{run_dir / 'rank-0.pid'}'; exec sleep 30")
    # The launcher starts rank 0 itself, as mpirun does: rank 0 leads no group of its own.
    script(run_dir, protocol.LAUNCHER, f"/bin/sh '{run_dir / 'rank-0.sh'}' & wait")
    spawned = ask(protocol.spawn_args(str(run_dir), [], launcher=True))
    assert spawned.pids == {} and spawned.launcher
    wait_for(lambda: (run_dir / "rank-0.pid").exists())
    status = ask(protocol.status_args(str(run_dir)))
    assert status.launcher.alive and status.launcher.pid == spawned.launcher
    assert status.rank(0).alive
    rank0 = status.rank(0).pid
    assert rank0 in descendants(spawned.launcher, process_table())
    stopped = ask(protocol.stop_args(str(run_dir), 2))
    assert set(stopped.signalled) == {0, protocol.LAUNCHER} and stopped.alive == []
    assert not alive(rank0) and not alive(spawned.launcher)


def test_leftovers_are_what_preflight_refuses_to_start_over(run_dir):
    script(run_dir, 0, "exec sleep 30")
    pid = ask(protocol.spawn_args(str(run_dir), [0])).pids[0]
    answer = ask(protocol.preflight_args(str(run_dir)))
    assert answer.leftovers == [protocol.Leftover(0, pid)] and answer.mpirun is None


def test_a_rank_that_started_after_the_process_table_was_read_is_alive(run_dir):
    """An mpi rank's script writes its pid file itself when mpirun starts it: maybe after
    ``status`` read the process table. Dead there, without an exit code, it was "gone
    without an exit code" (its job failed, the watchdog restarted it); it runs."""
    before = process_table()
    proc = subprocess.Popen(["sleep", "30"])  # not a group leader, as under orted
    try:
        (run_dir / protocol.process_file(0, protocol.PID)).write_text(f"{proc.pid}\n")
        answer = rank_status(run_dir, 0, time.time(), before)
        assert answer.alive and answer.exit is None and answer.failure is None
    finally:
        proc.kill()
        proc.wait()
    answer = rank_status(run_dir, 0, time.time(), process_table())
    assert not answer.alive  # and a rank gone without an exit code is still said so


def test_run_node_reads_the_answer_over_a_connection_and_names_a_bad_one(run_dir):
    conn = LocalConnection("local")
    answer = run_node(conn, sys.executable, str(ROOT), protocol.status_args(str(run_dir)))
    assert isinstance(answer, protocol.StatusAnswer) and answer.ranks == []
    with pytest.raises(NodeCommandError, match="local: status failed"):
        run_node(conn, sys.executable, str(ROOT), [protocol.STATUS, "--no-such-flag"])

"""Node answers for tests: run directories made from a description and the node's own
``status`` of them; a healthy pre-flight answer.

The status case files (data/jobs/*status_cases.yml) describe what is on each node, file by
file, and the node's ``status`` command says what it sees there, so the answers the
controller classifies in those tests are the node's, not copies written by hand. A host:

    stopped: true             the job's ``stopped`` marker
    launcher: {...}           ``launcher.sh`` (an mpi job's first host), described as a rank
    ranks: {R: {...}}         ``rank-R.sh``, and of that rank:
      pid: alive | dead       ``rank-R.pid`` names a live process (leading its own group) or
                              one that has ended; no ``pid``: the rank has not started
      started: S              ... written S seconds ago (default 100)
      exit: N                 ``rank-R.exit`` holds N ...
      ended: S                ... written S seconds ago (default 100)
      progress: {age: S, step: .., loss: .., tokens_per_sec: .., state: ..}
                              ``progress/rank-R.json``, written S seconds ago
      log: TEXT               ``rank-R.log`` holds TEXT (a log recorded from a real rank)
"""

from __future__ import annotations

import os
import subprocess
import time
from contextlib import redirect_stdout
from io import StringIO
from pathlib import Path
from typing import Any

from mlxops.node import protocol
from mlxops.node.__main__ import main as node_main


class Processes:
    """Processes to name in pid files: live ones (killed when the ``with`` block ends), and
    ended ones."""

    def __init__(self) -> None:
        self.live: list[subprocess.Popen] = []

    def alive(self) -> int:
        proc = subprocess.Popen(["sleep", "300"], start_new_session=True)
        self.live.append(proc)
        return proc.pid

    def dead(self) -> int:
        proc = subprocess.Popen(["true"])
        proc.wait()
        return proc.pid

    def __enter__(self) -> Processes:
        return self

    def __exit__(self, *_: object) -> None:
        for proc in self.live:
            proc.kill()
            proc.wait()


def _write(path: Path, text: str, age: float) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    when = time.time() - age
    os.utime(path, (when, when))


def _process(run_dir: Path, rank: int | str, about: dict[str, Any], procs: Processes) -> None:
    _write(run_dir / protocol.process_file(rank, protocol.SCRIPT), "exit 0\n", 0)
    if "pid" in about:
        pid = {"alive": procs.alive, "dead": procs.dead}[about["pid"]]()
        _write(run_dir / protocol.process_file(rank, protocol.PID), f"{pid}\n",
               about.get("started", 100))
    if "exit" in about:
        _write(run_dir / protocol.process_file(rank, protocol.EXIT), f"{about['exit']}\n",
               about.get("ended", 100))
    if "log" in about:
        _write(run_dir / protocol.process_file(rank, protocol.LOG), about["log"], 0)
    if "progress" in about:
        beat = dict(about["progress"])
        age = beat.pop("age")
        beat.setdefault("state", "running")  # starting: a beat before the first step
        record = protocol.Progress(rank=int(rank), time=time.time() - age, **beat)
        _write(run_dir / protocol.progress_file(int(rank)),
               protocol.answer_line(record) + "\n", age)


def make_run_dir(run_dir: Path, host: dict[str, Any], procs: Processes) -> None:
    """Lay out ``run_dir`` as ``host`` describes it."""
    run_dir.mkdir(parents=True)
    if host.get("stopped"):
        _write(run_dir / protocol.STOPPED_MARKER, "0\n", 0)
    if "launcher" in host:
        _process(run_dir, protocol.LAUNCHER, host["launcher"], procs)
    for rank, about in host.get("ranks", {}).items():
        _process(run_dir, int(rank), about or {}, procs)


def node_status(run_dir: Path) -> protocol.StatusAnswer:
    """What ``python -m mlxops.node status`` prints there, read as the controller reads it."""
    args = protocol.status_args(str(run_dir))
    out = StringIO()
    with redirect_stdout(out):
        assert node_main(args) == 0
    return protocol.parse_answer(args[0], out.getvalue().strip())


def answers(tmp_path: Path, hosts: dict[str, Any], procs: Processes
            ) -> tuple[dict[str, protocol.StatusAnswer], dict[str, str]]:
    """Each host's status answer about its described run directory; a host described as
    null did not answer (``unreachable``, host -> reason)."""
    got, unreachable = {}, {}
    for name, host in hosts.items():
        if host is None:
            unreachable[name] = "timed out"
            continue
        run_dir = tmp_path / name / protocol.run_path("j")
        make_run_dir(run_dir, host, procs)
        got[name] = node_status(run_dir)
    return got, unreachable


def preflight_answer(**overrides: Any) -> protocol.PreflightAnswer:
    """A pre-flight answer of a healthy node, with ``overrides``."""
    fields: dict[str, Any] = {
        "python": "/py", "python_version": "3.11.7", "mlx": "0.32.4", "system": "Linux",
        "ports_busy": [], "leftovers": [], "checkpoints": []}
    return protocol.PreflightAnswer(**{**fields, **overrides})


def node_answer(args: list[str]) -> Any:
    """What ``python -m mlxops.node ARGS`` prints here, read as the controller reads it."""
    out = StringIO()
    with redirect_stdout(out):
        assert node_main(args) == 0
    return protocol.parse_answer(args[0], out.getvalue().strip())

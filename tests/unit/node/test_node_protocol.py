"""The controller-node protocol: argument lists the node parses back, answers that survive
the wire, the run-directory names, and the one rule for a complete checkpoint."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from mlxops.jobs.runfiles import start_command_prefix, tar
from mlxops.node import protocol
from mlxops.node.rundir import checkpoint_steps, keep_checkpoints_up_to, ranks_in


@pytest.mark.parametrize("argv,want", [
    (protocol.preflight_args("runs/j"),
     {"cmd": "preflight", "run_dir": "runs/j", "ip": "", "ports": [], "mpi": False}),
    (protocol.preflight_args("/r/runs/j", ip="10.0.0.2", ports=[30000, 30001], mpi=True),
     {"ip": "10.0.0.2", "ports": [30000, 30001], "mpi": True}),
    (protocol.spawn_args("/r/runs/j", [0, 1]),
     {"cmd": "spawn", "ranks": [0, 1], "launcher": False}),
    (protocol.spawn_args("/r/runs/j", [], launcher=True), {"ranks": [], "launcher": True}),
    (protocol.status_args("/r/runs/j"), {"cmd": "status", "run_dir": "/r/runs/j"}),
    (protocol.stop_args("/r/runs/j", 2.5), {"cmd": "stop", "grace": 2.5, "ip": "", "ports": []}),
    (protocol.stop_args("/r/runs/j", 5, ip="10.0.0.2", ports=[30000]),
     {"ip": "10.0.0.2", "ports": [30000]}),
    (protocol.logs_args("/r/runs/j", rank=2, offsets={2: 10, "launcher": 7}, tail=4096),
     {"cmd": "logs", "rank": 2, "offsets": ["2:10", "launcher:7"], "tail": 4096}),
    (protocol.logs_args("/r/runs/j"), {"rank": None, "offsets": [], "tail": 0}),
    (protocol.keep_checkpoints_args("/r/runs/j", 50), {"cmd": "keep-checkpoints", "step": 50}),
])
def test_the_node_parses_what_the_controller_builds(argv, want):
    args = vars(protocol.parser().parse_args(argv))
    assert {k: args[k] for k in want} == want


def test_offsets_keep_the_launcher_apart_from_the_ranks():
    argv = protocol.logs_args("/r", offsets={0: 12, protocol.LAUNCHER: 3})
    assert protocol.parse_offsets(protocol.parser().parse_args(argv).offsets) == {
        0: 12, protocol.LAUNCHER: 3}


ANSWERS = [
    (protocol.PREFLIGHT, protocol.PreflightAnswer(
        python="/py", python_version="3.11.7", mlx=None, system="Darwin", ports_busy=[30001],
        leftovers=[protocol.Leftover(0, 41), protocol.Leftover(protocol.LAUNCHER, 40)],
        checkpoints=[10, 20], mpirun="/opt/homebrew/bin/mpirun", mpi_libname="libmpi.dylib")),
    (protocol.SPAWN, protocol.SpawnAnswer({0: 41, 1: 42})),
    (protocol.SPAWN, protocol.SpawnAnswer({}, launcher=40)),
    (protocol.STATUS, protocol.StatusAnswer(
        now=100.0, exists=True, stopped=False, checkpoints=[10],
        ranks=[protocol.RankAnswer(rank=3, pid=41, alive=True, exit=None, ended_ago=None,
                                   started=90.0, heartbeat_age=1.5, log_bytes=12,
                                   progress=protocol.Progress(rank=3, step=7, loss=2.5,
                                                              time=98.5, state="running"))],
        launcher=protocol.LauncherAnswer(pid=40, alive=False, exit=0, started=80.0, age=20.0,
                                         ended_ago=2.0))),
    (protocol.STATUS, protocol.StatusAnswer(now=1.0, exists=False, stopped=True, ranks=[],
                                            checkpoints=[])),
    (protocol.STOP, protocol.StopAnswer(signalled=[0, 1, protocol.LAUNCHER], killed=[1],
                                        alive=["orted-77"], ports_busy=[30001])),
    (protocol.LOGS, protocol.LogsAnswer({0: protocol.LogChunk("step 1\n", 7),
                                         protocol.LAUNCHER: protocol.LogChunk("", 0)})),
    (protocol.KEEP_CHECKPOINTS, protocol.KeepCheckpointsAnswer([30, 40])),
]


@pytest.mark.parametrize("command,answer", ANSWERS, ids=[type(a).__name__ for _, a in ANSWERS])
def test_answers_survive_the_wire(command, answer):
    line = protocol.answer_line(answer)
    assert "\n" not in line
    assert protocol.parse_answer(command, line) == answer


def test_a_status_without_launcher_says_nothing_of_one():
    answer = protocol.StatusAnswer(now=1.0, exists=True, stopped=False, ranks=[],
                                   checkpoints=[])
    assert "launcher" not in json.loads(protocol.answer_line(answer))


@pytest.mark.parametrize("command,answer", ANSWERS[:1] + ANSWERS[3:4] + ANSWERS[5:6])
def test_an_answer_without_a_field_is_refused_by_name(command, answer):
    doc = answer.to_dict()
    field = next(iter(doc))
    del doc[field]
    with pytest.raises(protocol.ProtocolError, match=repr(field)):
        protocol.parse_answer(command, json.dumps(doc))
    with pytest.raises(protocol.ProtocolError, match="not JSON"):
        protocol.parse_answer(command, "Traceback (most recent call last):")


def test_a_rank_without_a_field_is_refused_inside_a_status():
    _, status = ANSWERS[3]
    doc = status.to_dict()
    del doc["ranks"][0]["heartbeat_age"]
    with pytest.raises(protocol.ProtocolError, match="'heartbeat_age'"):
        protocol.parse_answer(protocol.STATUS, json.dumps(doc))


def test_names_of_the_run_directory():
    assert protocol.process_file(3, protocol.PID) == "rank-3.pid"
    assert protocol.process_file(protocol.LAUNCHER, protocol.LOG) == "launcher.log"
    assert protocol.progress_file(2) == "progress/rank-2.json"
    assert protocol.run_path("tiny") == "runs/tiny"
    assert protocol.rank_of_script("rank-12.sh") == 12
    assert protocol.rank_of_script("launcher.sh") is None
    assert protocol.checkpoint_name(50) == "step-00000050"
    assert protocol.checkpoint_step("step-00000050") == 50
    assert protocol.checkpoint_step(".tmp-step-00000050-99") is None


def _checkpoint(ckpt: Path, step: int, *, state: str = '{"step": 1}',
                missing: str | None = None) -> Path:
    d = ckpt / protocol.checkpoint_name(step)
    d.mkdir(parents=True)
    for name in protocol.CKPT_FILES:
        if name != missing:
            (d / name).write_text(state if name == protocol.CKPT_STATE else "x")
    return d


def test_a_checkpoint_is_complete_with_every_file_and_a_readable_state(tmp_path):
    ckpt = tmp_path / protocol.CKPT_DIR
    _checkpoint(ckpt, 10)
    _checkpoint(ckpt, 20, missing=protocol.CKPT_OPTIMIZER)
    _checkpoint(ckpt, 30, state="{half")
    _checkpoint(ckpt, 40)
    (ckpt / ".tmp-step-00000050-99").mkdir()
    assert [d.name for d in protocol.complete_checkpoints(ckpt)] == [
        "step-00000010", "step-00000040"]
    assert checkpoint_steps(tmp_path) == [10, 40]
    assert not protocol.checkpoint_complete(ckpt / ".tmp-step-00000050-99")


def test_keep_checkpoints_drops_the_newer_ones_and_points_latest_back(tmp_path):
    ckpt = tmp_path / protocol.CKPT_DIR
    for step in (10, 20, 30):
        _checkpoint(ckpt, step)
    (ckpt / protocol.LATEST).write_text("step-00000030\n")
    assert keep_checkpoints_up_to(tmp_path, 20) == [30]
    assert checkpoint_steps(tmp_path) == [10, 20]
    assert (ckpt / protocol.LATEST).read_text() == "step-00000020\n"
    assert keep_checkpoints_up_to(tmp_path, 20) == []


def test_a_pipeline_nodes_stage_checkpoints_are_counted_and_trimmed(tmp_path):
    ckpt = tmp_path / protocol.CKPT_DIR
    for stage, steps in ((0, (3, 6)), (2, (3, 6, 9))):
        for step in steps:
            _checkpoint(ckpt / f"stage-{stage}", step)
    assert checkpoint_steps(tmp_path) == [3, 6, 9]
    assert keep_checkpoints_up_to(tmp_path, 6) == [9]
    assert checkpoint_steps(tmp_path) == [3, 6]
    assert (ckpt / "stage-2" / protocol.LATEST).read_text() == "step-00000006\n"
    assert not (ckpt / "stage-0" / protocol.LATEST).exists()  # nothing removed there


def test_a_new_attempt_clears_the_last_ones_process_files_and_keeps_the_rest(tmp_path):
    run_dir = tmp_path / "root $(touch pwned) 'q'" / "runs" / "j"
    kept = ["rank-0.log", "launcher.log", protocol.METRICS, "ckpt/step-00000010/state.json",
            "trainer.json"]
    cleared = ["rank-0.sh", "rank-0.pid", "rank-0.exit", "rank-11.pid", "launcher.sh",
               "launcher.pid", "launcher.exit", "progress/rank-0.json"]
    for name in kept + cleared:
        (run_dir / name).parent.mkdir(parents=True, exist_ok=True)
        (run_dir / name).write_text("old\n")
    command = start_command_prefix(str(run_dir))
    subprocess.run(["/bin/sh", "-c", command], input=tar({"rank-1.sh": b"new\n"}),
                   check=True, cwd=tmp_path)
    left = sorted(str(p.relative_to(run_dir)) for p in run_dir.rglob("*") if p.is_file())
    assert left == sorted(kept + ["rank-1.sh"])
    assert ranks_in(run_dir) == [1]
    assert not (tmp_path / "pwned").exists()
    subprocess.run(["/bin/sh", "-c", start_command_prefix(str(run_dir), fresh=True)],
                   input=tar({"rank-2.sh": b"new\n"}), check=True, cwd=tmp_path)
    assert [p.name for p in run_dir.rglob("*")] == ["rank-2.sh"]


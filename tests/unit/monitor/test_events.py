"""A job's timeline (mlxops/events.py, docs/formats.md "events.jsonl") and ``mlxops events``."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from mlxops import events
from mlxops.monitor.data import MirrorReader, document

DATA = Path(__file__).parents[1] / "data" / "monitor"


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("MLXOPS_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def test_events_round_trip_in_order_with_unique_ids(home):
    a = events.start_run(events.make("job", events.STARTED, "2 ranks on 2 host(s)", attempt=1,
                                     hosts=["n1", "n2"]))
    b = events.record("job", events.RESTARTED, "rank 1 on n2 exited with code 137", attempt=1,
                      excluded=[])
    assert events.read("job") == [a, b]
    assert a.id != b.id and a.detail == {"hosts": ["n1", "n2"]}
    line = json.loads(events.path("job").read_text().splitlines()[1])
    assert line == b.to_dict()
    assert oct(events.path("job").stat().st_mode & 0o777) == "0o600"


def test_a_fresh_launch_starts_the_timeline_over(home):
    events.record("job", events.FAILED, "gave up")
    fresh = events.start_run(events.make("job", events.STARTED, "again"))
    assert events.read("job") == [fresh]


def test_a_torn_or_foreign_line_is_skipped(home):
    kept = events.record("job", events.STOPPED, "stopped (mlxops stop)")
    with open(events.path("job"), "a") as handle:
        handle.write('{"id": "x", "time": 1}\n')          # a field missing
        handle.write('{"id": "y", "time": 2, "job": "jo')  # cut short by a kill
    assert events.read("job") == [kept]


def test_an_unknown_kind_is_a_bug_not_a_line():
    with pytest.raises(ValueError, match="unknown event kind"):
        events.make("job", "exploded", "?")


def test_writers_in_several_processes_never_interleave_a_line(home):
    code = ("import sys; from mlxops import events\n"
            "for i in range(200): events.record('job', events.ALERT, sys.argv[1] * 300)")
    env = {**os.environ, "MLXOPS_HOME": str(home)}
    procs = [subprocess.Popen([sys.executable, "-c", code, c], env=env) for c in "abcd"]
    assert [p.wait() for p in procs] == [0] * 4
    found = events.read("job")
    assert len(found) == 800 and len(events.path("job").read_text().splitlines()) == 800
    assert {e.message for e in found} == {c * 300 for c in "abcd"}


def test_the_job_document_places_events_on_the_curves(tmp_path, monkeypatch):
    home = tmp_path / "home"
    shutil.copytree(DATA / "finished", home / "jobs")
    monkeypatch.setenv("MLXOPS_HOME", str(home))
    reader = MirrorReader("tiny-lm")
    lines = reader.read().metrics
    at_150 = next(m.time for m in lines if m.step == 150)
    events.start_run(events.make("tiny-lm", events.STARTED, "3 ranks", now=lines[0].time - 5))
    events.record("tiny-lm", events.RESTARTED, "rank 2 killed", now=at_150 + 0.5, attempt=1)
    doc = document(reader.read())
    assert [(e["kind"], e["step"]) for e in doc.events] == [("started", None),
                                                               ("restarted", 150)]


def test_mlxops_events_prints_the_timeline_and_json(home, tmp_path):
    shutil.copytree(DATA / "finished", home / "jobs")
    events.start_run(events.make("tiny-lm", events.STARTED, "3 ranks on 1 host(s)", attempt=1))
    events.record("tiny-lm", events.RESTARTED, "rank 2 on localhost exited with code 137",
                  attempt=1)
    env = {**os.environ, "MLXOPS_HOME": str(home), "COLUMNS": "120"}
    run = [sys.executable, "-m", "mlxops", "events", "tiny-lm"]
    shown = subprocess.run(run, env=env, capture_output=True, text=True, check=True).stdout
    assert "started" in shown and "restarted     rank 2 on localhost exited" in shown
    doc = json.loads(subprocess.run([*run, "--json", "--kind", "restarted"], env=env,
                                    capture_output=True, text=True, check=True).stdout)
    assert [e["kind"] for e in doc["events"]] == ["restarted"]
    unknown = subprocess.run([sys.executable, "-m", "mlxops", "events", "nope"], env=env,
                             capture_output=True, text=True)
    assert unknown.returncode == 2 and "no job named 'nope'" in unknown.stderr


def test_an_alert_is_an_event_once_while_it_lasts(tmp_path, monkeypatch):
    from mlxops.jobs.record import load_record
    from mlxops.monitor.mirror import AlertEvents

    home = tmp_path / "home"
    shutil.copytree(DATA / "running", home / "jobs")
    monkeypatch.setenv("MLXOPS_HOME", str(home))
    record = load_record("tiny-lm")
    watcher = AlertEvents("tiny-lm")

    def alerts_so_far():
        return [e for e in events.read("tiny-lm") if e.kind == events.ALERT]

    watcher.look(record)                               # memory above the job's 2%
    watcher.look(record)                               # still: no second event
    [event] = alerts_so_far()
    assert (event.kind, event.detail["alert"], event.detail["host"]) == (
        "alert", "memory_share", "localhost")
    assert event.message.startswith("localhost: memory 3% in use (alert at 2%)")
    samples = home / "jobs" / "tiny-lm" / "samples.jsonl"
    last = json.loads(samples.read_text().splitlines()[-1])
    calm = {**last, "nodes": {"localhost": {**last["nodes"]["localhost"], "memory_used": 1}}}
    with open(samples, "a") as handle:
        handle.write(json.dumps(calm) + "\n")
    watcher.look(record)                               # it cleared
    assert len(alerts_so_far()) == 1
    with open(samples, "a") as handle:
        handle.write(json.dumps(last) + "\n")
    watcher.look(record)                               # back: a new one
    assert [e.detail["alert"] for e in alerts_so_far()] == ["memory_share", "memory_share"]


def line(step, val_loss=None):
    from mlxops.node.protocol.metrics import MetricsLine

    return MetricsLine(step=step, loss=1.0, tokens_per_sec=1.0, time=float(step),
                       step_time=0.1, compute_time=0.1, comm_time=0.0, world_size=2,
                       micro_batch=1, accumulation=1, lr=1e-3, active_memory=0,
                       peak_memory=0, val_loss=val_loss)


def test_a_plateau_is_one_event_per_best_that_validation_stopped_beating(home):
    from mlxops.finetune.config import FinetuneConfig
    from mlxops.jobs.workloads.finetune import FinetuneWorkload
    from mlxops.jobs.workloads.trainer import TrainerWorkload
    from mlxops.monitor.plateau import PlateauEvents, job_patience, plateau
    from mlxops.trainer.config import TrainConfig, TrainerConfig

    job = TrainerWorkload(TrainerConfig(train=TrainConfig(patience=2)))
    assert job_patience(job) == 2 and job_patience(FinetuneWorkload(FinetuneConfig())) == 3
    run = [line(10, 2.0), line(20, 1.5), line(25), line(30, 1.6)]
    assert plateau(run, 2) is None                     # one evaluation without a best
    run.append(line(40, 1.5))                          # equal is no new best: two
    assert plateau(run, 2) == (20, 1.5, 2)
    watch = PlateauEvents("job")
    first = watch.look(run, job, attempt=1)
    assert first.kind == events.PLATEAU and first.detail["best_step"] == 20
    assert first.message == ("validation loss has not improved for 2 evaluations (best "
                             "1.5000 at step 20)")
    assert watch.look(run, job, attempt=1) is None     # the same plateau: told once
    run += [line(50, 1.2), line(60, 1.3)]              # a new best, then one without
    assert watch.look(run, job, attempt=1) is None
    run.append(line(70, 1.25))
    assert watch.look(run, job, attempt=1).detail["best_step"] == 50
    assert [e.kind for e in events.read("job")] == ["plateau", "plateau"]


def test_an_append_after_a_torn_line_starts_a_line_of_its_own(home):
    # A writer killed mid-write leaves no newline: the next event (here the `failed` a
    # notification is sent for) must not be glued to the torn line and lost with it.
    kept = events.record("job", events.STARTED, "2 ranks")
    with open(events.path("job"), "a") as handle:
        handle.write('{"id": "y", "time": 2, "job": "jo')
    failed = events.record("job", events.FAILED, "gave up after 3 restarts")
    assert events.read("job") == [kept, failed]


def test_a_reader_says_which_line_it_skipped(home):
    events.record("job", events.STARTED, "2 ranks")
    with open(events.path("job"), "a") as handle:
        handle.write('{"id": "y", "time": 2, "job": "jo')
    events.record("job", events.FAILED, "gave up")
    skipped = []
    events.read("job", lambda number, line: skipped.append((number, line)))
    assert skipped == [(2, '{"id": "y", "time": 2, "job": "jo')]


def test_mlxops_events_names_the_skipped_line_on_stderr(home):
    from click.testing import CliRunner

    from mlxops.cli.events import command

    # A real job record (no supervisor: the timeline is the controller's own), since the
    # command reads the record to know where the timeline is written.
    shutil.copytree(DATA / "running", home / "jobs")
    events.record("tiny-lm", events.STARTED, "2 ranks")
    with open(events.path("tiny-lm"), "a") as handle:
        handle.write('{"torn')
    events.record("tiny-lm", events.FAILED, "gave up")
    result = CliRunner().invoke(command, ["tiny-lm"])
    assert result.exit_code == 0
    assert "line 2 is not an event (torn by a crash?)" in result.stderr
    assert "gave up" in result.stdout

"""The job record: the restart policy as one object, old records still load, the job as
launched is what a restart runs, and a user's stop survives a watchdog's writes.

The watchdog's restart runs here with ``launch`` and ``stop_job`` replaced by recorders:
what is tested is the record's side (what is checked, written and refused, and when);
tests/integration/test_job_stop_race.py runs the same race on real nodes.
"""

from __future__ import annotations

import json
import threading
from dataclasses import asdict, replace
from pathlib import Path

import pytest
import yaml

from mlxops import events
from mlxops.errors import MlxopsError, UserError
from mlxops.jobs import watch
from mlxops.jobs.placement import Rank
from mlxops.jobs.record import (
    HostRecord,
    JobRecord,
    JobStopped,
    Restart,
    inventory_hosts,
    launched_job,
    load_record,
    mark_stopped,
    record_path,
    update,
)
from mlxops.jobs.spec import JobSpec, RestartPolicy, load_job
from mlxops.node.protocol import FAILED, FINISHED, RUNNING, STOPPED, StopAnswer
from mlxops.transport import HostResult, Results

DATA = Path(__file__).parents[1] / "data" / "jobs"
TRAINER = {"model": {"dims": 32, "layers": 1, "heads": 2, "seq_len": 16},
           "train": {"steps": 100}}


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("MLXOPS_HOME", str(tmp_path / "home"))


def write_job(tmp_path: Path, **extra) -> Path:
    (tmp_path / "inv.yml").write_text(yaml.safe_dump(
        {"all": {"hosts": {"a": {"ansible_host": "10.0.0.1"}}}}))
    path = tmp_path / "job.yml"
    path.write_text(yaml.safe_dump({"name": "j", "inventory": "inv.yml", "trainer": TRAINER,
                                    "restart": {"max_restarts": 4, "stall_timeout": 20},
                                    **extra}))
    return path


def record_for(spec: JobSpec, **changes) -> JobRecord:
    """A record as launch writes it for ``spec``."""
    record = JobRecord(
        name=spec.name, job_file=str(spec.path), inventory=str(spec.inventory),
        backend=spec.backend, hosts=[HostRecord("a", "/r", "/py")],
        ranks=[Rank(0, "a", "10.0.0.1", 20000, 0)], restart=spec.restart,
        stop_grace=spec.stop_grace, job=launched_job(spec))
    return replace(record, **changes)


# --- the restart policy; records in a shape no mlxops writes ----------------------------------


def test_a_record_in_a_shape_no_release_wrote_is_refused_naming_the_file_and_field(tmp_path):
    """Version 0.1.0 is the first: a record with the policy's fields flat (a development
    shape) is not migrated but refused, naming the record and the field."""
    spec = load_job(write_job(tmp_path))
    record_for(spec).save()
    path = record_path("j")
    data = json.loads(path.read_text())
    data.update(data.pop("restart"))
    path.write_text(json.dumps(data))
    with pytest.raises(MlxopsError) as refused:
        load_record("j")
    assert str(path) in str(refused.value) and "'restart'" in str(refused.value)


def test_a_restart_needs_the_job_the_record_keeps(tmp_path):
    record = record_for(load_job(write_job(tmp_path)), job=None)
    with pytest.raises(MlxopsError, match=r"j/record\.json: the record keeps no copy of the job"):
        record.job_spec()


def test_the_record_holds_the_jobs_restart_policy(tmp_path):
    spec = load_job(write_job(tmp_path))
    record = record_for(spec)
    record.save()
    assert load_record("j").restart is not spec.restart
    assert load_record("j").restart == spec.restart == RestartPolicy(max_restarts=4,
                                                                     stall_timeout=20.0)


def test_the_watchdogs_interval_comes_from_the_policy():
    assert RestartPolicy(stall_timeout=60).interval == 2.0
    assert RestartPolicy(stall_timeout=6).interval == 0.6
    assert RestartPolicy(stall_timeout=1).interval == 0.5
    assert RestartPolicy(stall_timeout=60, poll_interval=7).interval == 7


# --- the job as launched ------------------------------------------------------------------------


def test_the_record_rebuilds_the_job_as_launched(tmp_path):
    spec = load_job(write_job(tmp_path, env={"A": "1"}, port=21000, stop_grace=3, blas="off"))
    record_for(spec).save()
    assert load_record("j").job_spec() == spec


def test_the_record_rebuilds_a_command_job_with_its_workdir(tmp_path):
    (tmp_path / "src").mkdir()
    path = write_job(tmp_path)
    job = yaml.safe_load(path.read_text())
    del job["trainer"]
    job.update(command=["python", "train.py", "--lr", "0.1"], workdir="src", hosts="a")
    path.write_text(yaml.safe_dump(job))
    spec = load_job(path)
    record_for(spec).save()
    again = load_record("j").job_spec()
    assert again == spec and isinstance(again.workdir, Path)


class Recorder:
    """``stop_job`` and ``launch`` for watch.restart, recording their calls."""

    def __init__(self, monkeypatch, on_launch=None, survivors=None):
        self.stopped: list[JobRecord] = []
        self.launched: list[JobSpec] = []
        self.excluded: list[list[str]] = []
        self.on_launch = on_launch
        self.survivors = survivors or {}  # host -> ranks still there after SIGKILL
        monkeypatch.setattr(watch, "stop_job", self.stop_job)
        monkeypatch.setattr(watch, "launch", self.launch)

    def stop_job(self, record, connector, **kwargs):
        assert kwargs == {"mark_stopped": False}  # the watchdog's stop is not the user's
        self.stopped.append(record)
        return Results({h: HostResult(h, FAILED, f"ranks {alive} survived SIGKILL",
                                      value=StopAnswer(alive, alive, alive, []))
                        for h, alive in self.survivors.items()})

    def launch(self, spec, connector, *, resume, exclude, previous, on_warning):
        assert resume and callable(on_warning)  # a node's unused kernel cache is an event
        self.launched.append(spec)
        self.excluded.append(list(exclude))
        if self.on_launch:
            self.on_launch()
        # As launch does: the new attempt's record, continuing the previous one.
        new = replace(previous, attempt=previous.attempt + 1, job=launched_job(spec),
                      restarts=list(previous.restarts), state=RUNNING)
        new.save()
        return new


def test_a_restart_runs_the_job_as_launched_not_the_edited_file(tmp_path, monkeypatch):
    path = write_job(tmp_path)
    spec = load_job(path)
    record = record_for(spec)
    record.save()
    edited = yaml.safe_load(path.read_text())
    edited["trainer"]["train"]["steps"] = 999
    edited["restart"]["max_restarts"] = 0
    path.write_text(yaml.safe_dump(edited))
    calls, events = Recorder(monkeypatch), []

    new = watch.restart(record, None, "rank 0 on a vanished", events.append)

    assert calls.launched == [spec]
    assert calls.launched[0].workload.config.train.steps == 100
    assert new.attempt == 2 and new.restart.max_restarts == 4
    assert [r.reason for r in load_record("j").restarts] == ["rank 0 on a vanished"]
    assert not any("re-reading" in e for e in events)


def test_a_record_without_the_job_is_refused_before_anything_is_stopped(tmp_path, monkeypatch):
    record = record_for(load_job(write_job(tmp_path)), job=None)
    record.save()
    calls, events = Recorder(monkeypatch), []
    with pytest.raises(MlxopsError, match="keeps no copy of the job"):
        watch.restart(record, None, "stalled", events.append)
    assert calls.stopped == [] and calls.launched == [] and events == []
    assert load_record("j").restarts == []


def test_a_rank_that_survives_sigkill_marks_its_node_needs_reboot_and_is_left_out(
        tmp_path, monkeypatch):
    record = record_for(load_job(write_job(tmp_path)))
    record.save()
    calls, said = Recorder(monkeypatch, survivors={"a": [0]}), []

    watch.restart(record, None, "rank 0 on a stalled", said.append)

    assert calls.excluded == [["a"]]          # never relaunched onto it
    now = load_record("j")
    assert now.needs_reboot == ["a"] and [h.name for h in now.stray] == ["a"]
    assert any("a needs reboot" in e for e in said), said
    [event] = [e for e in events.read("j") if e.kind == events.NEEDS_REBOOT]
    assert event.detail == {"host": "a", "ranks": [0]}


def test_a_job_that_cannot_go_on_without_the_wedged_node_says_it_needs_reboot(
        tmp_path, monkeypatch):
    record = record_for(load_job(write_job(tmp_path)))
    record.save()
    Recorder(monkeypatch, survivors={"a": [0]})

    def no_hosts_left(*args, **kwargs):
        raise UserError("no hosts left")

    monkeypatch.setattr(watch, "launch", no_hosts_left)
    with pytest.raises(MlxopsError, match="a needs reboot .* cannot go on without it"):
        watch.restart(record, None, "rank 0 on a stalled")
    assert load_record("j").needs_reboot == ["a"]


# --- two writers --------------------------------------------------------------------------------


def test_a_stop_before_the_restart_starts_anything_wins(tmp_path, monkeypatch):
    record = record_for(load_job(write_job(tmp_path)))
    record.save()
    mark_stopped("j")  # `mlxops stop` while the watchdog stops the ranks for its restart
    calls = Recorder(monkeypatch)
    with pytest.raises(JobStopped):
        watch.restart(record, None, "rank 0 on a vanished")
    assert calls.launched == []            # nothing started
    now = load_record("j")
    assert now.state == STOPPED and now.attempt == 1 and now.restarts == []


def test_a_stop_while_the_new_ranks_start_wins_and_they_are_stopped(tmp_path, monkeypatch):
    record = record_for(load_job(write_job(tmp_path)))
    record.save()
    calls = Recorder(monkeypatch, on_launch=lambda: mark_stopped("j"))
    events: list[str] = []
    with pytest.raises(JobStopped) as info:
        watch.restart(record, None, "rank 0 on a vanished", events.append)
    assert len(calls.launched) == 1
    # Stopped twice by the watchdog: the old ranks before the restart, then the new ones.
    assert [r.attempt for r in calls.stopped] == [1, 2]
    assert info.value.record.attempt == 2
    now = load_record("j")
    assert now.state == STOPPED and now.attempt == 1  # the new attempt was never recorded
    assert any("stopping them again" in e for e in events), events


def test_a_stale_record_cannot_undo_a_stop(tmp_path):
    record = record_for(load_job(write_job(tmp_path)))
    record.save()
    mark_stopped("j")
    record.message = "a watchdog that has not seen the stop"
    with pytest.raises(JobStopped):
        record.save()
    assert load_record("j").state == STOPPED
    # A reader that has seen it writes freely (resume continues a stopped job).
    seen = load_record("j")
    seen.state = RUNNING
    seen.save()
    assert load_record("j").state == RUNNING


def test_a_new_launch_of_the_name_replaces_a_stopped_record(tmp_path):
    spec = load_job(write_job(tmp_path))
    record_for(spec).save()
    mark_stopped("j")
    fresh = record_for(spec)  # launch --fresh: another job of the same name
    fresh.save()
    assert load_record("j").state == RUNNING


def test_stopping_a_finished_job_keeps_it_finished(tmp_path):
    record_for(load_job(write_job(tmp_path)), state=FINISHED).save()
    assert mark_stopped("j").state == FINISHED


def test_updates_from_many_writers_lose_nothing(tmp_path):
    record_for(load_job(write_job(tmp_path))).save()

    def writer(who: int) -> None:
        for i in range(25):
            update("j", lambda r, i=i: r.restarts.append(Restart(i, f"writer {who}", i)))

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(load_record("j").restarts) == 100
    assert not list(record_path("j").parent.glob(".record.*"))  # no temporary left behind


def test_a_change_that_raises_writes_nothing(tmp_path):
    record_for(load_job(write_job(tmp_path))).save()
    before = record_path("j").read_text()

    def change(record: JobRecord) -> None:
        record.state = FINISHED
        raise JobStopped(record)

    with pytest.raises(JobStopped):
        update("j", change)
    assert record_path("j").read_text() == before


def test_a_key_file_gone_since_launch_is_bad_input_before_connecting(tmp_path):
    spec = load_job(write_job(tmp_path))
    record = record_for(spec)
    inventory = {"all": {"hosts": {"a": {"ansible_host": "10.0.0.1",
                                         "ansible_ssh_private_key_file": "gone_key"}}}}
    (tmp_path / "inv.yml").write_text(yaml.safe_dump(inventory))
    with pytest.raises(UserError, match=r"inv\.yml: .*ansible_ssh_private_key_file"):
        inventory_hosts(record)


def test_a_restart_is_a_record_that_round_trips_and_names_what_is_missing(tmp_path):
    restart = Restart(time=1700000000.5, reason="rank 1 on a exited with code 137", attempt=2)
    record_for(load_job(write_job(tmp_path)), restarts=[restart]).save()
    data = json.loads(record_path("j").read_text())
    assert data["restarts"] == [asdict(restart)]
    assert load_record("j").restarts == [restart]
    for name in ("time", "reason", "attempt"):
        partial = {k: v for k, v in asdict(restart).items() if k != name}
        with pytest.raises(ValueError, match=rf"^restarts\[0\]: missing field '{name}'$"):
            Restart.from_dict(partial, "restarts[0]")
    data["restarts"][0].pop("reason")
    record_path("j").write_text(json.dumps(data))
    with pytest.raises(MlxopsError, match=r"record.json: unreadable job record: "
                                          r"restarts\[0\]: missing field 'reason'$"):
        load_record("j")


def test_status_shows_a_node_that_needs_reboot_in_text_and_json(tmp_path):
    from mlxops import console
    from mlxops.cli.watch import print_status
    from mlxops.jobs.status import JobStatus, classify

    record = record_for(load_job(write_job(tmp_path)), needs_reboot=["a"], stray=[],
                        ranks=[])
    status = classify(record, {}, {})
    assert status.to_dict()["needs_reboot"] == ["a"]
    assert "needs_reboot" not in JobStatus("j", RUNNING, []).to_dict()
    with console.out.capture() as captured:
        print_status(status)
    text = captured.get()
    assert "a needs reboot" in text and "survived SIGKILL" in text
    assert "left behind while unreachable" not in text

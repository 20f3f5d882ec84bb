"""Notifications (mlxops/notify, docs/job-file.md "Notifications"): a real HTTP receiver on
loopback and a real command; each event delivered once per target, retried, given up
without harm, and never held up by another target that hangs."""

from __future__ import annotations

import json
import sys
import time
from types import SimpleNamespace

import pytest

from mlxops import events
from mlxops.devtools.webhook import Receiver
from mlxops.errors import UserError
from mlxops.jobs.notifying import job_notify
from mlxops.notify import config as notify_config
from mlxops.notify.config import NotifyConfig, parse_section
from mlxops.notify.deliver import GAVE_UP, SENDING, SENT, Ledger, Notifier


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("MLXOPS_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


@pytest.fixture
def receiver():
    made = []

    def make(**kw):
        made.append(Receiver(**kw))
        return made[-1]

    yield make
    for r in made:
        r.close()


def command_to(path):
    """A command that appends its stdin (and the kind from its environment) to ``path``."""
    code = ("import os, sys; open(sys.argv[1], 'a').write("
            "os.environ['MLXOPS_EVENT_KIND'] + ' ' + sys.stdin.read() + '\\n')")
    return (sys.executable, "-c", code, str(path))


def wait_for(check, timeout=20.0):
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def kinds(name="job", kind=None):
    return [e.detail.get("event_kind") for e in events.read(name) if e.kind == kind]


def test_each_event_reaches_each_target_once(home, receiver, tmp_path):
    hook = receiver()
    out = tmp_path / "command.out"
    events.start_run(events.make("job", events.STARTED, "2 ranks", attempt=1))
    restarted = events.record("job", events.RESTARTED, "rank 1 on n2 exited with code 137",
                              attempt=1)
    config = NotifyConfig(command=command_to(out), webhook=hook.url)
    notifier = Notifier("job", config, poll=0.02).start()
    finished = events.record("job", events.FINISHED, "every rank finished", attempt=2)
    notifier.nudge()
    wait_for(lambda: len(kinds(kind=events.NOTIFIED)) == 4)
    notifier.close()
    # `started` is not among the default events; the others went to both targets once.
    assert hook.kinds() == ["restarted", "finished"]
    assert hook.bodies[0][1]["id"] == restarted.id and hook.bodies[0][1]["text"] == (
        "mlxops: job: restarted: rank 1 on n2 exited with code 137")
    lines = out.read_text().splitlines()
    assert [line.split(" ", 1)[0] for line in lines] == ["restarted", "finished"]
    assert json.loads(lines[1].split(" ", 1)[1])["id"] == finished.id
    ledger = Ledger("job")
    assert ledger.state(restarted.id, "webhook") == SENT == ledger.state(finished.id, "command")
    # A later watchdog's notifier finds nothing left to send.
    again = Notifier("job", config, poll=0.02).start()
    time.sleep(0.3)
    again.close()
    assert len(hook.bodies) == 2 and len(out.read_text().splitlines()) == 2


def test_a_failing_webhook_is_retried_with_back_off(home, receiver):
    hook = receiver(codes=[500, 503])
    events.record("job", events.FAILED, "gave up after 3 restarts", attempt=4)
    notifier = Notifier("job", NotifyConfig(webhook=hook.url, retries=3), backoff=0.05,
                        poll=0.02).start()
    wait_for(lambda: kinds(kind=events.NOTIFIED) == ["failed"])
    notifier.close()
    assert len(hook.bodies) == 3
    [sent] = [e for e in events.read("job") if e.kind == events.NOTIFIED]
    assert sent.detail["attempts"] == 3 and sent.message == "failed sent to the webhook (HTTP 200)"


def test_a_dead_webhook_is_given_up_logged_and_harmless(home, tmp_path):
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}/hook"
    out = tmp_path / "command.out"
    logged: list[str] = []
    alert = events.record("job", events.ALERT, "n1: memory 95% in use", attempt=1)
    notifier = Notifier("job", NotifyConfig(command=command_to(out), webhook=dead, retries=2),
                        backoff=0.01, poll=0.02, log=logged.append).start()
    wait_for(lambda: kinds(kind=events.NOTIFY_FAILED) == ["alert"])
    wait_for(lambda: kinds(kind=events.NOTIFIED) == ["alert"])
    notifier.close()
    [failed] = [e for e in events.read("job") if e.kind == events.NOTIFY_FAILED]
    assert failed.detail["attempts"] == 3 and failed.detail["target"] == "webhook"
    assert "refused" in failed.detail["error"].lower()
    assert logged == [f"notify: {failed.message}"]
    assert Ledger("job").state(alert.id, "webhook") == GAVE_UP
    assert out.read_text().startswith("alert ")


def test_a_hanging_webhook_holds_up_nothing_else_and_is_never_sent_twice(home, receiver,
                                                                         tmp_path):
    hook = receiver(hang=True)
    out = tmp_path / "command.out"
    stalled = events.record("job", events.STALLED, "rank 0 on n1: no progress for 61s")
    config = NotifyConfig(command=command_to(out), webhook=hook.url, timeout=60)
    notifier = Notifier("job", config, poll=0.02).start()
    wait_for(lambda: out.exists() and len(hook.bodies) == 1)  # the command went out meanwhile
    began = time.monotonic()
    notifier.close(timeout=0.5)
    assert time.monotonic() - began < 2
    assert Ledger("job").state(stalled.id, "webhook") == SENDING
    # Whether it arrived is unknown: a later notifier does not send it again.
    hook.release.set()
    again = Notifier("job", config, poll=0.02).start()
    time.sleep(0.3)
    again.close()
    assert len(hook.bodies) == 1


def test_a_missing_command_is_a_failure_with_its_reason(home, tmp_path):
    events.record("job", events.FINISHED, "every rank finished")
    notifier = Notifier("job", NotifyConfig(command=(str(tmp_path / "no-such-hook"),),
                                            retries=0), poll=0.02).start()
    wait_for(lambda: kinds(kind=events.NOTIFY_FAILED) == ["finished"])
    notifier.close()
    [failed] = [e for e in events.read("job") if e.kind == events.NOTIFY_FAILED]
    assert "No such file" in failed.detail["error"]


# --- the settings: a job's notify: over the inventory's mlxops_notify -------------------------


def host(name, default):
    return SimpleNamespace(name=name, var=lambda _: default)


DEFAULT = notify_config.parse_default({"webhook": "https://hooks.example.com/T0/B0"})


def test_a_jobs_section_is_read_over_the_inventory_default_key_by_key(tmp_path):
    hosts = [host("n1", DEFAULT), host("n2", DEFAULT)]
    job = tmp_path / "job.yml"
    config = job_notify(job, parse_section({"events": ["failed"]}), hosts, tmp_path / "inv.yml")
    assert config == NotifyConfig(webhook="https://hooks.example.com/T0/B0", events=("failed",))
    assert job_notify(job, None, hosts, tmp_path / "inv.yml") == DEFAULT
    assert job_notify(job, parse_section(False), hosts, tmp_path / "inv.yml") is None
    assert job_notify(job, None, [host("n1", None)], tmp_path / "inv.yml") is None


def test_a_section_that_names_no_target_or_hosts_that_disagree_are_refused(tmp_path):
    job, inventory = tmp_path / "job.yml", tmp_path / "inv.yml"
    with pytest.raises(UserError) as no_target:
        job_notify(job, parse_section({"events": ["failed"]}), [host("n1", None)],
                   inventory)
    assert str(no_target.value) == (f"{job}: notify: says where to send nothing: give "
                                    "command: or webhook:")
    with pytest.raises(UserError) as differ:
        job_notify(job, None, [host("n1", DEFAULT), host("n2", None)], inventory)
    assert str(differ.value) == (f"{inventory}: mlxops_notify: differs between the hosts of "
                                 "one job (n1, n2): set it once, under all: vars")


def test_a_jobs_section_is_parsed_once_and_the_record_keeps_it_typed(tmp_path, monkeypatch):
    """``notify:`` is a typed value on the spec (parsed at load), kept in the record as
    the job file wrote it and read back as the same value for the watchdog."""
    import yaml

    from mlxops.jobs.record import JobRecord, launched_job
    from mlxops.jobs.spec import load_job
    from mlxops.notify.config import NotifySection

    monkeypatch.setenv("MLXOPS_HOME", str(tmp_path / "home"))
    (tmp_path / "inv.yml").write_text(yaml.safe_dump({"all": {"hosts": {"a": {}}}}))
    for section, want in [
            ({"command": "notify-send 'job' ", "events": ["failed", "failed"], "retries": 0},
             NotifySection(command=("notify-send", "job"), events=("failed",), retries=0)),
            (False, NotifySection(off=True)), (None, None)]:
        (tmp_path / "job.yml").write_text(yaml.safe_dump(
            {"name": "j", "inventory": "inv.yml", "command": "true", "notify": section}))
        spec = load_job(tmp_path / "job.yml")
        assert spec.notify == want
        record = JobRecord(name="j", job_file=str(spec.path), inventory=str(spec.inventory),
                           backend="ring", hosts=[], ranks=[], job=launched_job(spec))
        again = JobRecord.from_dict(json.loads(json.dumps(record.to_dict())))
        assert again.job_spec().notify == want
    assert notify_config.resolve(NotifySection(webhook="https://h.example.com/x"), DEFAULT
                                 ) == NotifyConfig(webhook="https://h.example.com/x")
    with pytest.raises(notify_config.NotifyError, match="says where to send nothing"):
        notify_config.resolve(NotifySection(events=("failed",)), None)

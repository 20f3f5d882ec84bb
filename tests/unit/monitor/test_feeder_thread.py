"""The watchdog's feeder (mlxops.monitor.mirror.Feeder): a regular feed asks every host,
and one that does not answer (a Mac asleep) costs a timeout, so it runs in a thread of its
own, a feed on a problem too; the feed at the end waits for one under way, then runs in
the watchdog's thread.
Events and their order, with the feed itself replaced by one that waits to be let go."""

from __future__ import annotations

import threading

import pytest

from mlxops.jobs.status import JobStatus, RankStatus
from mlxops.monitor import mirror


@pytest.fixture
def feeds(monkeypatch):
    """Each feed's (thread name, status state), once it is let go."""
    done: list[tuple[str, str]] = []
    go = threading.Event()

    def slow_feed(record, connector, *, status, hosts):
        go.wait(10)
        done.append((threading.current_thread().name, status.state))

    monkeypatch.setattr(mirror, "feed", slow_feed)
    monkeypatch.setattr(mirror, "load_record", lambda name: object())
    monkeypatch.setattr(mirror, "inventory_hosts", lambda record: {})
    return done, go


def status(state: str = "running", message: str = "") -> JobStatus:
    return JobStatus(name="j", state=state, ranks=[], message=message)


def test_a_regular_feed_does_not_hold_the_watchdog(feeds):
    done, go = feeds
    feeder = mirror.Feeder("j", connector=None, interval=0.0)
    feeder.on_status(status())          # returns while the feed still waits
    assert done == []
    feeder.on_status(status())          # one under way: this one is skipped, not queued
    go.set()
    feeder._thread.join(10)
    assert done == [("mlxops-feed-j", "running")]


def test_a_feed_at_the_end_waits_for_the_one_under_way_then_runs_in_the_caller(feeds):
    done, go = feeds
    feeder = mirror.Feeder("j", connector=None, interval=0.0)
    feeder.on_status(status())
    threading.Timer(0.05, go.set).start()
    feeder.on_status(status("finished"))
    assert done == [("mlxops-feed-j", "running"), (threading.current_thread().name, "finished")]


def test_a_problem_is_fed_at_once_but_not_in_the_watchdogs_thread(feeds):
    done, go = feeds
    feeder = mirror.Feeder("j", connector=None, interval=3600.0)
    feeder.on_status(status())
    go.set()
    feeder.wait()
    problem = JobStatus(name="j", state="failed", ranks=[RankStatus(1, "b", "failed")])
    assert problem.problem == "rank 1 on b vanished"
    feeder.on_status(problem)            # due at once (the interval is an hour) ...
    feeder.wait()
    assert done[-1] == ("mlxops-feed-j", "failed")   # ... in the feeder's own thread


def test_a_bug_in_a_feed_is_raised_in_the_watchdogs_thread(monkeypatch):
    def broken(record, connector, *, status, hosts):
        raise KeyError("x")

    monkeypatch.setattr(mirror, "feed", broken)
    monkeypatch.setattr(mirror, "load_record", lambda name: object())
    monkeypatch.setattr(mirror, "inventory_hosts", lambda record: {})
    feeder = mirror.Feeder("j", connector=None, interval=0.0)
    feeder.on_status(status())
    feeder._thread.join(10)
    with pytest.raises(KeyError):
        feeder.on_status(status())

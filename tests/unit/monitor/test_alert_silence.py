"""The heartbeat alert is for silence only (mlxops/monitor/alerts.py): a rank that has not
made its first step is starting (the report of the demo showed "no heartbeat for 33s" for
all three ranks while the first step compiled its kernels, 40 s cold on a node); the
watchdog's start_timeout judges it, and once that calls it stalled it is alerted."""

from __future__ import annotations

from mlxops.monitor.alerts import evaluate

LIMITS = {"heartbeat_age": 30.0}


def sample(*ranks):
    return {"state": "running", "ranks": [
        {"rank": i, "host": "node1", "state": state, "step": step, "heartbeat_age": age}
        for i, (state, step, age) in enumerate(ranks)]}


def kinds(found):
    return [(a["kind"], a["rank"]) for a in found]


def test_a_rank_compiling_its_first_step_is_not_silent():
    assert evaluate(LIMITS, sample(("running", None, 33.0)), []) == []


def test_a_rank_quiet_after_its_steps_or_stalled_at_start_is_alerted():
    found = evaluate(LIMITS, sample(("running", 12, 33.0), ("stalled", None, 301.0)), [])
    assert kinds(found) == [("heartbeat_age", 0), ("heartbeat_age", 1)]
    assert "no heartbeat for 33s" in found[0]["message"]

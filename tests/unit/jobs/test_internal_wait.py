"""An internal job's wait (mlxops/jobs/internal.py): its looks thin out while the job runs
(each is a status on every host, on the cores the ranks need), and the end is still seen."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from mlxops.errors import MlxopsError
from mlxops.jobs import internal
from mlxops.node.protocol import FAILED, FINISHED, RUNNING


def test_the_waits_grow_by_half_up_to_two_seconds():
    waits, wait = [], 0.3
    for _ in range(8):
        waits.append(round(wait, 3))
        wait = internal.next_poll(wait, 0.3)
    assert waits == [0.3, 0.45, 0.675, 1.012, 1.519, 2.0, 2.0, 2.0]
    # A first wait longer than the cap stays what the caller asked for.
    assert internal.next_poll(5.0, 5.0) == 5.0


def _statuses(monkeypatch, states: list[tuple[str, int | None]]) -> list[float]:
    """``job_status`` answers ``states`` in turn; the sleeps between looks, recorded."""
    answers = iter(states)
    monkeypatch.setattr(internal, "job_status", lambda record, connector: SimpleNamespace(
        **dict(zip(("state", "step"), next(answers), strict=True)), unreachable={},
        problem="rank 1 died",
        message=None))
    slept: list[float] = []
    monkeypatch.setattr(internal.time, "sleep", slept.append)
    return slept


def test_a_job_that_runs_is_looked_at_less_and_less_until_it_ends(monkeypatch):
    slept = _statuses(monkeypatch, [(RUNNING, None)] * 6 + [(RUNNING, 1), (FINISHED, 1)])
    steps: list[int] = []
    internal.wait_until_ended(None, None, poll=0.3, failed=MlxopsError, on_step=steps.append)
    assert [round(s, 3) for s in slept] == [0.3, 0.45, 0.675, 1.012, 1.519, 2.0, 2.0]
    assert steps == [1]


def test_a_job_that_fails_ends_the_wait_with_its_problem(monkeypatch):
    _statuses(monkeypatch, [(RUNNING, None), (FAILED, None)])
    with pytest.raises(MlxopsError, match="^failed: rank 1 died$"):
        internal.wait_until_ended(None, None, poll=0.5, failed=MlxopsError)

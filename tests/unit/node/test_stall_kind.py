"""A stalled rank told apart: its CPU busy (a collective spinning on a lost peer) or idle
(a collective waiting forever). The node reads it from its process table (a process of
the rank's group in state R: running; every one asleep, S: idle), Linux's /proc or BSD
ps alike; the watchdog's problem, the STALLED event and notifications carry it."""

from __future__ import annotations

import os

from mlxops.jobs.status import JobStatus, RankStatus
from mlxops.node.procs import group_running
from mlxops.node.protocol import RUNNING, STALLED


def table(*states):
    """A rank's script (the group leader, asleep in wait) and its Python in ``states``."""
    leader = os.getpid()
    return [(leader, 1, leader, "S", "sh"),
            *((leader + 1 + i, leader, leader, s, "python3") for i, s in enumerate(states))]


def test_a_group_with_a_running_process_is_busy_and_one_asleep_is_idle():
    pid = os.getpid()
    assert group_running(pid, table("R")) is True
    assert group_running(pid, table("S")) is False
    assert group_running(pid, table("Z")) is False        # a zombie runs nothing
    assert group_running(None, table("R")) is None
    assert group_running(pid, table("T")) is None          # stopped: neither


def stalled(busy):
    return JobStatus("j", RUNNING, [
        RankStatus(0, "mac1", RUNNING, heartbeat_age=2.0),
        RankStatus(1, "mac2", STALLED, heartbeat_age=75.0, busy=busy)])


def test_the_problem_says_which_stall():
    assert stalled(True).problem == ("rank 1 on mac2 made no progress for 75s (stalled, "
                                     "its CPU busy: a collective spinning on a lost peer?)")
    assert stalled(False).problem == ("rank 1 on mac2 made no progress for 75s (stalled, "
                                      "idle: a collective waiting forever?)")
    assert stalled(None).problem == "rank 1 on mac2 made no progress for 75s (stalled)"

"""Why ranks failed: the node's reader of a failed rank's log (mlxops.node.failure), fed
logs recorded from real failing ranks (data/jobs/rank_failures.yml) through the node's own
``status`` command, and the controller's grouping of the reasons (one line per cause)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from node_answers import Processes, answers

from mlxops.jobs.placement import Rank
from mlxops.jobs.record import HostRecord, JobRecord
from mlxops.jobs.spec import RestartPolicy
from mlxops.jobs.status import (
    RankStatus,
    cause_of,
    classify,
    same_cause,
    where,
    why_failed,
)
from mlxops.node import protocol
from mlxops.node.failure import (
    MAX_CHARS,
    TAIL_BYTES,
    failure_line,
    one_line,
    read_failure,
    this_attempt,
)

LOGS = yaml.safe_load((Path(__file__).parents[1] / "data" / "jobs" / "rank_failures.yml")
                      .read_text())


def failed_rank(log: str, exit_code: int | None, ended: float = 10) -> dict:
    """A node's description (node_answers) of a rank that ran and ended with ``log``."""
    about = {"pid": "dead", "started": 60, "log": log}
    if exit_code is not None:
        about.update(exit=exit_code, ended=ended)
    return about


@pytest.mark.parametrize("name", sorted(LOGS))
def test_the_node_says_why_a_rank_failed_from_its_log(name, tmp_path):
    case = LOGS[name]
    assert case["source"]
    with Processes() as procs:
        got, _ = answers(tmp_path, {"a": {"ranks": {0: failed_rank(case["log"], case["exit"])}}},
                         procs)
    assert got["a"].rank(0).failure == case["why"]
    assert case["why"] is None or "\n" not in case["why"] and len(case["why"]) <= MAX_CHARS


def test_a_running_or_finished_rank_has_no_failure(tmp_path):
    traceback = LOGS["ring_peer_lost"]["log"]
    with Processes() as procs:
        got, _ = answers(tmp_path, {"a": {"ranks": {
            0: {"pid": "alive", "log": traceback},           # still running
            1: {"pid": "dead", "exit": 0, "log": traceback},  # finished
        }}}, procs)
    assert [r.failure for r in got["a"].ranks] == [None, None]


def test_a_rank_whose_exit_is_recorded_is_said_by_its_log_while_its_script_ends(tmp_path):
    """The start script records the exit code after the program ended, then exits: a status
    read between the two (or whose process table was read before the exit file appeared)
    sees the script alive and the exit code. The log is whole then: its line is the reason,
    not "exited with code 1" (which made that rank a cause of its own)."""
    case = LOGS["ring_peer_lost"]
    with Processes() as procs:
        got, _ = answers(tmp_path, {"a": {"ranks": {
            0: {"pid": "alive", "exit": 1, "ended": 0, "log": case["log"]}}}}, procs)
    assert got["a"].rank(0).alive and got["a"].rank(0).exit == 1
    assert got["a"].rank(0).failure == case["why"]


def test_only_this_attempts_part_of_the_log_counts():
    first = LOGS["compile_in_another_users_mlx_dir"]["log"]  # ends in a traceback
    killed = LOGS["killed_by_sigkill"]["log"]
    config = LOGS["trainer_config_error"]["log"]
    start = f"{protocol.START_LINE} (pid 4242)\n"
    # The next attempt was killed: the earlier traceback is not its reason.
    assert failure_line(this_attempt(first + start + killed), 137) is None
    assert failure_line(this_attempt(first + start + config), 2) == (
        LOGS["trainer_config_error"]["why"])


def test_a_long_log_is_read_from_its_end(tmp_path):
    log = tmp_path / "rank-0.log"
    steps = LOGS["killed_by_sigkill"]["log"].splitlines()[1]
    bulk = (steps + "\n") * (3 * TAIL_BYTES // len(steps))
    log.write_text(LOGS["compile_in_another_users_mlx_dir"]["log"] + bulk
                   + LOGS["ring_peer_lost"]["log"].split(protocol.START_LINE)[1])
    assert log.stat().st_size > 3 * TAIL_BYTES
    # The start line is far back: everything read is this attempt's.
    assert read_failure(log, 1) == LOGS["ring_peer_lost"]["why"]
    log.write_text(LOGS["ring_peer_lost"]["log"] + bulk)
    assert read_failure(log, 137) is None
    assert read_failure(tmp_path / "missing.log", 1) is None


def test_one_line_keeps_the_start_and_the_end_of_a_long_reason():
    words = [f"w{i:03d}" for i in range(200)]
    line = one_line(["Error: " + " ".join(words[:100]), "  " + " ".join(words[100:])])
    assert len(line) <= MAX_CHARS and " ... " in line
    assert line.startswith("Error: w000 w001") and line.endswith("w198 w199")
    assert one_line(["RuntimeError:   a\n", "   b"]) == "RuntimeError: a b"


def record(hosts: list[str]) -> JobRecord:
    return JobRecord(
        name="j", job_file="j.yml", inventory="inv.yml", backend="ring",
        hosts=[HostRecord(h, "/r", "/py") for h in hosts],
        ranks=[Rank(i, h, f"10.0.0.{i + 1}", 5000 + i, 0) for i, h in enumerate(hosts)],
        state="running", restart=RestartPolicy(stall_timeout=10))


def test_each_distinct_reason_is_said_once_with_the_ranks_that_share_it(tmp_path):
    """The four ranks of the recorded 4-node run: two whose compile failed (each with its
    own random file name), two that then lost their ring peer. Their exit files may say
    the peers ended first (they exit as fast as the rank they lost): the watchdog's reason
    is still the compile failure of the rank that ended first of those two."""
    logs = ["compile_in_another_users_mlx_dir", "compile_on_another_node", "ring_peer_lost",
            "ring_peer_lost_other_side"]
    ended = [20, 30, 40, 40]
    hosts = {f"node{i + 1}": {"ranks": {i: failed_rank(LOGS[name]["log"], 1, ended[i])}}
             for i, name in enumerate(logs)}
    with Processes() as procs:
        got, unreachable = answers(tmp_path, hosts, procs)
    status = classify(record(list(hosts)), got, unreachable)
    assert status.state == protocol.FAILED
    compile_failed, peers_lost = status.failures
    assert compile_failed.why == LOGS[logs[0]]["why"]  # rank 0's words, for both
    assert compile_failed.ranks == [(0, "node1"), (1, "node2")]
    assert peers_lost.why == "RuntimeError: [ring] connection to a peer was lost"
    assert peers_lost.ranks == [(2, "node3"), (3, "node4")]
    assert status.problem == (f"rank 1 on node2 exited with code 1: {LOGS[logs[1]]['why']} "
                              "(also node1 r0)")
    assert status.to_dict()["failures"][1] == {
        "why": peers_lost.why, "ranks": [{"rank": 2, "host": "node3"},
                                         {"rank": 3, "host": "node4"}]}


def test_a_rank_without_a_line_is_said_by_its_exit_code(tmp_path):
    hosts = {"a": {"ranks": {0: failed_rank(LOGS["killed_by_sigkill"]["log"], 137)}},
             "b": {"ranks": {1: failed_rank(LOGS["killed_by_sigkill"]["log"], None)}}}
    with Processes() as procs:
        got, unreachable = answers(tmp_path, hosts, procs)
    status = classify(record(["a", "b"]), got, unreachable)
    assert [(f.why, f.ranks) for f in status.failures] == [
        ("killed by signal 9 (SIGKILL)", [(0, "a")]),
        ("gone without an exit code (killed with its start script)", [(1, "b")])]
    assert status.problem == "rank 0 on a exited with code 137"  # no line: as before


def test_why_failed_where_and_same_cause():
    def rank(exit_code, failure=None):
        return RankStatus(0, "a", protocol.FAILED, exit=exit_code, failure=failure)

    assert why_failed(rank(3)) == "exited with code 3"
    assert why_failed(rank(128 + 31)) == "killed by signal 31"  # numbered unlike on Linux
    assert why_failed(rank(1, "error: x")) == "error: x"
    assert where([(3, "b"), (0, "a"), (1, "a"), (2, "b"), (5, "a")]) == "a r0-1, b r2-3, a r5"
    assert where([(0, "a")]) == "a r0"
    assert same_cause("tmp_3d875d5c.cpp on node3, pid 42") == same_cause(
        "tmp_e095b3d1.cpp on node4, pid 4242")
    assert same_cause("[ring] connection lost") != same_cause("[ring] Couldn't connect")
    # Without a line, the exit code is the reason, exactly.
    assert cause_of(rank(3)) != cause_of(rank(4))
    assert cause_of(rank(1, "error: pid 42")) == cause_of(rank(2, "error: pid 43"))

"""The watch channel: its message (round trip), the node helper that sends it (a real
``python -m mlxops.node watch`` over a pipe, on run directories with real processes), and
the controller's side (:mod:`mlxops.jobs.channel`) on scripted connections.

Ordering and event tests, not timings: the helper's beat is set to an hour wherever a test
needs every message after the first to be caused by a change.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from node_answers import Processes, make_run_dir, node_status

from mlxops.errors import InternalError
from mlxops.jobs.channel import Channels, Heard, Lost, Unheard, aged
from mlxops.jobs.placement import Rank
from mlxops.jobs.record import HostRecord, JobRecord
from mlxops.jobs.spec import RestartPolicy
from mlxops.jobs.status import classify
from mlxops.node import protocol
from mlxops.node.protocol.channel import (
    ChannelMessage,
    ChannelRequest,
    parse_message,
    parse_request,
)
from mlxops.transport import CommandResult, HostUnreachable

ROOT = Path(__file__).resolve().parents[3]


def status_of(tmp_path: Path, host: dict) -> protocol.StatusAnswer:
    run_dir = tmp_path / "runs" / "j"
    with Processes() as procs:
        make_run_dir(run_dir, host, procs)
        return node_status(run_dir)


# --- the message ---------------------------------------------------------------------------

def test_a_message_round_trips_through_its_line(tmp_path):
    answer = status_of(tmp_path, {"ranks": {0: {"pid": "alive", "progress": {"age": 1, "step": 3}},
                                            1: {"pid": "dead", "exit": 137}}})
    message = ChannelMessage(seq=4, changed=[1], status=answer)
    line = message.line()
    assert line.endswith("\n") and "\n" not in line[:-1]
    assert parse_message(line) == message


def test_a_mpi_launcher_and_its_key_round_trip(tmp_path):
    answer = status_of(tmp_path, {"launcher": {"pid": "alive"}, "ranks": {0: {}}})
    message = ChannelMessage(seq=0, changed=[0, protocol.LAUNCHER], status=answer)
    assert parse_message(message.line()) == message


def test_a_message_of_another_shape_names_the_field(tmp_path):
    doc = ChannelMessage(seq=0, changed=[], status=status_of(tmp_path, {})).to_dict()
    del doc["status"]["ranks"]
    with pytest.raises(protocol.ProtocolError, match=r"watch: ChannelMessage.status: no 'ranks'"):
        parse_message(json.dumps(doc))
    with pytest.raises(protocol.ProtocolError, match="watch: not JSON"):
        parse_message("Traceback (most recent call last):")


def test_the_node_parses_the_command_the_controller_builds():
    args = protocol.parser().parse_args(protocol.watch_args("/r/runs/j", tick=0.2, beat=5))
    assert (args.cmd, args.run_dir, args.tick, args.beat) == ("watch", "/r/runs/j", 0.2, 5.0)


# --- the node helper -----------------------------------------------------------------------

class Helper:
    """``python -m mlxops.node watch`` on a run directory, read line by line."""

    def __init__(self, run_dir: Path, beat: float = 3600.0):
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "mlxops.node", *protocol.watch_args(
                str(run_dir), tick=0.02, beat=beat)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, text=True)

    def next(self) -> ChannelMessage:
        line = self.proc.stdout.readline()
        assert line, f"the helper ended (exit {self.proc.wait()})"
        return parse_message(line)

    def end(self) -> int:
        self.proc.stdin.close()  # what closing the SSH channel does to it
        return self.proc.wait(timeout=30)


def test_the_helper_reports_a_kill_9_at_once_and_ends_with_its_stdin(tmp_path):
    run_dir = tmp_path / "runs" / "j"
    with Processes() as procs:
        make_run_dir(run_dir, {"ranks": {0: {"pid": "alive"}, 1: {"pid": "alive"}}}, procs)
        helper = Helper(run_dir)
        first = helper.next()
        assert (first.seq, first.changed) == (0, [])
        assert [r.alive for r in first.status.ranks] == [True, True]
        os.kill(procs.live[1].pid, signal.SIGKILL)  # a zombie until reaped: still dead
        # With an hour between beats, the next message can only be the change.
        message = helper.next()
        assert (message.seq, message.changed) == (1, [1])
        assert [r.alive for r in message.status.ranks] == [True, False]
        assert message.status.ranks[1].exit is None    # vanished: no exit code written
        assert helper.end() == 0


def test_the_helper_reports_an_exit_code_and_a_new_rank(tmp_path):
    run_dir = tmp_path / "runs" / "j"
    with Processes() as procs:
        make_run_dir(run_dir, {"ranks": {0: {"pid": "alive"}}}, procs)
        helper = Helper(run_dir)
        helper.next()
        (run_dir / "rank-0.exit").write_text("3\n")      # as the rank's script writes it
        message = helper.next()
        assert message.changed == [0] and message.status.ranks[0].exit == 3
        (run_dir / "rank-1.sh").write_text("exit 0\n")   # a rank spawned since
        (run_dir / "rank-1.pid").write_text(f"{procs.alive()}\n")
        message = helper.next()
        assert 1 in message.changed and [r.rank for r in message.status.ranks] == [0, 1]
        assert helper.end() == 0


def test_a_stop_request_stops_the_ranks_and_the_helper_says_so(tmp_path):
    run_dir = tmp_path / "runs" / "j"
    with Processes() as procs:
        make_run_dir(run_dir, {"ranks": {0: {"pid": "alive"}, 1: {"pid": "alive"}}}, procs)
        helper = Helper(run_dir)
        helper.next()
        helper.proc.stdin.write(ChannelRequest(stop=5.0).line() + "\n")
        helper.proc.stdin.flush()
        message = helper.next()
        assert message.changed == [0, 1]
        assert [r.alive for r in message.status.ranks] == [False, False]
        assert message.status.stopped  # as the stop command marks it
        assert [p.wait(timeout=10) for p in procs.live] == [-signal.SIGTERM] * 2
        assert helper.end() == 0


def test_a_request_sent_just_before_the_end_is_still_carried_out(tmp_path):
    run_dir = tmp_path / "runs" / "j"
    with Processes() as procs:
        make_run_dir(run_dir, {"ranks": {0: {"pid": "alive"}}}, procs)
        helper = Helper(run_dir)
        helper.next()
        helper.proc.stdin.write(ChannelRequest(stop=5.0).line() + "\n")
        assert helper.end() == 0    # the request, then EOF: what closing the channel sends
        assert procs.live[0].wait(timeout=10) == -signal.SIGTERM


def test_the_helper_beats_when_nothing_changes(tmp_path):
    run_dir = tmp_path / "runs" / "j"
    with Processes() as procs:
        make_run_dir(run_dir, {"ranks": {0: {"pid": "alive"}}}, procs)
        helper = Helper(run_dir, beat=0.05)
        seen = [helper.next() for _ in range(3)]
        assert [m.seq for m in seen] == [0, 1, 2] and all(m.changed == [] for m in seen)
        assert helper.end() == 0


# --- the controller's side -----------------------------------------------------------------

def record(hosts=("a", "b")) -> JobRecord:
    return JobRecord(
        name="j", job_file="j.yml", inventory="inv.yml", backend="ring",
        hosts=[HostRecord(h, "/r", "/py") for h in hosts],
        ranks=[Rank(i, h, f"10.0.0.{i + 1}", 5000 + i, 0) for i, h in enumerate(hosts)],
        state="running", restart=RestartPolicy(stall_timeout=10, start_timeout=30))


class Host:
    def __init__(self, name: str):
        self.name = name


class Stream:
    """A scripted channel: each item a line, an exception to raise, or None (it ended)."""

    def __init__(self, script: list):
        self.script = list(script)
        self.closed = False
        self.sent: list[str] = []

    def send(self, text: str) -> None:
        self.sent.append(text)

    def read_line(self, timeout: float):
        if not self.script:
            while not self.closed:   # says nothing more until closed
                time.sleep(0.01)
            return None
        item = self.script.pop(0)
        if isinstance(item, BaseException):
            raise item
        return item

    def close(self) -> None:
        self.closed = True


class Conn:
    """A connection whose channels and ``status`` asks follow scripts, logging each call."""

    def __init__(self, name: str, streams: list, asks: list, log: list):
        self.name, self.streams, self.asks, self.log = name, streams, asks, log

    def stream(self, command: str):
        assert "mlxops.node watch --run-dir /r/runs/j" in command
        self.log.append((self.name, "stream"))
        item = self.streams.pop(0) if self.streams else Stream([])
        if isinstance(item, BaseException):
            raise item
        return item

    def run(self, command: str, *, timeout=None, stdin=None) -> CommandResult:
        assert "mlxops.node status --run-dir /r/runs/j" in command
        self.log.append((self.name, "ask"))
        item = self.asks.pop(0)
        if isinstance(item, BaseException):
            raise item
        return CommandResult(command, 0, protocol.answer_line(item) + "\n", "", 0.0)


class Connector:
    def __init__(self, conns: dict):
        self.conns = conns

    def connect(self, host):
        return self.conns[host.name]


def events_until(channels: Channels, done, limit: int = 50) -> list:
    got = []
    for _ in range(limit):
        got += channels.wait(5)
        if done(got):
            return got
    raise AssertionError(got)


def line(seq: int, answer: protocol.StatusAnswer, changed=()) -> str:
    return ChannelMessage(seq=seq, changed=list(changed), status=answer).line().rstrip("\n")


def test_messages_are_heard_in_order_and_a_death_is_a_failure(tmp_path):
    alive = status_of(tmp_path / "1", {"ranks": {0: {"pid": "alive", "started": 1}}})
    dead = status_of(tmp_path / "2", {"ranks": {0: {"pid": "dead", "exit": 137, "ended": 0}}})
    b = status_of(tmp_path / "3", {"ranks": {1: {"pid": "alive", "started": 1}}})
    log: list = []
    conns = {"a": Conn("a", [Stream([line(0, alive), line(1, dead, [0])])], [], log),
             "b": Conn("b", [Stream([line(0, b)])], [], log)}
    channels = Channels(record(), Connector(conns), {"a": Host("a"), "b": Host("b")})
    try:
        got = events_until(channels, lambda g: sum(e.host == "a" for e in g) == 2)
        heard_a = [e for e in got if e.host == "a"]
        assert [e.changed for e in heard_a] == [[], [0]]
        status = classify(record(), channels.answers(), dict(channels.unreachable))
        assert status.problem == "rank 0 on a exited with code 137"
        assert not any(isinstance(e, Lost) for e in got)
    finally:
        channels.close()
    assert all(kind == "stream" for _, kind in log)


def test_stop_ranks_asks_every_open_channel(tmp_path):
    alive = status_of(tmp_path, {"ranks": {0: {"pid": "alive", "started": 1}}})
    streams = {h: Stream([line(0, alive)]) for h in ("a", "b")}
    conns = {h: Conn(h, [streams[h]], [], []) for h in ("a", "b")}
    channels = Channels(record(), Connector(conns), {"a": Host("a"), "b": Host("b")})
    try:
        channels.wait_all(30)
        channels.stop_ranks(2.5)
    finally:
        channels.close()
    for stream in streams.values():
        assert [parse_request(t) for t in stream.sent] == [ChannelRequest(stop=2.5)]
        assert stream.closed


def test_a_lost_channel_is_a_missed_poll_the_host_is_asked_again(tmp_path):
    alive = status_of(tmp_path, {"ranks": {0: {"pid": "alive", "started": 1}}})
    log: list = []
    conns = {"a": Conn("a", [Stream([line(0, alive), TimeoutError("nothing for 3s")]),
                             Stream([line(0, alive)])], [alive], log)}
    channels = Channels(record(["a"]), Connector(conns), {"a": Host("a")}, retry=0)
    try:
        got = events_until(channels, lambda g: sum(isinstance(e, Heard) for e in g) == 3)
    finally:
        channels.close()
    kinds = [(type(e).__name__, getattr(e, "asked", None)) for e in got]
    assert kinds == [("Heard", False), ("Lost", None), ("Heard", True), ("Heard", False)]
    assert "channel silent" in got[1].reason
    assert log == [("a", "stream"), ("a", "ask"), ("a", "stream")]


def test_a_host_that_does_not_answer_is_unreachable_never_dead(tmp_path):
    alive = status_of(tmp_path, {"ranks": {1: {"pid": "alive", "started": 1}}})
    gone = HostUnreachable("a", "connection lost: [Errno 113] No route to host")
    log: list = []
    conns = {"a": Conn("a", [gone, gone], [gone, gone], log),
             "b": Conn("b", [Stream([line(0, alive)])], [], log)}
    channels = Channels(record(), Connector(conns), {"a": Host("a"), "b": Host("b")}, retry=0)
    try:
        got = events_until(channels, lambda g: sum(isinstance(e, Unheard) for e in g) == 2)
        assert [type(e).__name__ for e in got if e.host == "a"][:2] == ["Lost", "Unheard"]
        status = classify(record(), channels.answers(), dict(channels.unreachable))
        assert [r.state for r in status.ranks] == ["unreachable", "running"]
        assert status.problem is None
    finally:
        channels.close()


def test_a_bug_in_a_hosts_thread_is_raised_not_counted_as_the_host(tmp_path):
    conns = {"a": Conn("a", [KeyError("x")], [], [])}
    channels = Channels(record(["a"]), Connector(conns), {"a": Host("a")})
    try:
        with pytest.raises(InternalError, match="KeyError"):
            for _ in range(50):
                channels.wait(5)
    finally:
        channels.close()


def test_silence_ages_the_last_answer_by_the_controllers_clock(tmp_path):
    answer = status_of(tmp_path, {"ranks": {
        0: {"pid": "alive", "progress": {"age": 2, "step": 5}},
        1: {"pid": "dead", "exit": 0, "ended": 4}}})
    later = aged(answer, 9.0)
    assert later.ranks[0].heartbeat_age == pytest.approx(answer.ranks[0].heartbeat_age + 9)
    assert later.ranks[1].heartbeat_age == answer.ranks[1].heartbeat_age  # ended: no beat
    assert later.ranks[1].ended_ago == pytest.approx(answer.ranks[1].ended_ago + 9)
    assert later.now == pytest.approx(answer.now + 9)
    assert aged(answer, 0) is answer
    # Classified after 9 s of silence, the live rank is stalled (stall_timeout 10).
    assert classify(record(["a", "b"]), {"a": later, "b": later}, {}).ranks[0].state == "stalled"


# --- the watchdog on its channels ----------------------------------------------------------

def test_a_death_is_acted_on_from_its_message_stop_first_without_waiting_for_a_poll(
        tmp_path, monkeypatch):
    """With the poll interval at an hour, the kill's message alone drives the watchdog; the
    helpers are asked to stop the ranks before the status is fed on or a restart recorded."""
    from mlxops.jobs import watch

    monkeypatch.setenv("MLXOPS_HOME", str(tmp_path / "home"))
    inventory = tmp_path / "inventory.yml"
    inventory.write_text("all:\n  hosts:\n    a: {ansible_connection: local}\n"
                         "    b: {ansible_connection: local}\n")
    job = record()
    job.inventory = str(inventory)
    job.save()
    log: list = []

    class Logged(Stream):
        def __init__(self, host: str, script: list):
            super().__init__(script)
            self.host = host

        def send(self, text: str) -> None:
            log.append((self.host, "stop asked", parse_request(text).stop))

    running = {h: status_of(tmp_path / h, {"ranks": {r: {"pid": "alive", "started": 1}}})
               for h, r in (("a", 0), ("b", 1))}
    killed = status_of(tmp_path / "k", {"ranks": {0: {"pid": "dead", "exit": 137, "ended": 0}}})
    done = {h: status_of(tmp_path / f"d{h}", {"ranks": {r: {"pid": "dead", "exit": 0}}})
            for h, r in (("a", 0), ("b", 1))}
    conns = {
        "a": Conn("a", [Logged("a", [line(0, running["a"]), line(1, killed, [0])]),
                        Logged("a", [line(0, done["a"])])], [], []),
        "b": Conn("b", [Logged("b", [line(0, running["b"])]),
                        Logged("b", [line(0, done["b"])])], [], []),
    }

    def restart(current, connector, reason, on_event):
        log.append(("restart", reason))
        current.attempt += 1
        return current

    monkeypatch.setattr(watch, "restart", restart)
    final = watch.supervise(job, Connector(conns), poll=3600,
                            on_status=lambda s: log.append(("status", s.state)))
    assert final.state == "finished"
    failed = log.index(("status", "failed"))
    stops = [i for i, e in enumerate(log) if e[1] == "stop asked"]
    assert sorted(log[i][0] for i in stops) == ["a", "b"] and max(stops) < failed
    assert log[failed + 1] == ("restart", "rank 0 on a exited with code 137")
    assert log[-1] == ("status", "finished")


def test_a_peer_lost_failure_alone_waits_a_moment_for_the_rank_that_died_first(monkeypatch):
    from mlxops.jobs import watch
    from mlxops.jobs.status import JobStatus, RankStatus

    lost = "RuntimeError: [ring] connection to a peer was lost"
    secondary = JobStatus("j", "failed", [RankStatus(0, "n1", "failed", exit=1, failure=lost),
                                          RankStatus(1, "n2", "running")])
    cause = JobStatus("j", "failed", [RankStatus(0, "n1", "failed", exit=1, failure=lost),
                                      RankStatus(1, "n2", "failed", exit=137)])
    clock = [100.0]
    monkeypatch.setattr(watch.time, "monotonic", lambda: clock[0])
    since: list[float] = []
    assert watch._awaiting_cause(secondary, since)          # heard: only the peer's loss
    clock[0] += watch.PEER_GRACE / 2
    assert watch._awaiting_cause(secondary, since)
    assert not watch._awaiting_cause(cause, since)          # the killed rank: decide now
    assert since == []
    assert watch._awaiting_cause(secondary, since)
    clock[0] += watch.PEER_GRACE
    assert not watch._awaiting_cause(secondary, since)      # never heard: decide anyway


def test_a_stop_recorded_elsewhere_is_reported_once_its_ranks_are_gone(monkeypatch):
    """`mlxops stop` records the job as stopped before it signals the ranks: the watchdog
    that notices the record reports how the job ends, not the ranks still running then."""
    from types import SimpleNamespace

    from mlxops.jobs import watch
    from mlxops.jobs.status import JobStatus, RankStatus

    running = JobStatus("j", "running", [RankStatus(0, "n1", "running")])
    stopped = JobStatus("j", "stopped", [RankStatus(0, "n1", "stopped")])
    answers = [running, running, stopped]
    clock = [100.0]
    monkeypatch.setattr(watch, "load_record", lambda name: SimpleNamespace(stop_grace=5.0))
    monkeypatch.setattr(watch, "job_status", lambda record, connector, hosts: answers.pop(0))
    monkeypatch.setattr(watch.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(watch.time, "sleep", lambda s: clock.__setitem__(0, clock[0] + s))
    assert watch._once_stopped("j", None, None) is stopped and answers == []
    # Ranks that outlive the stop's grace and the settling time: said as they are.
    answers[:] = [running] * 1000
    assert watch._once_stopped("j", None, None) is running
    assert clock[0] >= 100.5 + 5.0 + watch.STOP_SETTLE


def test_a_rank_that_refused_its_input_is_not_restarted_the_job_fails_with_its_line(
        tmp_path, monkeypatch):
    """Exit 2 is bad input (a config key, a file, a model that does not fit): the next
    attempt would be refused the same way, so the watchdog fails the job at once with the
    rank's own line (recorded from a real trainer: data/jobs/rank_failures.yml)."""
    import yaml

    from mlxops import events
    from mlxops.jobs import watch
    from mlxops.jobs.record import load_record

    case = yaml.safe_load((ROOT / "tests/unit/data/jobs/rank_failures.yml").read_text())[
        "trainer_config_error"]
    assert case["exit"] == 2
    monkeypatch.setenv("MLXOPS_HOME", str(tmp_path / "home"))
    inventory = tmp_path / "inventory.yml"
    inventory.write_text("all:\n  hosts:\n    a: {ansible_connection: local}\n"
                         "    b: {ansible_connection: local}\n")
    job = record()
    job.inventory = str(inventory)
    job.save()
    running = {h: status_of(tmp_path / h, {"ranks": {r: {"pid": "alive", "started": 1}}})
               for h, r in (("a", 0), ("b", 1))}
    refused = status_of(tmp_path / "k", {"ranks": {0: {"pid": "dead", "started": 60,
                                                        "log": case["log"], "exit": 2,
                                                        "ended": 0}}})
    conns = {"a": Conn("a", [Stream([line(0, running["a"]), line(1, refused, [0])])], [], []),
             "b": Conn("b", [Stream([line(0, running["b"])])], [], [])}
    restarted: list = []
    monkeypatch.setattr(watch, "restart", lambda *a, **k: restarted.append(a))
    monkeypatch.setattr(watch, "stop_job", lambda record, connector, mark_stopped: None)
    monkeypatch.setattr(watch, "job_status", lambda record, connector, hosts: "ended")
    assert watch.supervise(job, Connector(conns), poll=3600) == "ended"
    assert restarted == []
    ended = load_record("j")
    want = f"rank 0 on a exited with code 2 (bad input, not restarted): {case['why']}"
    assert (ended.state, ended.message) == ("failed", want)
    assert [(e.kind, e.message) for e in events.read("j")] == [("failed", want)]


def test_only_exit_code_2_is_final_any_other_failure_is_restarted():
    from mlxops.jobs.policy import not_restarted
    from mlxops.jobs.status import RankStatus

    assert not_restarted([RankStatus(0, "n1", "failed", exit=1, failure="RuntimeError: x"),
                          RankStatus(1, "n2", "failed", exit=137)]) is None
    assert not_restarted([RankStatus(0, "n1", "running"),
                          RankStatus(1, "n2", "failed", exit=None)]) is None
    said = not_restarted([RankStatus(0, "n1", "failed", exit=1),
                          RankStatus(1, "n2", "failed", exit=2, failure="cfg.json: lr: bad")])
    assert said == "rank 1 on n2 exited with code 2 (bad input, not restarted): cfg.json: lr: bad"

"""``mlxops selftest`` without nodes: the summary (its exit code, text and JSON shape), the
selftest job's spec, the watchdog onlooker that kills and waits, the kill command under the
real /bin/sh, and bad input refused before any connection.

The end-to-end runs on sandbox nodes are tests/integration/test_selftest.py.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from mlxops.bench.results import AllreduceRow, BenchResult, PairResult
from mlxops.errors import MlxopsError, UserError
from mlxops.hostfacts import HostFacts, Interpreter
from mlxops.jobs.placement import Rank
from mlxops.jobs.record import HostRecord, JobRecord, Restart
from mlxops.jobs.spec import check_world
from mlxops.jobs.status import JobStatus, RankStatus
from mlxops.selftest import job as J
from mlxops.selftest import summary as S
from mlxops.selftest.run import SKIPPABLE, Options, parse_skip, run_selftest
from mlxops.tasks import facts as F
from mlxops.trainer import config as trainer_config

DATA = Path(__file__).parents[1] / "data"
DOCS = Path(__file__).resolve().parents[3] / "docs"


def summary_with(**results: str) -> S.Summary:
    summary = S.Summary("/x/inventory.yml", ["n1", "n2"], None,
                        {"mlxops": "0", "system": "Linux x86_64", "python": "3.11", "mlx": "0"})
    for name, result in results.items():
        summary.step(name).result = result
    return summary


# --- the summary ---------------------------------------------------------------------------


def test_host_info_from_the_facts_recorded_on_a_sandbox_node():
    text = (DATA / "facts" / "linux_x86_64.txt").read_text()
    info = S.HostInfo.from_facts("node1", F.build_facts(F.split_sections(text), "~/.mlxops"))
    assert info == S.HostInfo("node1", "Linux", "x86_64", "AMD EPYC", 25276502016, 2, None,
                              "3.11.2", "0.32.4")


def test_host_info_of_a_mac_names_version_and_build_and_the_venv_wins():
    # Illustrative facts (the record of mlxops.hostfacts; 14.4.1 is build 23E224).
    facts = replace(
        HostFacts.unknown(), system="Darwin", macos_version="14.4.1", macos_build="23E224",
        arch="arm64", chip="Apple M2 Ultra", memory_bytes=192 << 30, cpu_cores=24,
        gpu_cores=76,
        python=Interpreter(path="/opt/homebrew/bin/python3", version="3.11.7", mlx=None),
        venv=Interpreter(path="/Users/ml/.mlxops/venv/bin/python", version="3.11.7",
                         mlx="0.32.4"))
    info = S.HostInfo.from_facts("studio1", facts)
    assert (info.os, info.python, info.mlx) == ("macOS 14.4.1 (23E224)", "3.11.7", "0.32.4")
    assert S.HostInfo.from_facts("gone", None) == S.HostInfo("gone")


@pytest.mark.parametrize("results, interrupted, code", [
    ({}, False, 1),                                        # nothing ran: not a pass
    ({s: S.OK for s in S.STEPS}, False, 0),
    ({**{s: S.OK for s in S.STEPS}, S.BENCH: S.SKIPPED}, False, 0),
    ({S.TRUST: S.OK, S.PROVISION: S.FAILED}, False, 1),
    ({S.TRUST: S.UNREACHABLE, S.PROVISION: S.FAILED}, False, 3),
    ({S.TRUST: S.OK, S.JOB: S.INTERRUPTED, S.STOP: S.OK}, True, 130),
])
def test_exit_code(results, interrupted, code):
    summary = summary_with(**results)
    summary.interrupted = interrupted
    assert summary.exit_code == code and summary.passed is (code == 0)


def test_not_run_steps_make_no_pass():
    summary = summary_with(**{s: S.OK for s in S.STEPS[:-1]})  # stop never ran
    assert summary.exit_code == 1


def bench_result() -> BenchResult:
    result = BenchResult("/x/inventory.yml", ["n1", "n2", "n3"], {})
    result.pairs = [
        PairResult("n1", "n2", {"median": 30.0}, {"4": 9.4}),
        PairResult("n2", "n1", {"median": 31.0}, {"4": 9.1}),
        PairResult("n1", "n3", None, {}, error="n3: refused"),
        PairResult("n3", "n1", {"median": 80.0}, {"4": 0.9}),
    ]
    result.allreduce = [AllreduceRow(4096, 100.0, 0.3, 0.4, 0, 50),
                        AllreduceRow(4 << 20, 9000.0, 3.7, 4.9, 0, 20)]
    result.allreduce_info = {"backend": "ring", "ranks": 3}
    return result


def test_links_are_each_pair_once_with_both_directions():
    links = S.links_from(bench_result())
    assert links == [S.Link("n1", "n2", 9.4, 9.1, 30.0), S.Link("n1", "n3", None, 0.9, 80.0)]
    ar = S.allreduce_from(bench_result())
    assert ar["busbw_gbps"] == 4.9 and ar["wrong"] == 0 and len(ar["sizes"]) == 2


def test_text_names_every_step_its_result_and_each_problem_with_its_host():
    summary = summary_with(trust=S.FAILED)
    summary.step(S.TRUST).problems.append("n2: unknown host key ssh-ed25519 SHA256:abc")
    summary.step(S.PROVISION).detail = "after trust: failed"
    summary.links = S.links_from(bench_result())
    text = S.render_text(summary)
    assert text.startswith("mlxops selftest: FAILED (exit 1)")
    assert "\x1b" not in text  # plain text, for a bug report
    rows = {m.group(1): m.group(2) for m in re.finditer(r"^(\w+) +(ok|failed|not run|skipped)",
                                                       text, re.M)}
    assert rows == {"trust": "failed", **{s: "not run" for s in S.STEPS[1:]}}
    assert "  trust: n2: unknown host key ssh-ed25519 SHA256:abc" in text.splitlines()
    assert "n1 <> n3" in text


def test_json_has_the_keys_docs_formats_md_shows():
    doc = S.Summary("/x/i.yml", ["n1"], "n1", {}).to_dict()
    formats = (DOCS / "formats.md").read_text()
    section = formats.split("## `mlxops selftest --json`", 1)[1].split("\n## ", 1)[0]
    example = json.loads(section.split("```json", 1)[1].split("```", 1)[0])
    assert list(example) == list(doc)
    assert list(example["steps"][0]) == list(doc["steps"][0])
    assert [s["name"] for s in example["steps"]] == list(S.STEPS)
    assert list(example["recovery"]) == list(vars(S.Recovery(0, "h", 0)))
    assert list(example["host_info"][0]) == list(vars(S.HostInfo("h")))
    assert list(example["links"][0]) == list(vars(S.Link("a", "b", 1, 1, 1)))


# --- options -------------------------------------------------------------------------------


def test_skip_takes_steps_by_name_and_refuses_others():
    assert parse_skip("bench, check") == {"bench", "check"}
    assert parse_skip("") == frozenset()
    with pytest.raises(UserError, match=r"^--skip: 'trust': the steps that can be skipped"):
        parse_skip("bench,trust")
    assert "trust" not in SKIPPABLE and "stop" not in SKIPPABLE


def test_a_limit_that_selects_nothing_is_refused_before_any_connection(tmp_path):
    inv = tmp_path / "inventory.yml"
    inv.write_text("all:\n  hosts:\n    mac1: {ansible_host: 192.0.2.1}\n")
    with pytest.raises(UserError, match="--limit"):
        run_selftest(Options(inventory=inv, limit="nosuchhost"))


def cli(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "MLXOPS_HOME": str(tmp_path / "home")}
    return subprocess.run([sys.executable, "-m", "mlxops", "selftest", *args],
                          capture_output=True, text=True, timeout=60, env=env,
                          stdin=subprocess.DEVNULL)


@pytest.mark.parametrize("args, needle", [
    (["--skip", "nope"], "--skip: 'nope'"),
    (["--limit", "mac9"], "mac9"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, args, needle):
    inv = tmp_path / "inventory.yml"
    # 192.0.2.0/24 is TEST-NET-1: nothing answers there, so any connection would hang.
    inv.write_text("all:\n  hosts:\n    mac1: {ansible_host: 192.0.2.1}\n")
    proc = cli(tmp_path, str(inv), *args)
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout == "" and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and needle in proc.stderr


# --- the order of the steps ----------------------------------------------------------------


def selftest(tmp_path: Path, plan: dict, **options) -> tuple[S.Summary | BaseException, list]:
    """Run the steps with each one's work replaced: ``plan[step]`` is the result it sets or
    the exception it raises. Returns the summary (or what ``run`` raised) and the calls."""
    from mlxops.selftest import run as R

    inv = tmp_path / "inventory.yml"
    inv.write_text("all:\n  hosts:\n    mac1: {ansible_host: 192.0.2.1}\n"
                   "    mac2: {ansible_host: 192.0.2.2}\n")
    test = R._Selftest(Options(inventory=inv, **options), lambda _: None)
    calls: list[str] = []

    def fake(name):
        def work(step):
            calls.append(name)
            outcome = plan.get(name, S.OK)
            if isinstance(outcome, BaseException):
                raise outcome
            step.result = outcome
        return work

    for name in S.STEPS:
        setattr(test, f"_{name}", fake(name))
    test._read_facts = lambda: calls.append("facts")
    try:
        return test.run(), calls
    except BaseException as exc:  # noqa: BLE001 - what run() let through
        return exc, calls


def test_a_failed_step_ends_the_run_and_the_job_is_always_stopped(tmp_path):
    summary, calls = selftest(tmp_path, {"check": S.FAILED})
    assert calls == ["trust", "provision", "check"]
    assert [s.result for s in summary.steps] == [S.OK, S.OK, S.FAILED, S.NOT_RUN, S.NOT_RUN,
                                                 S.NOT_RUN]
    assert summary.step(S.BENCH).detail == "after check: failed" and summary.exit_code == 1

    summary, calls = selftest(tmp_path, {"job": MlxopsError("the job ended (failed)")})
    assert calls == ["trust", "provision", "check", "bench", "job", "stop"]
    assert summary.step(S.JOB).problems == ["the job ended (failed)"]

    summary, calls = selftest(tmp_path, {"job": KeyboardInterrupt()})
    assert calls[-2:] == ["job", "stop"] and summary.exit_code == 130
    assert (summary.step(S.JOB).result, summary.step(S.STOP).result) == (S.INTERRUPTED, S.OK)

    bug, calls = selftest(tmp_path, {"job": KeyError("x")})
    assert isinstance(bug, KeyError) and calls[-2:] == ["job", "stop"]


def test_skipped_steps_and_facts_read_without_provision(tmp_path):
    summary, calls = selftest(tmp_path, {}, skip=frozenset({"provision", "job"}))
    assert calls == ["trust", "facts", "check", "bench"]
    assert [s.result for s in summary.steps] == [S.OK, S.SKIPPED, S.OK, S.OK, S.SKIPPED,
                                                 S.SKIPPED]
    assert summary.exit_code == 0
    summary, calls = selftest(tmp_path, {"trust": S.UNREACHABLE}, skip=frozenset({"provision"}))
    assert calls == ["trust"] and summary.exit_code == 3


# --- the job -------------------------------------------------------------------------------


@pytest.mark.parametrize("world", [1, 2, 3, 4, 7, 8, 16])
def test_the_job_is_valid_for_any_world_size(world):
    spec = J.job_spec(Path("/x/inventory.yml"), "all", "ring", world)
    cfg = spec.workload.config
    trainer_config.check_world(cfg, world)
    check_world(spec, world)
    assert spec.name == J.NAME and spec.env == {J.MARKER: "1"}
    assert spec.restart.max_restarts == 1
    assert cfg.train.checkpoint_every < J.KILL_AFTER < cfg.train.steps


def record() -> JobRecord:
    ranks = [Rank(0, "n1", "10.0.0.1", 30000, 0), Rank(1, "n2", "10.0.0.2", 30001, 0)]
    return JobRecord(J.NAME, "/x/i.yml", "/x/i.yml", "ring",
                     [HostRecord("n1", "/r", "/p"), HostRecord("n2", "/r", "/p")], ranks)


def status(step: int | None, attempt: int = 1, state: str = "running", message: str = "",
           restarts: list | None = None) -> JobStatus:
    ranks = [RankStatus(r, f"n{r + 1}", state, step=step) for r in (0, 1)]
    return JobStatus(J.NAME, state, ranks, attempt, restarts or [], message=message)


@pytest.fixture
def kills(monkeypatch) -> list:
    killed: list = []
    monkeypatch.setattr(J, "kill_trainer", lambda rec, rank, host, conn, hosts:
                        killed.append((rank, host)) or 27)  # its heartbeat's step
    return killed


def test_the_onlooker_kills_the_last_rank_after_a_checkpoint_then_waits_for_the_new_attempt(
        kills):
    events: list[str] = []
    watcher = J.KillAndWatch(record(), None, {}, time.monotonic() + 60, events.append)
    watcher.on_status(status(J.KILL_AFTER - 1))
    assert kills == []
    watcher.on_status(status(J.KILL_AFTER + 3))
    assert kills == [(1, "n2")] and watcher.recovery.killed_at_step == 27
    watcher.on_status(status(J.KILL_AFTER + 3, state="failed"))  # not restarted yet
    assert kills == [(1, "n2")] and watcher.recovery.restart_seconds is None
    reason = [Restart(time=0, reason="rank 1 on n2 exited with code 137", attempt=1)]
    watcher.on_status(status(None, 2, message="resumed from step 20", restarts=reason))
    r = watcher.recovery
    assert (r.reason, r.resumed_from, r.recovered_seconds) == (reason[0].reason, 20, None)
    with pytest.raises(J._Recovered):
        watcher.on_status(status(21, 2, message="resumed from step 20", restarts=reason))
    assert r.recovered_seconds >= r.restart_seconds >= 0
    assert any("kill -9 of rank 1 on n2" in e for e in events)


def test_the_onlooker_refuses_a_restart_before_the_kill_and_a_deadline(kills):
    watcher = J.KillAndWatch(record(), None, {}, time.monotonic() + 60, lambda _: None)
    crash = [Restart(time=0, reason="rank 0 on n1 exited with code 1", attempt=1)]
    with pytest.raises(MlxopsError, match="restarted before the kill: rank 0 on n1"):
        watcher.on_status(status(3, 2, restarts=crash))
    late = J.KillAndWatch(record(), None, {}, time.monotonic() - 1, lambda _: None)
    with pytest.raises(MlxopsError, match="timed out before the kill"):
        late.on_status(status(1))
    assert kills == []


def test_the_kill_command_under_sh_kills_a_child_of_the_leader_and_nothing_else():
    # The node's shape: a start script (the leader) waiting on its program.
    leader = subprocess.Popen(["/bin/sh", "-c", "sleep 60 & echo $!; wait $!"],
                              stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        child = int(leader.stdout.readline())
        other = subprocess.Popen(["sleep", "60"])
        try:
            # Not the leader's child: refused, exit non-zero, nothing signalled.
            wrong = subprocess.run(["/bin/sh", "-c", J.kill_command(other.pid, leader.pid)])
            assert wrong.returncode != 0 and other.poll() is None
        finally:
            other.kill()
            other.wait()
        done = subprocess.run(["/bin/sh", "-c", J.kill_command(child, leader.pid)])
        assert done.returncode == 0
        leader.wait(timeout=10)  # its `wait` returns once the child is killed
        assert leader.returncode == 128 + signal.SIGKILL
    finally:
        if leader.poll() is None:
            os.killpg(leader.pid, signal.SIGKILL)
            leader.wait()

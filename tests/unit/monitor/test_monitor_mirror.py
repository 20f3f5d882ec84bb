"""The metrics mirror, fed through real ``sample`` commands on local hosts: rank 0's
metrics tailed by byte offset, a rewritten file (a resume) and a moved rank 0 (a restart
without a host) merged, a new launch of the name starting over, one feeder at a time."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest
import yaml

from mlxops.jobs.placement import Rank
from mlxops.jobs.record import HostRecord, JobRecord, load_record
from mlxops.jobs.status import JobStatus, RankStatus
from mlxops.monitor import files, mirror
from mlxops.monitor.mirror import Feeder, feed, merge_reset, thin
from mlxops.node import protocol
from mlxops.transport import Connector

ROOT = Path(__file__).resolve().parents[3]


def lines(steps, **extra) -> str:
    return "".join(json.dumps({"step": s, "loss": 5.0 / s, **extra}) + "\n" for s in steps)


def rewrite(path: Path, text: str) -> None:
    """As the trainer does on resume: a new file renamed over the old one."""
    tmp = path.with_name(".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


class Cluster:
    """Local hosts, each with its own root holding this checkout's node code."""

    def __init__(self, tmp_path: Path, hosts: list[str]) -> None:
        self.tmp = tmp_path
        self.roots = {}
        inventory = {"all": {"hosts": {}}}
        for host in hosts:
            root = tmp_path / host
            (root / "code").mkdir(parents=True)
            (root / "code" / "mlxops").symlink_to(ROOT / "mlxops")
            self.roots[host] = root
            inventory["all"]["hosts"][host] = {"ansible_connection": "local",
                                               "mlxops_root": str(root)}
        self.inventory = tmp_path / "inventory.yml"
        self.inventory.write_text(yaml.safe_dump(inventory))

    def run_dir(self, host: str, name: str = "j") -> Path:
        path = self.roots[host] / "runs" / name
        path.mkdir(parents=True, exist_ok=True)
        return path

    def record(self, ranks: dict[int, str], name: str = "j") -> JobRecord:
        hosts = list(dict.fromkeys(ranks.values()))
        for rank, host in ranks.items():
            (self.run_dir(host, name) / f"rank-{rank}.sh").write_text("exit 0\n")
        record = JobRecord(
            name=name, job_file=str(self.tmp / "job.yml"), inventory=str(self.inventory),
            backend="ring",
            hosts=[HostRecord(h, str(self.roots[h]), sys.executable) for h in hosts],
            ranks=[Rank(r, h, "127.0.0.1", 20000 + r, 0) for r, h in ranks.items()],
            steps=20)
        record.save()
        return record


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("MLXOPS_HOME", str(tmp_path / "home"))


@pytest.fixture
def connector():
    with Connector() as conn:
        yield conn


def mirrored(name: str = "j") -> list[int]:
    return [json.loads(x)["step"] for x in files.path(name, files.METRICS).read_text()
            .splitlines()]


def samples(name: str = "j") -> list[dict]:
    return files.parse_lines(files.path(name, files.SAMPLES).read_text())


def test_feeds_tail_rank_0s_metrics_and_sample_every_host(tmp_path, connector):
    cluster = Cluster(tmp_path, ["a", "b"])
    record = cluster.record({0: "a", 1: "b"})
    metrics = cluster.run_dir("a") / protocol.METRICS
    metrics.write_text(lines(range(1, 6)) + '{"step": 6, "lo')   # a line being written

    results = feed(record, connector)
    assert results.exit_code == 0
    assert mirrored() == [1, 2, 3, 4, 5]
    [look] = samples()
    assert [r["rank"] for r in look["ranks"]] == [0, 1]
    assert look["state"] in ("failed", "running", "finished")   # scripts that never ran
    assert set(look["nodes"]) == {"a", "b"}
    assert look["nodes"]["a"]["memory_total"] > 0 and len(look["nodes"]["a"]["load"]) == 3
    state = files.read_state("j")
    assert (state.host, state.created) == ("a", record.created)

    with open(metrics, "a") as f:
        f.write('ss": 0.8}\n' + lines(range(7, 9)))
    feed(record, connector)
    assert mirrored() == [1, 2, 3, 4, 5, 6, 7, 8]
    assert len(samples()) == 2

    # The trainer resumes from step 4: it rewrites its file without 5.. and logs them again.
    generation = files.read_state("j").generation
    rewrite(metrics, lines(range(1, 5)) + lines(range(5, 10), again=True))
    feed(record, connector)
    text = files.path("j", files.METRICS).read_text()
    assert mirrored() == list(range(1, 10)) and text.count("again") == 5
    assert files.read_state("j").generation == generation + 1


def test_a_restart_without_rank_0s_host_keeps_the_steps_before_it(tmp_path, connector):
    cluster = Cluster(tmp_path, ["a", "b"])
    record = cluster.record({0: "a", 1: "b"})
    (cluster.run_dir("a") / protocol.METRICS).write_text(lines(range(1, 11)))
    feed(record, connector)
    # Resumed from step 6 without host a: rank 0 is now on b, whose file starts at 7.
    moved = load_record("j")
    moved.hosts = [h for h in moved.hosts if h.name == "b"]
    moved.ranks = [Rank(0, "b", "127.0.0.1", 20000, 0)]
    moved.save()
    (cluster.run_dir("b") / "rank-0.sh").write_text("exit 0\n")
    (cluster.run_dir("b") / protocol.METRICS).write_text(lines(range(7, 9), on="b"))
    feed(moved, connector)
    assert mirrored() == [1, 2, 3, 4, 5, 6, 7, 8]
    assert files.path("j", files.METRICS).read_text().count('"on": "b"') == 2
    assert files.read_state("j").host == "b"


def test_a_new_launch_of_the_name_starts_the_mirror_over(tmp_path, connector):
    cluster = Cluster(tmp_path, ["a"])
    record = cluster.record({0: "a"})
    metrics = cluster.run_dir("a") / protocol.METRICS
    metrics.write_text(lines(range(1, 6)))
    feed(record, connector)
    feed(record, connector)
    assert len(samples()) == 2
    rewrite(metrics, lines(range(1, 3)))          # launch --fresh: a new run
    again = cluster.record({0: "a"})              # a new record: another `created`
    assert again.created != record.created
    feed(again, connector)
    assert mirrored() == [1, 2] and len(samples()) == 1


def test_an_unreachable_host_is_recorded_in_the_look(tmp_path, connector):
    cluster = Cluster(tmp_path, ["a", "b"])
    record = cluster.record({0: "a", 1: "b"})
    (cluster.run_dir("a") / protocol.METRICS).write_text(lines([1]))
    # b's helpers are broken: its command fails, the look says so and a's data still comes.
    # (Not just removed: the controller's own mlxops would then answer for them.)
    code = cluster.roots["b"] / "code" / "mlxops"
    code.unlink()
    (code / "node").mkdir(parents=True)
    (code / "__init__.py").write_text("")
    (code / "node" / "__init__.py").write_text("")
    (code / "node" / "__main__.py").write_text("raise SystemExit('helpers broken')\n")
    results = feed(record, connector)
    assert results.exit_code == 1 and results.succeeded == ["a"]
    look = samples()[-1]
    assert "error" in look["nodes"]["b"] and "memory_total" in look["nodes"]["a"]
    assert mirrored() == [1]
    assert {r["rank"]: r["state"] for r in look["ranks"]}[1] == "unreachable"


def test_one_feeder_at_a_time(tmp_path, connector):
    cluster = Cluster(tmp_path, ["a"])
    record = cluster.record({0: "a"})
    with mirror._feeding("j") as mine:
        assert mine
        assert feed(record, connector) is None   # another process is at it: nothing done
    assert not files.path("j", files.SAMPLES).exists()
    assert feed(record, connector) is not None


def test_merge_reset_keeps_the_mirrors_lines_before_the_new_files_first_step():
    kept = lines(range(1, 8))
    assert merge_reset(kept, lines(range(1, 4))) == lines(range(1, 4))
    assert merge_reset(kept, lines(range(5, 7), x=1)) == lines(range(1, 5)) + \
        lines(range(5, 7), x=1)
    assert merge_reset(kept, "") == kept        # nothing logged yet in the new file


def test_thin_keeps_the_recent_quarter_whole(tmp_path):
    path = tmp_path / "samples.jsonl"
    path.write_text("".join(f'{{"n": {i}}}\n' for i in range(100)))
    assert not thin(path, max_bytes=10_000)
    assert thin(path, max_bytes=100)
    kept = [json.loads(x)["n"] for x in path.read_text().splitlines()]
    assert kept == list(range(0, 75, 2)) + list(range(75, 100))


def status(state: str, problem: bool = False) -> JobStatus:
    rank = RankStatus(0, "a", "failed" if problem else state, exit=1 if problem else None)
    return JobStatus("j", "failed" if problem else state, [rank])


def test_the_watchdogs_feeder_is_throttled_except_at_a_problem_or_the_end(monkeypatch):
    fed = []
    monkeypatch.setattr(mirror, "feed", lambda record, conn, **kw: fed.append(kw["status"]))
    records = []
    monkeypatch.setattr(mirror, "load_record", lambda name: records.append(name) or name)
    monkeypatch.setattr(mirror, "inventory_hosts", lambda record: {"a": record})
    feeder = Feeder("j", connector=None, interval=60)
    for _ in range(3):
        feeder.on_status(status("running"))
    assert len(fed) == 1
    feeder.on_status(status("running", problem=True))  # a restart comes: its last lines
    feeder.on_status(status("finished"))
    assert [s.state for s in fed] == ["running", "failed", "finished"]
    feeder._last = time.monotonic() - 61
    feeder.on_status(status("running"))
    assert len(fed) == 4
    assert records == ["j"] * 4  # the record as it is now, read only when feeding

"""The job document built from a recorded mirror (docs/formats.md, "mlxops report --json"),
the alerts, and the last bench as the pages show it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from mlxops.jobs.record import JobRecord
from mlxops.monitor import alerts, bench
from mlxops.monitor.data import MirrorReader, decimate, document, summary
from mlxops.node.protocol.metrics import MetricsLine

DATA = Path(__file__).parents[1] / "data" / "monitor"


def recorded(tmp_path, monkeypatch, which: str) -> MirrorReader:
    """The recorded mirror of ``which`` (running, finished) as this controller's job."""
    home = tmp_path / "home"
    shutil.copytree(DATA / which, home / "jobs")
    monkeypatch.setenv("MLXOPS_HOME", str(home))
    return MirrorReader("tiny-lm")


def test_the_finished_run_reads_back_whole(tmp_path, monkeypatch):
    doc = document(recorded(tmp_path, monkeypatch, "finished").read(), now=0)
    assert (doc.name, doc.state) == ("tiny-lm", "finished")
    m = doc.metrics
    assert m["step"] == list(range(5, 301, 5)) and doc.metrics_lines == 60
    assert all(len(col) == 60 for col in m.values())
    s = doc.summary
    assert (s.step, s.steps, s.restarts) == (300, 300, 1)
    assert s.loss_first > 4 and s.loss_last < 1.2 and s.loss_min <= s.loss_last
    assert 0 < s.compute_share < 1
    # The restart is placed at the last step logged before it: the checkpoint resumed from.
    [restart] = doc.restarts
    assert restart.step == 150 and "rank 2 on localhost" in restart.reason
    assert [r.rank for r in doc.ranks] == [0, 1, 2]
    assert all(r.state == "finished" and len(r.history["time"]) == 8 for r in doc.ranks)
    [node] = doc.nodes
    assert node.host == "localhost" and 0 < node.memory_peak_share < 1
    assert doc.alerts == []   # ended: nothing to alert about now
    assert doc.job.alerts == {"memory_share": 0.02, "tokens_per_sec_drop": 0.5,
                              "heartbeat_age": 20.0, "val_loss_rise": 0.02}
    assert doc.job.sections["trainer"]["train"]["steps"] == 300 and doc.job.kind == "trainer"
    # One JSON document, of the fields docs/formats.md names, at the top level.
    out = json.loads(json.dumps(doc.to_dict()))
    assert list(out) == ["name", "generated", "state", "updated", "mirror_generation", "job",
                         "summary", "metrics", "metrics_lines", "restarts", "events",
                         "ranks", "nodes", "alerts", "serve"]
    assert out["summary"]["step"] == 300 and out["restarts"][0]["step"] == 150
    assert out["ranks"][0]["history"]["time"] == doc.ranks[0].history["time"]
    # The job's kind and its section under the kind's key, every other kind's null.
    assert out["job"]["kind"] == "trainer" and out["job"]["trainer"]["train"]["steps"] == 300
    assert out["job"]["command"] is None and out["job"]["serve"] is None
    assert "sections" not in out["job"] and "probed" not in out["job"]


def test_the_running_copy_alerts_on_memory(tmp_path, monkeypatch):
    doc = document(recorded(tmp_path, monkeypatch, "running").read())
    assert doc.state == "running" and doc.summary.step == 239
    assert [a["kind"] for a in doc.alerts] == ["memory_share"]
    assert doc.alerts[0]["message"].startswith("localhost: memory 3% in use (alert at 2%)")


def test_the_reader_parses_only_what_was_added(tmp_path, monkeypatch):
    reader = recorded(tmp_path, monkeypatch, "running")
    first = reader.read()
    path = tmp_path / "home" / "jobs" / "tiny-lm" / "metrics.jsonl"
    recorded_line = json.loads(path.read_text().splitlines()[-1])
    with open(path, "a") as f:
        f.write(json.dumps({**recorded_line, "step": 999}) + "\n" + '{"step": 10')
    again = reader.read()
    assert len(again.metrics) == len(first.metrics) + 1 and again.metrics[-1].step == 999
    assert len(first.metrics) == 48   # what was read before is left as it was


def test_decimate_spreads_rows_and_keeps_both_ends():
    cols = {"step": list(range(1000)), "loss": [float(i) for i in range(1000)]}
    thin = decimate(cols, 100)
    assert len(thin["step"]) == 100 and thin["step"][0] == 0 and thin["step"][-1] == 999
    assert thin["loss"] == [float(s) for s in thin["step"]]
    assert decimate(cols, None) is cols and decimate(cols, 5000) is cols


def test_decimate_keeps_every_validation_row():
    steps = list(range(1, 1001))
    val = [2.0 - s / 1000 if s % 37 == 0 else None for s in steps]
    thin = decimate({"step": steps, "val_loss": val}, 50, always="val_loss")
    assert [s for s, v in zip(thin["step"], thin["val_loss"], strict=True) if v is not None] \
        == [s for s in steps if s % 37 == 0]
    assert len(thin["step"]) < 50 + 1000 // 37 + 1


def test_the_summary_says_the_last_and_best_validation_loss():
    def line(step, val):
        return MetricsLine(step=step, loss=3.0, tokens_per_sec=1.0, time=1.0, step_time=1.0,
                           compute_time=0.5, comm_time=0.5, world_size=1, micro_batch=1,
                           accumulation=1, lr=1e-3, active_memory=1, peak_memory=1,
                           val_loss=val)

    rec = load_record_of_recorded()
    s = summary(rec, [line(10, 2.5), line(20, None), line(30, 2.2), line(40, 2.4)], None)
    assert (s.val_loss_last, s.val_loss_min, s.val_loss_best_step) == (2.4, 2.2, 30)
    s = summary(rec, [line(10, None)], None)
    assert s.val_loss_last is None and s.val_loss_best_step is None


def load_record_of_recorded():
    path = Path(__file__).parents[1] / "data" / "monitor" / "finished" / "tiny-lm" / "record.json"
    return JobRecord.from_dict(json.loads(path.read_text()))


def look(state="running", ranks=(), nodes=None):
    return {"state": state, "ranks": list(ranks), "nodes": nodes or {}}


def test_alerts_past_each_threshold():
    limits = {"memory_share": 0.9, "tokens_per_sec_drop": 0.5, "heartbeat_age": 30}
    rank = {"rank": 2, "host": "mac3", "state": "running", "step": 7, "heartbeat_age": 42.0}
    node = {"memory_used": 95, "memory_total": 100}
    found = alerts.evaluate(limits, look(ranks=[rank], nodes={"mac1": node}),
                            [1000.0] * 10 + [400.0] * 3)
    assert [a["kind"] for a in found] == ["heartbeat_age", "memory_share",
                                          "tokens_per_sec_drop"]
    assert found[0]["message"] == "rank 2 on mac3: no heartbeat for 42s (alert at 30s)"
    assert found[1]["message"] == "mac1: memory 95% in use (alert at 90%)"
    assert found[2]["message"] == "tokens/s 400, down 60% from 1,000 (alert at 50%)"
    # Under every threshold, or the job not running, or a threshold at 0: nothing.
    calm = look(ranks=[{**rank, "heartbeat_age": 3.0}],
                nodes={"mac1": {"memory_used": 50, "memory_total": 100}})
    assert alerts.evaluate(limits, calm, [1000.0] * 10 + [900.0] * 3) == []
    hot = look(ranks=[rank], nodes={"mac1": node})
    assert alerts.evaluate(limits, {**hot, "state": "finished"}, []) == []
    assert alerts.evaluate(dict.fromkeys(limits, 0), hot, [1000.0] * 10 + [1.0] * 3) == []


def test_one_slow_line_is_no_drop():
    assert alerts.tokens_drop([1000.0] * 10 + [100.0, 1000.0, 1000.0], 0.5) is None
    assert alerts.tokens_drop([1000.0] * 3 + [100.0] * 2, 0.5) is None   # too few lines


def test_thresholds_of_a_record_without_alerts_are_the_defaults():
    assert alerts.thresholds(None) == {"memory_share": 0.9, "tokens_per_sec_drop": 0.5,
                                       "heartbeat_age": 30.0, "val_loss_rise": 0.02}
    assert alerts.thresholds({"alerts": {"heartbeat_age": 5}})["heartbeat_age"] == 5.0


BENCH = {
    "version": 1, "time": 1795355393.25, "hosts": ["studio1", "studio2", "mini3"],
    "pairs": [
        {"src": "studio1", "dst": "studio2", "bandwidth_gbps": 9.41},
        {"src": "studio2", "dst": "mini3", "bandwidth_gbps": 2.1},
        {"src": "mini3", "dst": "studio1", "bandwidth_gbps": 9.0, "error": None},
    ],
    "allreduce": [{"bytes": 4096, "time_us": 61.3, "algbw_gbps": 0.534, "busbw_gbps": 0.712,
                   "wrong": 0, "iterations": 200}],
    "allreduce_info": {"backend": "ring", "ranks": 3, "avg_busbw_gbps": 12.1},
    "ring": {"order": ["studio1", "mini3", "studio2"], "bottleneck_gbps": 2.1},
    "findings": [{"kind": "slow_link", "message": "studio2 -> mini3: 2.1 Gbit/s"}],
}


def test_the_last_bench_is_summarised_and_missing_or_broken_ones_tolerated(tmp_path,
                                                                           monkeypatch):
    monkeypatch.setenv("MLXOPS_HOME", str(tmp_path))
    assert bench.latest() is None               # no bench directory at all
    directory = tmp_path / "bench"
    directory.mkdir()
    (directory / "20260101-000000.json").write_text(json.dumps(BENCH))
    (directory / "20260102-000000.json").write_text("{not json")
    (directory / "20260103-000000.json").write_text(json.dumps({"no": "pairs"}))
    got = bench.latest()
    assert got["file"].endswith("20260101-000000.json")
    assert got["bandwidth_gbps"] == {"min": 2.1, "max": 9.41, "median": 9.0}
    assert got["slowest"] == {"src": "studio2", "dst": "mini3", "gbps": 2.1}
    assert got["ring"] == {"order": ["studio1", "mini3", "studio2"], "bottleneck_gbps": 2.1}
    assert got["avg_busbw_gbps"] == 12.1 and got["allreduce"][0]["bytes"] == 4096
    assert got["findings"] == ["studio2 -> mini3: 2.1 Gbit/s"]
    assert bench.latest(["studio1", "mini3"])["file"] == got["file"]
    assert bench.latest(["studio1", "mac9"]) is None


@pytest.mark.parametrize("missing", ["ring", "allreduce", "allreduce_info", "findings", "time"])
def test_a_bench_without_a_part_still_shows(tmp_path, monkeypatch, missing):
    monkeypatch.setenv("MLXOPS_HOME", str(tmp_path))
    (tmp_path / "bench").mkdir()
    doc = {k: v for k, v in BENCH.items() if k != missing}
    (tmp_path / "bench" / "20260101-000000.json").write_text(json.dumps(doc))
    assert bench.latest()["hosts"] == BENCH["hosts"]

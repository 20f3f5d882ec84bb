"""A serve job in the monitoring pages' data (docs/formats.md, "mlxops report --json"):
the recorded mirror of a real serve job (data/monitor/README.md, "serving") read back as
the document the dashboard and the report draw, its line in the dashboard's job table,
its ``/metrics``, and its report (the page itself: tests/integration/test_serve_dashboard.py).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from mlxops.jobs.servespec import ServeSpec
from mlxops.jobs.workloads.serve import ServeWorkload
from mlxops.monitor import alerts, prom, report
from mlxops.monitor.data import MirrorReader, document, serving
from mlxops.monitor.server import Jobs

DATA = Path(__file__).parents[1] / "data" / "monitor"
JOB = (("job_name", "serve-demo"),)


@pytest.fixture
def home(tmp_path, monkeypatch):
    home = tmp_path / "home"
    shutil.copytree(DATA / "serving", home / "jobs")
    monkeypatch.setenv("MLXOPS_HOME", str(home))
    return home


def test_the_recorded_serve_job_adds_up_the_requests_of_both_attempts(home):
    doc = document(MirrorReader("serve-demo").read())
    serve, history = doc.serve, doc.serve.history
    assert doc.job.sections["serve"]["port"] == 8191 and doc.job.sections["trainer"] is None
    assert doc.job.kind == "serve" and doc.serves
    assert [r.reason for r in doc.restarts] == ["rank 0 on node1 exited with code 137"]
    # The server's log counts one attempt: 68 answered by the first, 30 by the second.
    firsts = [n for n, a in zip(history["requests"], history["attempt"], strict=True) if a == 1]
    assert firsts[-1] == 68 and serve.last["requests"] == 30
    assert serve.requests_total == 98 == history["requests_total"][-1]
    totals = history["requests_total"]
    assert totals == sorted(totals)  # the counter never falls back at the restart
    assert serve.last["latency"] > 0 and serve.last["tokens_per_sec"] > 0
    # No training figures, and no heartbeat alert: a server writes no heartbeat.
    assert doc.metrics_lines == 0 and doc.summary.step is None
    assert doc.job.alerts["heartbeat_age"] == 0 and doc.alerts == []


def test_a_thinned_document_thins_the_serve_history_too(home):
    doc = document(MirrorReader("serve-demo").read(), points=10)
    history = doc.serve.history
    assert {len(v) for v in history.values()} == {10}
    assert history["requests_total"][0] == 0 and history["requests_total"][-1] == 98


def test_requests_of_each_attempt_are_added_up():
    # Illustrative looks: attempt 1 ends at 7, attempt 2 counts from 0 again.
    looks = [(1, 3), (1, 7), (2, None), (2, 0), (2, 4)]
    doc = serving([{"time": float(t), "attempt": a, "serve": {"requests": n}}
                   for t, (a, n) in enumerate(looks)])
    assert doc.history["requests_total"] == [3, 7, None, 7, 11]
    assert doc.requests_total == 11


def test_a_serve_job_has_no_heartbeat_alert_whatever_its_file_says():
    serve_job, server = {"alerts": {"heartbeat_age": 10}}, ServeWorkload(ServeSpec("/m"))
    assert alerts.thresholds(serve_job, server)["heartbeat_age"] == 0
    assert alerts.thresholds({"alerts": {"heartbeat_age": 10}})["heartbeat_age"] == 10
    sample = {"state": "running", "ranks": [{"rank": 0, "host": "node1", "state": "running",
                                             "heartbeat_age": 95.0}]}
    assert alerts.evaluate(alerts.thresholds(serve_job, server), sample, []) == []


def test_the_job_table_line_of_a_serve_job_says_its_requests(home):
    [line] = Jobs().overview()["jobs"]
    assert line["serve"] is True and line["requests"] == 98
    assert line["tokens_per_sec"] == pytest.approx(
        document(MirrorReader("serve-demo").read()).serve.last["tokens_per_sec"])
    assert line["step"] is None and line["loss"] is None


def test_metrics_export_the_serve_figures(home):
    doc = document(MirrorReader("serve-demo").read())
    text = prom.exposition(lambda name: document(MirrorReader(name).read())).decode()
    got = {(s.name, tuple(sorted(s.labels.items()))): s.value
           for family in text_string_to_metric_families(text) for s in family.samples}
    assert got[("mlxops_serve_requests_total", JOB)] == 98
    assert got[("mlxops_serve_tokens_per_second", JOB)] == pytest.approx(
        doc.serve.last["tokens_per_sec"])
    assert got[("mlxops_serve_latency_seconds", JOB)] == pytest.approx(
        doc.serve.last["latency"])
    # Training series it has no value for are left out, not 0.
    assert ("mlxops_job_step", JOB) not in got and ("mlxops_job_loss", JOB) not in got
    assert got[("mlxops_job_restarts_total", JOB)] == 1


def test_the_report_of_a_serve_job_has_its_config_and_no_plan(home, tmp_path):
    doc = report.report_document(MirrorReader("serve-demo").read(), points=report.POINTS)
    assert doc.extras["plan"] is None and doc.serve.requests_total == 98
    page = report.write(doc, tmp_path / "r.html").read_text()
    assert '"model_job": "serve-train"' in page

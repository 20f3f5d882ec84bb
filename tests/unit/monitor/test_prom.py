"""``/metrics`` (mlxops/monitor/prom.py, docs/formats.md "Prometheus metrics") on the
recorded mirrors of a real run: parsed back with prometheus-client's own parser, each value
the one the job document (what the dashboard draws) has; labels bounded."""

from __future__ import annotations

import json
import shutil
import threading
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from mlxops import events
from mlxops.monitor import prom, server
from mlxops.monitor.data import MirrorReader, document

DATA = Path(__file__).parents[1] / "data" / "monitor"
BENCH = {"time": 1795353795.0, "hosts": ["n1", "n2"], "pairs": [
    {"src": "n1", "dst": "n2", "bandwidth_gbps": 9.41,
     "latency_us": {"min": 41.2, "median": 48.9}, "error": None},
    {"src": "n2", "dst": "n1", "bandwidth_gbps": None, "error": "iperf: refused"}]}


def samples(text: str) -> dict[tuple[str, tuple], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


@pytest.fixture
def home(tmp_path, monkeypatch):
    home = tmp_path / "home"
    shutil.copytree(DATA / "running", home / "jobs")
    monkeypatch.setenv("MLXOPS_HOME", str(home))
    (home / "bench").mkdir()
    (home / "bench" / "20261124-090000.json").write_text(json.dumps(BENCH))
    events.record("tiny-lm", events.RESTARTED, "rank 2 on localhost exited", attempt=1)
    events.record("tiny-lm", events.ALERT, "localhost: memory 3% in use", attempt=2)
    return home


def test_the_scrape_says_what_the_job_document_says(home):
    doc = document(MirrorReader("tiny-lm").read())
    got = samples(prom.exposition(lambda name: document(MirrorReader(name).read())).decode())
    job = (("job_name", "tiny-lm"),)
    s = doc.summary
    assert got[("mlxops_job_step", job)] == s.step == 239
    assert got[("mlxops_job_steps", job)] == 300
    assert got[("mlxops_job_loss", job)] == pytest.approx(s.loss_last)
    assert got[("mlxops_job_tokens_per_second", job)] == pytest.approx(s.tokens_per_sec)
    assert got[("mlxops_job_restarts_total", job)] == 1
    assert got[("mlxops_job_attempt", job)] == 2
    assert got[("mlxops_job_alerts", job)] == 1
    assert got[("mlxops_job_state", (*job, ("state", "running")))] == 1
    assert got[("mlxops_job_state", (*job, ("state", "stalled")))] == 0
    assert got[("mlxops_job_events_total", (*job, ("kind", "restarted")))] == 1
    assert got[("mlxops_job_events_total", (*job, ("kind", "finished")))] == 0
    # No validation in this run: the series is absent, not 0.
    assert not any(name == "mlxops_job_val_loss" for name, _ in got)
    for r in doc.ranks:
        labels = tuple(sorted({"job_name": "tiny-lm", "rank": str(r.rank),
                               "host": r.host}.items()))
        assert got[("mlxops_rank_step", labels)] == r.step
        assert got[("mlxops_rank_heartbeat_age_seconds", labels)] == r.heartbeat_age
    [node] = doc.nodes
    labels = (("host", "localhost"), ("job_name", "tiny-lm"))
    assert got[("mlxops_node_memory_used_bytes", labels)] == node.memory_used
    assert got[("mlxops_node_memory_total_bytes", labels)] == node.memory_total
    assert got[("mlxops_node_up", labels)] == 1
    link = (("dst", "n2"), ("src", "n1"))
    assert got[("mlxops_link_bandwidth_gbps", link)] == 9.41
    assert got[("mlxops_link_latency_seconds", link)] == pytest.approx(48.9e-6)
    assert ("mlxops_link_bandwidth_gbps", (("dst", "n1"), ("src", "n2"))) not in got
    # Bounded labels: never a step, a time or a message.
    names = {k for _, labels in got for k, _ in labels}
    assert names <= {"job_name", "rank", "host", "state", "kind", "src", "dst"}


def serve(metrics_only: bool):
    srv = server.make_server("127.0.0.1", 0, metrics_only=metrics_only)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv, f"http://127.0.0.1:{srv.server_address[1]}"


@pytest.mark.parametrize("metrics_only", [False, True])
def test_the_dashboard_serves_metrics_and_metrics_only_serves_nothing_else(home, metrics_only):
    srv, base = serve(metrics_only)
    try:
        with urllib.request.urlopen(f"{base}/metrics", timeout=10) as answer:
            assert answer.headers["Content-Type"].startswith("text/plain; version=0.0.4")
            got = samples(answer.read().decode())
        assert got[("mlxops_job_step", (("job_name", "tiny-lm"),))] == 239
        if metrics_only:
            with pytest.raises(urllib.error.HTTPError) as page:
                urllib.request.urlopen(f"{base}/", timeout=10)
            assert page.value.code == 404
        else:
            with urllib.request.urlopen(f"{base}/api/jobs", timeout=10) as answer:
                assert json.load(answer)["jobs"][0]["name"] == "tiny-lm"
    finally:
        srv.shutdown()
        srv.server_close()

"""The dashboard's server (on a recorded mirror) and what it serves: headers, routes,
loopback-only answers; the page's files load nothing from elsewhere. The report: one file,
its data inlined and escaped, ``--json`` the same data."""

from __future__ import annotations

import http.client
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner
from test_monitor_mirror import Cluster

from mlxops.cli import cli
from mlxops.hostfacts import HostFacts
from mlxops.monitor import files, report, server
from mlxops.transport import Connector

DATA = Path(__file__).parents[1] / "data" / "monitor"
ROOT = Path(__file__).resolve().parents[3]
STATIC = Path(server.__file__).parent / "static"
SVG_NAMESPACE = "http://www.w3.org/2000/svg"   # a name in createElementNS, never fetched


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("MLXOPS_HOME", str(tmp_path / "home"))
    shutil.copytree(DATA / "finished", tmp_path / "home" / "jobs")
    return tmp_path / "home"


@pytest.fixture
def dashboard(home):
    srv = server.make_server("127.0.0.1", 0)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield srv.server_address[1]
    srv.shutdown()
    srv.server_close()


def get(port: int, path: str, host: str | None = None):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("GET", path, headers={"Host": host or f"127.0.0.1:{port}"})
    response = conn.getresponse()
    body = response.read()
    conn.close()
    return response, body


def test_every_answer_says_default_src_self(dashboard):
    for path in ["/", "/static/app.js", "/static/chart.js", "/static/view.js",
                 "/static/app.css", "/api/jobs", "/api/job/tiny-lm", "/nope"]:
        response, _ = get(dashboard, path)
        csp = response.getheader("Content-Security-Policy")
        assert csp.startswith("default-src 'self'"), (path, csp)
        assert response.getheader("X-Content-Type-Options") == "nosniff"


def test_routes(dashboard):
    response, body = get(dashboard, "/")
    assert response.status == 200 and response.getheader("Content-Type").startswith("text/html")
    assert b'<script src="/static/app.js" defer>' in body
    response, body = get(dashboard, "/static/chart.js")
    assert response.getheader("Content-Type").startswith("text/javascript")
    jobs = json.loads(get(dashboard, "/api/jobs")[1])
    assert [j["name"] for j in jobs["jobs"]] == ["tiny-lm"]
    assert jobs["jobs"][0] | {"updated": None} == {
        "name": "tiny-lm", "state": "finished", "step": 300, "steps": 300,
        "loss": jobs["jobs"][0]["loss"], "tokens_per_sec": jobs["jobs"][0]["tokens_per_sec"],
        "attempt": 2, "restarts": 1, "alerts": 0, "updated": None}
    assert jobs["bench"] is None
    doc = json.loads(get(dashboard, "/api/job/tiny-lm?points=10")[1])
    assert len(doc["metrics"]["step"]) == 10 and doc["metrics"]["step"][-1] == 300
    assert doc["restarts"][0]["step"] == 150
    for path, status in [("/api/job/nope", 404), ("/api/job/..%2Frecord.json", 404),
                         ("/static/../server.py", 404), ("/static/index.html", 404),
                         ("/api/job/tiny-lm?points=many", 400)]:
        assert get(dashboard, path)[0].status == status, path


def test_bound_to_loopback_it_answers_loopback_names_only(dashboard):
    assert get(dashboard, "/", host=f"localhost:{dashboard}")[0].status == 200
    assert get(dashboard, "/", host="localhost:9999")[0].status == 200   # ssh -L 9999:...
    assert get(dashboard, "/", host=f"[::1]:{dashboard}")[0].status == 200
    # A page on another site resolving its own name to 127.0.0.1 (DNS rebinding):
    assert get(dashboard, "/api/jobs", host="evil.example:8050")[0].status == 403


def test_told_to_listen_elsewhere_it_answers_any_name(home):
    srv = server.make_server("0.0.0.0", 0)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        assert get(srv.server_address[1], "/", host="studio.lan:8050")[0].status == 200
    finally:
        srv.shutdown()
        srv.server_close()


def test_the_page_loads_nothing_from_anywhere_else():
    for path in STATIC.iterdir():
        text = path.read_text()
        urls = set(re.findall(r"https?://[^\s\"'`)<>]+", text)) - {SVG_NAMESPACE}
        assert not urls, (path.name, urls)
        assert not re.search(r"\bimport\s*\(|@import|url\(", text), path.name
    page = (STATIC / "index.html").read_text()
    # No inline script, style or handler: CSP default-src 'self' would block them.
    assert all("src=" in tag for tag in re.findall(r"<script[^>]*>", page))
    assert "<style" not in page and not re.search(r"\sstyle=|\son\w+=", page)
    assert not re.search(r"\.innerHTML|eval\(|new Function|setAttribute\(\"style",
                         "".join(p.read_text() for p in STATIC.glob("*.js")))


def test_the_report_is_one_file_with_its_data_and_scripts_inlined(home, tmp_path):
    target = tmp_path / "out.html"
    result = CliRunner().invoke(cli, ["report", "tiny-lm", "-o", str(target)])
    assert result.exit_code == 0, result.output
    page = target.read_text()
    assert f'content="{report.CSP}"' in page and "default-src 'none'" in report.CSP
    assert not re.search(r"<(script|link|img)[^>]+(src|href)=", page)   # nothing to fetch
    assert set(re.findall(r"https?://[^\s\"'`)<>]+", page)) <= {SVG_NAMESPACE}
    data = re.search(r'<script type="application/json" id="mlxops-data">(.*?)</script>',
                     page, re.S).group(1)
    doc = json.loads(data)
    assert doc["name"] == "tiny-lm" and doc["restarts"][0]["step"] == 150
    assert doc["plan"] is None and doc["bench"] is None   # no cached facts, no bench here


def test_text_from_the_run_cannot_end_the_data_script(home, tmp_path):
    record = home / "jobs" / "tiny-lm" / "record.json"
    doc = json.loads(record.read_text())
    doc["restarts"][0]["reason"] = "rank 2 </script><script>alert(1)</script>"
    record.write_text(json.dumps(doc))
    target = tmp_path / "out.html"
    assert CliRunner().invoke(cli, ["report", "tiny-lm", "-o", str(target)]).exit_code == 0
    page = target.read_text()
    assert "<script>alert(1)" not in page
    data = re.search(r'id="mlxops-data">(.*?)</script>', page, re.S).group(1)
    assert json.loads(data)["restarts"][0]["reason"].endswith("<script>alert(1)</script>")


def test_report_json_is_the_same_data_whole(home, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(cli, ["report", "tiny-lm", "--json"])
    assert result.exit_code == 0
    doc = json.loads(result.stdout)
    assert doc["metrics_lines"] == len(doc["metrics"]["step"]) == 60
    assert {"plan", "bench", "summary", "ranks", "nodes", "alerts", "job"} <= set(doc)
    assert not list(tmp_path.glob("*.html"))   # --json alone writes no file
    bad = CliRunner().invoke(cli, ["report", "nope"])
    assert bad.exit_code == 2 and "known jobs: tiny-lm" in bad.output


def test_the_report_plans_from_cached_facts(home, tmp_path):
    facts = home / "facts"
    facts.mkdir()
    cached = replace(HostFacts.unknown(), memory_bytes=16 * 1024**3)
    (facts / "localhost.json").write_text(json.dumps(cached.to_json()))
    result = CliRunner().invoke(cli, ["report", "tiny-lm", "--json"])
    [row] = json.loads(result.stdout)["plan"]
    assert (row["host"], row["ranks"], row["memory_bytes"], row["fits"]) == \
        ("localhost", 3, 16 * 1024**3, True)


def test_a_port_in_use_fails_and_an_address_not_here_is_bad_input(home):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        busy = CliRunner().invoke(cli, ["dashboard", "--port", str(port), "--offline"])
    assert busy.exit_code == 1 and f"port {port} on 127.0.0.1 is in use" in busy.output
    bad = CliRunner().invoke(cli, ["dashboard", "--host", "192.0.2.77", "--offline"])
    assert bad.exit_code == 2 and "--host: cannot listen on '192.0.2.77'" in bad.output


def test_the_dashboard_looks_at_running_jobs_nobody_fed_lately(tmp_path, monkeypatch):
    monkeypatch.setenv("MLXOPS_HOME", str(tmp_path / "home"))
    cluster = Cluster(tmp_path, ["a"])
    cluster.record({0: "a"}, name="live")
    ended = cluster.record({0: "a"}, name="done")
    ended.state = "finished"
    ended.save()
    (cluster.run_dir("a", "live") / "metrics.jsonl").write_text('{"step": 1}\n')
    # Rank 0 of "live" runs: a process leading its own group, as spawn starts ranks.
    rank = subprocess.Popen(["sleep", "60"], start_new_session=True)
    (cluster.run_dir("a", "live") / "rank-0.pid").write_text(f"{rank.pid}\n")
    try:
        with Connector() as connector:
            feeds = server.JobFeeds(connector, interval=30)
            assert feeds.due("live") and not feeds.due("done")
            feeds.once()
            assert files.read_state("live").updated is not None
            assert not files.path("done", files.STATE).exists()   # an ended job: no look
            assert not feeds.due("live")          # just fed: the next look waits its interval
            state = files.read_state("live")
            state.updated -= 60
            files.write_state("live", state)
            assert feeds.due("live")
            rank.kill()
            rank.wait()
            feeds.once()                          # it looks, and sees the job ended...
            assert files.parse_lines(files.path("live", files.SAMPLES).read_text())[-1][
                "state"] == "failed"
            state = files.read_state("live")
            state.updated -= 60
            files.write_state("live", state)
            assert not feeds.due("live")   # ...so no more, though the record says running
    finally:
        rank.kill()
        rank.wait()
    assert feeds.errors == {}


def listening(port: int) -> set[str]:
    """The local addresses of TCP sockets listening on ``port`` here (/proc/net/tcp, tcp6)."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            address, _, hexport = local.rpartition(":")
            if state == "0A" and int(hexport, 16) == port:   # 0A: LISTEN
                found.add(address)
    return found


def test_by_default_the_dashboard_listens_on_loopback_only(home):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "mlxops", "dashboard", "--port", str(port),
                             "--offline"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        deadline = time.monotonic() + 30
        while not listening(port):
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()
            time.sleep(0.1)
        assert listening(port) == {"0100007F"}   # 127.0.0.1, nothing else
    finally:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 0
    assert "ssh -L" in proc.stderr.read()

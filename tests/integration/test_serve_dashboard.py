"""A serve job in the dashboard and the report, as a person sees them (headless Chromium):
the recorded mirror of a real serve job (tests/unit/data/monitor/README.md, "serving"),
its requests, tokens/s and latency drawn over time with its restart marked, and no
training panel (loss, steps, all-reduce). The pattern and helpers are test_monitor.py's.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from test_monitor import ROOT, Dashboard, charts, chromium, needs_chromium

SERVING = ROOT / "tests" / "unit" / "data" / "monitor" / "serving"
#: Points each chart draws from the recording: the requests of its 35 looks with figures;
#: tokens/s and latency of 33 (none before the first probe answered, of each attempt);
#: node1's memory at all 36 looks.
DRAWN = {"serve-requests": 35, "serve-tokens": 33, "serve-latency": 33, "memory": 36}


def serve_charts(dom: str) -> dict[str, str]:
    return {m.group(1): m.group(0) for m in re.finditer(
        r'<svg[^>]*data-chart="([\w-]+)".*?</svg>', dom, re.S)}


@needs_chromium
def test_a_serve_job_draws_its_requests_tokens_and_latency_not_training_panels(tmp_path):
    shutil.copytree(SERVING, Path(os.environ["MLXOPS_HOME"]) / "jobs")
    target = tmp_path / "report.html"
    done = subprocess.run([sys.executable, "-m", "mlxops", "report", "serve-demo", "-o",
                           str(target)], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr
    dashboard = Dashboard("--offline")
    shot = tmp_path / "dashboard-serve.png"
    try:
        report = chromium(target.as_uri(), "--dump-dom", offline=os.geteuid() == 0)
        page = chromium(dashboard.url + "#job=serve-demo", "--virtual-time-budget=5000",
                        "--dump-dom")
        chromium(dashboard.url + "#job=serve-demo", "--virtual-time-budget=5000",
                 f"--screenshot={shot}", "--window-size=1400,1300")
    finally:
        dashboard.close()
    print(f"dashboard screenshot: {shot}")
    for dom in (report, page):
        assert charts(dom) == DRAWN, charts(dom)
        drawn = serve_charts(dom)
        # The restart is marked on every curve, where it happened.
        assert all(chart.count('class="restart-marker"') == 1 for chart in drawn.values())
        assert "98 (30 this attempt)" in dom        # requests: both attempts added up
        assert "on node1" in dom and "HTTP on 127.0.0.1:8191" in dom
        # No training facts: the training charts are already absent (the exact set above).
        assert "<dt>loss</dt>" not in dom and "<dt>step</dt>" not in dom
        assert "no heartbeat" not in dom            # a server writes none: no such alert
    assert re.search(r'<body[^>]*data-drawn="4"', report), report[:2000]
    assert '"serve": {' in report and "serving" in report   # its config, as launched
    # The job table: a serve job's row says what it serves, not steps.
    assert "serving, 98 requests" in page

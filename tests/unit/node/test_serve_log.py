"""The node's count of the requests a serve job's server answered (node/serverlog.py), from
its log as mlx-lm 0.32.2's server wrote it in this project's sandbox (Python's
BaseHTTPRequestHandler request lines, mlx-lm's own logging). Illustrative, in that format:
the 404 line, the ``/health`` line and the line cut while being written."""

from __future__ import annotations

from mlxops.node.serverlog import requests_answered

# rank-0.log of a serve job (tests/integration/test_serve.py's), cut to a few lines.
ATTEMPT_1 = """\
mlxops: started (pid 9247)
{"step": 20, "arch": "llama", "checkpoint": "/home/mlxnode/.mlxops/runs/h20-train/ckpt/..."}
2026-11-24 08:14:47,045 - INFO - Starting httpd at 127.0.0.1 on port 8181...
127.0.0.1 - - [24/Nov/2026 08:15:19] "GET /v1/models HTTP/1.1" 200 -
127.0.0.1 - - [24/Nov/2026 08:15:21] "POST /v1/chat/completions HTTP/1.1" 200 -
2026-11-24 08:15:21,101 - INFO - Prompt processing progress: 22/22
127.0.0.1 - - [24/Nov/2026 08:15:22] "POST /v1/completions HTTP/1.1" 200 -
127.0.0.1 - - [24/Nov/2026 08:15:23] "POST /v1/completions HTTP/1.1" 404 -
127.0.0.1 - - [24/Nov/2026 08:15:24] "GET /health HTTP/1.1" 200 -
"""
ATTEMPT_2 = """\
mlxops: started (pid 13301)
2026-11-24 08:20:02,310 - INFO - Starting httpd at 127.0.0.1 on port 8181...
127.0.0.1 - - [24/Nov/2026 08:20:05] "POST /v1/completions HTTP/1.1" 200 -
"""


def test_answered_v1_requests_of_this_attempt_counted_as_the_log_grows(tmp_path):
    log = tmp_path / "rank-0.log"
    assert requests_answered(tmp_path) is None
    log.write_text(ATTEMPT_1)
    assert requests_answered(tmp_path) == 3
    assert requests_answered(tmp_path) == 3            # read once: only what was appended
    with open(log, "a") as f:
        f.write('127.0.0.1 - - [24/Nov/2026 08:15:30] "POST /v1/completions HTTP/1.1" 200 -\n'
                '127.0.0.1 - - [24/Nov/2026 08:15:31] "POST /v1/compl')  # being written
    assert requests_answered(tmp_path) == 4
    with open(log, "a") as f:
        f.write('etions HTTP/1.1" 200 -\n' + ATTEMPT_2)
    assert requests_answered(tmp_path) == 1            # the new attempt's only


def test_a_rewritten_log_is_read_again(tmp_path):
    log = tmp_path / "rank-0.log"
    log.write_text(ATTEMPT_1 + ATTEMPT_1)
    assert requests_answered(tmp_path) == 3
    log.write_text(ATTEMPT_2)
    assert requests_answered(tmp_path) == 1

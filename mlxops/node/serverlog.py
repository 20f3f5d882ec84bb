"""Requests a serve job's server answered, counted in its log (``rank-0.log``): the
node's reader behind ``RankAnswer.requests`` (docs/node-protocol.md).

mlx-lm's server is Python's ``BaseHTTPRequestHandler``: each answered request is one line
on stderr, ``127.0.0.1 - - [24/Nov/2026 08:15:19] "POST /v1/completions HTTP/1.1" 200 -``.
The count is of this attempt's lines (after its start script's
:data:`protocol.START_LINE`) for ``/v1/`` paths with a 2xx status; the watchdog's own
one-token probes are among them (the controller knows how many it sent).

The log only grows, so the count is kept beside it (:data:`SERVE_COUNT`: the byte
offset read up to and the count there) and each look reads only what was appended; a log
shorter than the offset (rewritten) is read again from 0.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from mlxops.node import protocol
from mlxops.node.protocol.serve import SERVE_COUNT

ANSWERED = re.compile(rb'"(?:GET|POST) /v1/\S* HTTP/1\.[01]" 2\d\d ')


def requests_answered(run_dir: Path, rank: int = 0) -> int | None:
    """This attempt's answered requests in ``rank``'s log; None without a log."""
    log = run_dir / protocol.process_file(rank, protocol.LOG)
    counter = run_dir / SERVE_COUNT
    try:
        size = log.stat().st_size
    except OSError:
        return None
    try:
        kept = json.loads(counter.read_text())
        offset, count = int(kept["offset"]), int(kept["count"])
    except (OSError, ValueError, KeyError, TypeError):
        offset, count = 0, 0
    if offset > size:
        offset, count = 0, 0
    with open(log, "rb") as f:
        f.seek(offset)
        chunk = f.read(size - offset)
    end = chunk.rfind(b"\n") + 1  # a line being written is read next time
    for line in chunk[:end].splitlines():
        if line.startswith(protocol.START_LINE.encode()):
            count = 0  # a new attempt
        elif ANSWERED.search(line):
            count += 1
    tmp = counter.with_name(f".{counter.name}.{os.getpid()}")
    try:
        tmp.write_text(json.dumps({"offset": offset + end, "count": count}))
        os.replace(tmp, counter)
    except OSError:
        pass  # counted again from the same offset next time
    return count

"""``mlxops dashboard``: a local web page of every job, served from the mirrors.

Standard library only (``http.server``). It serves a fixed set of files shipped in the
wheel (``static/``) and two JSON endpoints the page polls:

* ``GET /api/jobs``: ``{"now", "jobs": [one line per job], "bench": the last bench}``
  (a serve job's line: ``serve``, its ``requests`` and its canary's ``tokens_per_sec``);
* ``GET /api/job/NAME?points=N``: the job document (docs/formats.md, "mlxops report
  --json"), each series thinned to about N rows;

and ``GET /metrics``, the same jobs for Prometheus (:mod:`mlxops.monitor.prom`). With
``metrics_only`` (``mlxops dashboard --metrics-only``, a headless controller) it serves
``/metrics`` and nothing else.

Every answer carries ``Content-Security-Policy: default-src 'self'``: the page can load
nothing from anywhere else. It binds 127.0.0.1 unless told otherwise, and while bound to
loopback it answers only requests addressed to a loopback name (a page elsewhere cannot
reach it through DNS rebinding). A feeder thread keeps the mirrors of running jobs fresh
(:class:`JobFeeds`) unless the dashboard runs offline.
"""

from __future__ import annotations

import ipaddress
import json
import socket
import threading
import time
from collections.abc import Callable
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from mlxops.errors import MlxopsError
from mlxops.jobs.jobdirs import list_jobs
from mlxops.jobs.record import load_record
from mlxops.jobs.spec import NAME
from mlxops.monitor import bench, files, prom
from mlxops.monitor.data import MirrorReader, document
from mlxops.monitor.mirror import feed
from mlxops.monitor.records import JobDocument
from mlxops.node.protocol import ENDED_STATES
from mlxops.transport import Connector

STATIC = Path(__file__).resolve().parent / "static"
TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
         ".css": "text/css; charset=utf-8", ".svg": "image/svg+xml"}
CSP = "default-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'"
HEADERS = {"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff",
           "Referrer-Policy": "no-referrer", "Cache-Control": "no-store"}
LOOPBACK_NAMES = {"localhost", "127.0.0.1", "::1"}
MAX_POINTS = 20000


def static_files() -> dict[str, tuple[bytes, str]]:
    """``{url path: (body, content type)}``: the page and its scripts and style, read once."""
    found = {"/": ((STATIC / "index.html").read_bytes(), TYPES[".html"])}
    for path in sorted(STATIC.iterdir()):
        if path.is_file() and path.suffix in TYPES and path.name != "index.html":
            found[f"/static/{path.name}"] = (path.read_bytes(), TYPES[path.suffix])
    return found


def is_loopback(host: str) -> bool:
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def host_name(header: str) -> str:
    """``localhost`` of ``localhost:8050``, ``::1`` of ``[::1]:8050``."""
    header = header.strip().lower()
    if header.startswith("["):
        return header[1:header.find("]")] if "]" in header else header
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


class Jobs:
    """The mirrors as the page sees them: one reader per job, documents rebuilt only when
    the mirror or the record changed."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._readers: dict[str, MirrorReader] = {}
        self._docs: dict[tuple[str, int | None], tuple[Any, JobDocument]] = {}

    def document(self, name: str, points: int | None) -> JobDocument:
        with self._lock:
            reader = self._readers.setdefault(name, MirrorReader(name))
            mirror = reader.read()
            key = (mirror.record.updated, mirror.state.updated, mirror.state.generation,
                   len(mirror.metrics), len(mirror.samples), mirror.record.state,
                   len(mirror.events))
            cached = self._docs.get((name, points))
            if cached and cached[0] == key:
                return cached[1]
            doc = document(mirror, points=points)
            self._docs[(name, points)] = (key, doc)
            return doc

    def overview(self) -> dict[str, Any]:
        lines = []
        for name in list_jobs():
            try:
                doc = self.document(name, 2)
            except MlxopsError:
                continue  # a record being rewritten, or unreadable: next poll
            s = doc.summary
            line = {"name": name, "state": doc.state, "step": s.step,
                    "steps": s.steps, "loss": s.loss_last,
                    "tokens_per_sec": s.tokens_per_sec,
                    "attempt": doc.job.attempt, "restarts": s.restarts,
                    "alerts": len(doc.alerts), "updated": doc.updated}
            if doc.serves:  # no steps nor loss: its server's figures
                figures = doc.serve
                line.update(serve=True,
                            requests=figures.requests_total if figures else None,
                            tokens_per_sec=figures.last.get("tokens_per_sec")
                            if figures else None)
            lines.append(line)
        return {"now": time.time(), "jobs": lines, "bench": bench.latest()}


class JobFeeds:
    """Keeps the mirrors of running jobs fresh: every ``interval`` seconds, a job whose
    mirror nobody fed that long (a watchdog elsewhere feeds it too) gets a look."""

    def __init__(self, connector: Connector, interval: float,
                 log: Callable[[str], None] = lambda _: None) -> None:
        self.connector = connector
        self.interval = interval
        self.log = log
        self.errors: dict[str, str] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="mlxops-feeds", daemon=True)

    def start(self) -> JobFeeds:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=60)

    def due(self, name: str) -> bool:
        record = load_record(name)
        if record.state in ENDED_STATES:
            return False
        state = files.read_state(name)
        if state.updated is not None and time.time() - state.updated < self.interval:
            return False
        last = files.JsonlTail(files.path(name, files.SAMPLES)).read()
        # A job that ended without a watchdog to record it: its last look says so.
        return not (last and last[-1].get("state") in ENDED_STATES
                    and state.created == record.created and record.updated <= last[-1]["time"])

    def once(self) -> None:
        for name in list_jobs():
            if self._stop.is_set():
                return
            try:
                if self.due(name):
                    feed(load_record(name), self.connector)
                self.errors.pop(name, None)
            except MlxopsError as exc:
                if self.errors.get(name) != str(exc):
                    self.log(f"{name}: {exc}")
                self.errors[name] = str(exc)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.once()
            self._stop.wait(self.interval)


def handler(jobs: Jobs, pages: dict[str, tuple[bytes, str]], bound: str,
            metrics_only: bool = False) -> type[BaseHTTPRequestHandler]:
    guard = is_loopback(bound)

    class Handler(BaseHTTPRequestHandler):
        server_version = "mlxops-dashboard"
        sys_version = ""

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib's name
            pass  # the terminal is for the URL and errors, not one line per poll

        def _send(self, code: int, body: bytes, kind: str) -> None:
            self.send_response(code)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            for key, value in HEADERS.items():
                self.send_header(key, value)
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def _json(self, doc: Any, code: int = 200) -> None:
            self._send(code, json.dumps(doc).encode(), "application/json")

        def _error(self, code: HTTPStatus, message: str) -> None:
            self._json({"error": message}, code)

        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            if guard and not is_loopback(host_name(self.headers.get("Host", ""))):
                self._error(HTTPStatus.FORBIDDEN, "this dashboard answers loopback names only")
                return
            url = urlsplit(self.path)
            if url.path == "/metrics":
                self._send(200, prom.exposition(lambda n: jobs.document(n, 2)),
                           prom.CONTENT_TYPE)
            elif metrics_only:
                self._error(HTTPStatus.NOT_FOUND, "this server answers /metrics only")
            elif url.path in pages:
                self._send(200, *pages[url.path])
            elif url.path == "/api/jobs":
                self._json(jobs.overview())
            elif url.path.startswith("/api/job/"):
                self._job(url.path[len("/api/job/"):], parse_qs(url.query))
            else:
                self._error(HTTPStatus.NOT_FOUND, f"no {url.path} here")

        do_HEAD = do_GET

        def _job(self, name: str, query: dict[str, list[str]]) -> None:
            if not NAME.match(name) or name not in list_jobs():
                self._error(HTTPStatus.NOT_FOUND, f"no job named {name!r}")
                return
            try:
                points = min(MAX_POINTS, max(2, int(query.get("points", ["1500"])[0])))
            except ValueError:
                self._error(HTTPStatus.BAD_REQUEST, "points: a number")
                return
            self._json(jobs.document(name, points).to_dict())

    return Handler


class _Server(ThreadingHTTPServer):
    daemon_threads = True


class _Server6(_Server):
    address_family = socket.AF_INET6


def make_server(host: str, port: int, *, metrics_only: bool = False) -> ThreadingHTTPServer:
    """The dashboard's server, bound and ready (``serve_forever`` to run it)."""
    kind = _Server6 if ":" in host else _Server
    return kind((host, port), handler(Jobs(), static_files(), host, metrics_only))

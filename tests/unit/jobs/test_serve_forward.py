"""The forward (transport/forward.py) and the watchdog's probe (jobs/serveprobe.py), on this
machine: a local connection (a host with ``ansible_connection: local``) to a small HTTP
server in a thread that answers as mlx-lm's does, or hangs, or is not there."""

from __future__ import annotations

import json
import socket
import threading
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from mlxops.errors import UserError
from mlxops.jobs.serveprobe import ProbeResult, ProbeWatch, probe
from mlxops.jobs.servespec import ServeSpec
from mlxops.transport import HostUnreachable, LocalConnection
from mlxops.transport.forward import Forward, http_exchange


class Handler(BaseHTTPRequestHandler):
    hang = threading.Event()           # set: never answer (a hung server)
    release = threading.Event()

    def do_POST(self):  # noqa: N802 - http.server's name
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if Handler.hang.is_set():
            Handler.release.wait(10)
            return
        if body.get("stream"):
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            for word in ("a", "b", "c"):
                self.wfile.write(f"data: {json.dumps({'text': word})}\n\n".encode())
                self.wfile.flush()
            return
        answer = json.dumps({"choices": [{"text": "x" * body["max_tokens"]}],
                             "usage": {"completion_tokens": body["max_tokens"]}}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, *args):
        pass


@pytest.fixture
def server():
    Handler.hang.clear()
    Handler.release.clear()
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield httpd.server_address[1]
    Handler.release.set()
    httpd.shutdown()
    httpd.server_close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_forward_carries_requests_and_streams(server):
    with Forward(LocalConnection("here"), "127.0.0.1", server) as forward:
        assert forward.url == f"http://127.0.0.1:{forward.local_port}"
        request = urllib.request.Request(
            forward.url + "/v1/completions", method="POST",
            data=json.dumps({"max_tokens": 3}).encode())
        with urllib.request.urlopen(request, timeout=10) as answer:
            assert json.loads(answer.read())["choices"] == [{"text": "xxx"}]
        request.data = json.dumps({"max_tokens": 3, "stream": True}).encode()
        with urllib.request.urlopen(request, timeout=10) as answer:
            events = [line for line in answer.read().decode().splitlines() if line]
        assert events == [f"data: {json.dumps({'text': w})}" for w in "abc"]
        assert forward.connections == 2 and forward.errors == []


def test_a_forward_to_nothing_refuses_its_client_and_says_why():
    with Forward(LocalConnection("here"), "127.0.0.1", free_port()) as forward:
        with pytest.raises(OSError):
            urllib.request.urlopen(forward.url + "/v1/models", timeout=10)
        assert forward.errors and "ConnectionRefusedError" in forward.errors[0]


def test_http_exchange_reads_the_whole_answer(server):
    with socket.create_connection(("127.0.0.1", server)) as stream:
        answer = http_exchange(stream, "POST", "/v1/completions", {"max_tokens": 2},
                               timeout=10)
    assert answer.status == 200 and answer.json()["choices"] == [{"text": "xx"}]
    assert 0 < answer.seconds < 10


def spec(port: int, **kw) -> ServeSpec:
    return ServeSpec(model="/m", port=port, **{"probe_timeout": 2.0, **kw})


def test_the_probe_sees_an_answer_a_hang_and_nothing(server):
    here = LocalConnection("here")
    ok = probe(here, spec(server))
    assert ok.ok and ok.seconds is not None
    Handler.hang.set()
    hung = probe(here, spec(server, probe_timeout=0.5))
    assert not hung.ok and hung.hung
    nothing = probe(here, spec(free_port()))
    assert not nothing.ok and nothing.refused and not nothing.hung


def test_the_probes_add_up_to_a_problem_or_not():
    watch = ProbeWatch(spec(1234, start_timeout=60), "node1", started=0.0)
    refused = ProbeResult(False, refused=True, error="refused")
    assert watch.problem(refused, now=30.0) is None          # still loading its model
    assert watch.problem(refused, now=61.0) == (
        "the server on node1 did not answer in 61s since its start "
        "(serve.start_timeout 60s): refused")
    assert watch.problem(ProbeResult(True, 0.01), now=62.0) is None
    watch.answered_at(5)                           # the count after that answer
    assert watch.problem(refused, now=63.0) == "the server on node1 stopped answering (refused)"
    hung = ProbeResult(False, hung=True)
    assert watch.problem(hung, now=64.0, requests=5) is None  # a request not logged yet?
    assert watch.problem(hung, now=67.0, requests=5) == (
        "the server on node1 did not answer a one-token completion in 2s, 2 in a row, and "
        "its request count has not moved since the last answer (hung)")
    assert watch.answered == 1


def test_a_probe_held_up_behind_other_requests_is_busy_not_hung():
    """Hung = the probe timed out AND the request count has not moved since the last
    answered probe, or serve.hung_probes timed out in a row (a generation that never ends)."""
    hung = ProbeResult(False, hung=True)
    watch = ProbeWatch(spec(1234, hung_probes=3), "node1", started=0.0)
    assert watch.problem(ProbeResult(True, 0.01), now=1.0) is None
    watch.answered_at(10)                          # the count after that answer
    assert watch.problem(hung, now=2.0, requests=11) is None    # a long request started
    assert watch.busy() == ("the server on node1 is busy: the probe waited 2s behind "
                            "requests it started since (not hung; 1 of 3 in a row)")
    assert watch.problem(hung, now=3.0, requests=11) is None    # still on it
    assert watch.problem(hung, now=4.0, requests=11).endswith(
        "in 2s, 3 probes in a row (hung)")
    # Answered again: the streak starts over; a server frozen with nothing new is hung at
    # the second timeout (at the first, a request taken on may not be in its log yet: the
    # line is written when its answer starts), unless the count moves in between.
    assert watch.problem(ProbeResult(True, 0.01), now=5.0) is None
    watch.answered_at(12)
    assert watch.problem(hung, now=5.5, requests=12) is None
    assert "(its request count not moved yet: a request is logged once its answer " \
        "starts)" in watch.busy()
    assert watch.problem(hung, now=5.7, requests=13) is None   # the long request's line
    assert watch.problem(ProbeResult(True, 0.01), now=5.8) is None
    watch.answered_at(13)
    assert watch.problem(hung, now=5.9, requests=13) is None
    assert "2 in a row, and its request count has not moved" in watch.problem(
        hung, now=6.0, requests=13)
    # A count not known (its host too busy to say in time) is neither a move nor a stop:
    # such timeouts are judged by hung_probes in a row alone.
    watch.timeouts = 0
    assert watch.problem(hung, now=7.0, requests=None) is None and watch.moved is None
    assert watch.problem(hung, now=8.0, requests=None) is None
    assert watch.problem(hung, now=9.0, requests=None).endswith("3 probes in a row (hung)")


def test_hung_probes_is_a_whole_number(tmp_path):
    from mlxops.jobs.servespec import parse_serve

    with pytest.raises(UserError) as caught:
        parse_serve(tmp_path / "job.yml", {"model": "/m", "hung_probes": 0})
    assert "serve.hung_probes" in str(caught.value)


def test_a_canary_every_30_seconds_of_answers_gives_tokens_per_second(server):
    here = LocalConnection("here")
    watch = ProbeWatch(spec(server), "node1", started=0.0)
    assert watch.look(here, now=1.0) is None           # probe + the first canary
    assert watch.answered == 2 and watch.canary.tokens_per_sec > 0
    assert watch.look(here, now=20.0) is None          # probe only
    assert watch.answered == 3
    figures = watch.figures(requests=10)
    assert figures.latency == watch.last.seconds
    assert figures.tokens_per_sec == watch.canary.tokens_per_sec
    assert figures.requests == 7                       # the watchdog's own are not counted
    assert watch.figures(requests=None).requests is None


def test_the_monitor_shows_a_serve_jobs_figures_with_their_trend():
    from mlxops.monitor.data import serving
    from mlxops.monitor.live import serving_line

    samples = [{"time": 1.0, "ranks": []},  # before the first probe
               {"time": 6.0, "serve": {"requests": 2, "tokens_per_sec": 200.0,
                                       "latency": 0.02}},
               {"time": 11.0, "serve": {"requests": 5, "tokens_per_sec": 100.0,
                                        "latency": 0.04}}]
    doc = serving(samples)
    assert doc.history["latency"] == [0.02, 0.04] and doc.last["requests"] == 5
    assert str(serving_line(doc)) == ("serving: requests 5   tokens/s 100 (canary) █▁   "
                                      "latency 40 ms ▁█")
    assert serving([{"time": 1.0}]) is None


class AsleepHost:
    """A connector and connection to a host that does not answer: what the transport
    raises when a channel is not opened in time (connection.py, ``open_tunnel``)."""

    def connect(self, host):
        return self

    def open_tunnel(self, address, port, timeout):
        raise HostUnreachable("node1", "connection lost: Timeout opening channel.")


def test_a_host_that_does_not_answer_the_probe_is_the_servers_problem():
    from mlxops.jobs.watch import _probe

    watch = ProbeWatch(spec(8080), "node1", started=0.0)
    problem = _probe(watch, AsleepHost(), {"node1": object()}, lambda: None)
    assert problem == ("the server on node1 could not be probed: node1 not answering "
                       "(connection lost: Timeout opening channel.)")
    assert watch.last.unreached and not watch.last.ok


def test_the_requests_count_waits_for_its_status_count_wait_at_most(monkeypatch):
    """A status that hangs (its host asleep) is LATE after COUNT_WAIT, BUSY while it still
    hangs; once it is answered the next ask counts again."""
    from types import SimpleNamespace

    from mlxops.jobs import watch

    release = threading.Event()

    def status(record, connector, hosts):
        if record == "asleep":
            release.wait(10)
        return SimpleNamespace(ranks=[SimpleNamespace(requests=7)])

    monkeypatch.setattr(watch, "job_status", status)
    monkeypatch.setattr(watch._Counts, "COUNT_WAIT", 0.2)
    counts = watch._Counts(connector=None, hosts={})
    assert counts.read("awake") == 7
    assert counts.read("asleep") is watch._Counts.LATE
    assert counts.read("awake") is watch._Counts.BUSY
    release.set()
    counts._thread.join(5)
    assert counts.read("awake") == 7


class Chunked(BaseHTTPRequestHandler):
    """Answers as a server that streams its body (``Transfer-Encoding: chunked``), the
    chunks split where a reader of raw bytes would keep the chunk sizes in the body."""

    protocol_version = "HTTP/1.1"

    def do_POST(self):  # noqa: N802 - http.server's name
        self.rfile.read(int(self.headers["Content-Length"]))
        answer = json.dumps({"choices": [{"text": "hello"}], "usage": {"completion_tokens": 5}})
        self.send_response(200)
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("Connection", "close")
        self.end_headers()
        for part in (answer[:7], answer[7:20], answer[20:]):
            self.wfile.write(f"{len(part.encode()):x}\r\n".encode() + part.encode() + b"\r\n")
            self.wfile.flush()
        self.wfile.write(b"0\r\n\r\n")

    def log_message(self, *args):
        pass


def test_http_exchange_decodes_a_chunked_answer():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Chunked)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        with socket.create_connection(httpd.server_address) as stream:
            answer = http_exchange(stream, "POST", "/v1/completions", {"max_tokens": 5},
                                   timeout=10)
    finally:
        httpd.shutdown()
        httpd.server_close()
    assert answer.status == 200
    assert answer.json() == {"choices": [{"text": "hello"}], "usage": {"completion_tokens": 5}}


def test_http_exchange_says_what_is_not_http():
    listener = socket.create_server(("127.0.0.1", 0))

    def garbage():
        peer, _ = listener.accept()
        peer.recv(4096)
        peer.sendall(b"SSH-2.0-OpenSSH_9.6\r\n")
        peer.close()

    thread = threading.Thread(target=garbage, daemon=True)
    thread.start()
    with socket.create_connection(listener.getsockname()) as stream, \
            pytest.raises(ConnectionError, match="not an HTTP answer"):
        http_exchange(stream, "POST", "/v1/completions", {}, timeout=10)
    listener.close()

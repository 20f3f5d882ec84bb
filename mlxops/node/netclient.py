"""The bench's measuring client on a node: the ``bench-client`` command
(docs/node-protocol.md, "Bench commands").

Latency: ping-pong of 64-byte messages on one persistent TCP_NODELAY connection, 200
untimed round trips, then 2,000 timed; min/p50/p90/p99/max with nearest-rank percentiles.

Bandwidth, iperf3's method: N parallel streams for a fixed time, the first ``omit``
seconds left out (TCP slow start), bytes counted at the receiver over the receiver's own
window, Gbit/s decimal. ``up``: this node sends, the server counts; ``down``: the server
sends, this node counts; ``both``: the two at once (a ring edge carries both ways).
With an iperf3 port, each run is ``iperf3 -c -J`` against the server's ``iperf3 -s``
instead (whole seconds: iperf3 takes no fractions).
"""

from __future__ import annotations

import json
import secrets
import subprocess
import time
from collections.abc import Sequence

from mlxops.node.netserver import find_iperf3
from mlxops.node.netwire import (
    Streams,
    WireError,
    connect,
    expect,
    gbps,
    nearest_rank,
    recv_exact,
    send_line,
    window,
)
from mlxops.node.protocol.bench import (
    BOTH,
    DOWN,
    IPERF3_TOOL,
    LATENCY_BYTES,
    LATENCY_MIN_ROUNDS,
    LATENCY_ROUNDS,
    LATENCY_WARMUP,
    MLXOPS_TOOL,
    UP,
    ClientAnswer,
    LatencyAnswer,
    RunAnswer,
)

START_TIMEOUT = 15.0       # the server's "ok" and "go"
IPERF3_RETRIES = 3         # "the server is busy": its previous test is still ending


def client(*, peer: str, port: int, latency: bool, modes: Sequence[str],
           streams: Sequence[int], seconds: float, omit: float, iperf3_port: int = 0,
           latency_seconds: float = 0.0) -> ClientAnswer:
    if any(k < 1 for k in streams) or seconds <= 0 or omit < 0:
        raise ValueError("want streams >= 1, seconds > 0 and omit >= 0")
    iperf3 = find_iperf3() if iperf3_port else None
    if iperf3_port and iperf3 is None:
        raise OSError("iperf3 was asked for but is not installed here")
    answer = ClientAnswer(latency=measure_latency(peer, port, seconds=latency_seconds)
                          if latency else None)
    for k in streams:
        for mode in modes:
            if iperf3:
                answer.runs.append(iperf3_run(iperf3, peer, iperf3_port, mode, k, seconds,
                                              omit))
            else:
                answer.runs.append(bandwidth_run(peer, port, mode, k, seconds, omit))
    return answer


def measure_latency(peer: str, port: int, rounds: int = LATENCY_ROUNDS,
                    warmup: int = LATENCY_WARMUP, seconds: float = 0.0) -> LatencyAnswer:
    """``warmup`` untimed round trips, then ``rounds`` timed ones; with ``seconds``, the
    warm-up stops after a quarter of it and the timed ones once it is over (but never
    before :data:`LATENCY_MIN_ROUNDS`): a slow link's latency in a known time."""
    sock = connect(peer, port, nodelay=True)
    try:
        send_line(sock, {"op": "echo", "size": LATENCY_BYTES})
        expect(sock, "ok", START_TIMEOUT)
        sock.settimeout(10.0)
        message = b"\x5a" * LATENCY_BYTES
        view = memoryview(bytearray(LATENCY_BYTES))
        samples: list[float] = []
        clock = time.perf_counter_ns
        start = clock()
        box = int(seconds * 1e9) if seconds > 0 else None
        warm = 0
        while len(samples) < rounds:
            t0 = clock()
            if box is not None and len(samples) >= LATENCY_MIN_ROUNDS and t0 - start > box:
                break
            sock.sendall(message)
            if not recv_exact(sock, view):
                raise WireError("the server closed the echo connection")
            if warm < warmup and (box is None or t0 - start < box // 4):
                warm += 1
            else:
                samples.append((clock() - t0) / 1000)
    finally:
        sock.close()
    samples.sort()
    return LatencyAnswer(count=len(samples), min=samples[0],
                         p50=nearest_rank(samples, 50), p90=nearest_rank(samples, 90),
                         p99=nearest_rank(samples, 99), max=samples[-1])


def bandwidth_run(peer: str, port: int, mode: str, streams: int, seconds: float,
                  omit: float) -> RunAnswer:
    test_id = secrets.token_hex(8)
    ctrl = connect(peer, port)
    opened = []
    running = None
    try:
        send_line(ctrl, {"op": "test", "id": test_id, "mode": mode, "streams": streams,
                         "seconds": seconds, "omit": omit})
        expect(ctrl, "ok", START_TIMEOUT)
        socks = {UP: [], DOWN: []}
        for direction in (UP, DOWN):
            if mode in (direction, BOTH):
                for _ in range(streams):
                    sock = connect(peer, port)
                    opened.append(sock)
                    send_line(sock, {"op": "data", "id": test_id, "dir": direction})
                    socks[direction].append(sock)
        expect(ctrl, "go", START_TIMEOUT)
        start = time.monotonic()
        running = Streams(senders=socks[UP], receivers=socks[DOWN])
        running.start()
        answer = RunAnswer(mode=mode, streams=streams, tool=MLXOPS_TOOL, seconds=seconds)
        if socks[DOWN]:
            nbytes, length = window(running.meter, start, omit, seconds)
            answer.down_gbps, answer.seconds = gbps(nbytes, length), length
        if socks[UP]:
            counted = expect(ctrl, "bytes", omit + seconds + START_TIMEOUT)
            answer.up_gbps = gbps(int(counted["bytes"]), float(counted["seconds"]))
            answer.seconds = float(counted["seconds"])
        send_line(ctrl, {"op": "stop"})
        return answer
    finally:
        if running is not None:
            running.close()
        else:
            for sock in opened:
                sock.close()
        ctrl.close()


def iperf3_argv(iperf3: str, peer: str, port: int, mode: str, streams: int, seconds: float,
                omit: float) -> list[str]:
    argv = [iperf3, "-c", peer, "-p", str(port), "-J", "-t", str(max(1, round(seconds))),
            "-O", str(round(omit)), "-P", str(streams)]
    if mode == DOWN:
        argv.append("-R")
    elif mode == BOTH:
        argv.append("--bidir")
    return argv


def iperf3_result(mode: str, streams: int, doc: dict) -> RunAnswer:
    """A run from ``iperf3 -J``'s document: ``sum_received`` is what the receiver counted
    (the server's for a plain run, this side's with -R); ``--bidir`` adds the reverse
    direction's as ``sum_received_bidir_reverse``."""
    end = doc["end"]
    received = end["sum_received"]
    answer = RunAnswer(mode=mode, streams=streams, tool=IPERF3_TOOL,
                       seconds=float(received["seconds"]))
    forward = received["bits_per_second"] / 1e9
    if mode == UP:
        answer.up_gbps = forward
    elif mode == DOWN:
        answer.down_gbps = forward
    else:
        answer.up_gbps = forward
        answer.down_gbps = end["sum_received_bidir_reverse"]["bits_per_second"] / 1e9
    return answer


def iperf3_run(iperf3: str, peer: str, port: int, mode: str, streams: int, seconds: float,
               omit: float) -> RunAnswer:
    argv = iperf3_argv(iperf3, peer, port, mode, streams, seconds, omit)
    limit = max(1, round(seconds)) + round(omit) + 30
    attempt = 0
    while True:
        try:
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=limit)
        except subprocess.TimeoutExpired:
            raise WireError(f"iperf3: no result within {limit}s") from None
        try:
            doc = json.loads(proc.stdout)
        except ValueError:
            raise WireError(f"iperf3: exit {proc.returncode}: "
                            f"{(proc.stderr or proc.stdout).strip()[-200:]}") from None
        error = doc.get("error")
        if not error and proc.returncode == 0:
            return iperf3_result(mode, streams, doc)
        if "busy" in str(error) and attempt < IPERF3_RETRIES - 1:
            attempt += 1
            time.sleep(0.5)
            continue
        raise WireError(f"iperf3: {error or f'exit {proc.returncode}'}")

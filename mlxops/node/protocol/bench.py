"""The bench's half of the controller-node protocol: ``mlxops bench``'s node commands.

Standard library only, synced with the rest of ``mlxops/node``. :mod:`mlxops.node.protocol`
parses these commands and reads their answers (its ``parser()`` and ``parse_answer``); this
module keeps the bench's names, argument lists and answers out of its way. For people:
docs/node-protocol.md, "Bench commands".

* ``bench-serve`` starts the measuring server detached: latency echo and bandwidth streams on
  one TCP port of the node's address (and of 127.0.0.1, for the loopback run), optionally
  ``iperf3 -s`` on the next port; it exits by itself at a deadline.
* ``bench-client`` measures from this node to a server: ping-pong latency, then bandwidth
  runs (``up``: here to the peer, counted at the peer; ``down``: the peer to here, counted
  here; ``both``: the two at once), with mlxops' own streams or ``iperf3 -c -J``.
* ``bench-stop`` ends the server (and its iperf3) and says whether anything is left.

Everything lives in the bench's run directory, ``<mlxops_root>/runs/mlxops-bench/``, which
is also the run directory of the all-reduce ranks (an internal job of that name).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from mlxops.node.protocol.decode import Record

#: The internal job of the all-reduce sweep; its run directory holds the server's files too.
BENCH_JOB = "mlxops-bench"
SERVER_PID = "bench-server.pid"
SERVER_LOG = "bench-server.log"

BENCH_SERVE, BENCH_CLIENT, BENCH_STOP = "bench-serve", "bench-client", "bench-stop"
COMMANDS = (BENCH_SERVE, BENCH_CLIENT, BENCH_STOP)

#: Bandwidth run modes, from the client's side.
UP, DOWN, BOTH = "up", "down", "both"
MODES = (UP, DOWN, BOTH)
MLXOPS_TOOL, IPERF3_TOOL = "mlxops", "iperf3"

LATENCY_ROUNDS = 2000       # timed round trips
LATENCY_WARMUP = 200        # untimed ones first (connection, caches, CPU clocks)
LATENCY_BYTES = 64          # each way, per round trip
#: A time-boxed latency measurement still takes this many timed round trips, however slow.
LATENCY_MIN_ROUNDS = 20


def allreduce_result(rank: int) -> str:
    """``allreduce-rank-3.json``: one rank's results, in the bench's run directory."""
    return f"allreduce-rank-{int(rank)}.json"


def serve_args(run_dir: str, *, ip: str, port: int, deadline: float,
               iperf3_port: int = 0) -> list[str]:
    """Start the server on ``ip:port`` (and 127.0.0.1:port) for at most ``deadline``
    seconds; with ``iperf3_port``, also ``iperf3 -s`` there when the node has iperf3."""
    return [BENCH_SERVE, "--run-dir", run_dir, "--ip", ip, "--port", str(port),
            "--deadline", str(deadline), "--iperf3-port", str(iperf3_port)]


def client_args(*, peer: str, port: int, latency: bool, modes: Sequence[str],
                streams: Sequence[int], seconds: float, omit: float,
                iperf3_port: int = 0, latency_seconds: float = 0.0) -> list[str]:
    """Measure to the server at ``peer:port``: latency (when asked; with
    ``latency_seconds``, time-boxed to about that long), then each mode at each stream
    count; ``iperf3_port``: bandwidth through ``iperf3 -c`` to that port instead."""
    box = ["--latency-seconds", str(latency_seconds)] if latency and latency_seconds else []
    return [BENCH_CLIENT, "--peer", peer, "--port", str(port),
            *(["--latency"] if latency else []), *box,
            "--modes", *modes, "--streams", *map(str, streams),
            "--seconds", str(seconds), "--omit", str(omit),
            "--iperf3-port", str(iperf3_port)]


def stop_args(run_dir: str) -> list[str]:
    return [BENCH_STOP, "--run-dir", run_dir]


def add_parsers(sub: Any) -> None:
    """The bench commands on :func:`mlxops.node.protocol.parser`'s subparsers."""
    serve = sub.add_parser(BENCH_SERVE)
    serve.add_argument("--run-dir", required=True)
    serve.add_argument("--ip", required=True)
    serve.add_argument("--port", type=int, required=True)
    serve.add_argument("--deadline", type=float, required=True,
                       help="exit by itself after this many seconds")
    serve.add_argument("--iperf3-port", type=int, default=0)
    client = sub.add_parser(BENCH_CLIENT)
    client.add_argument("--peer", required=True)
    client.add_argument("--port", type=int, required=True)
    client.add_argument("--latency", action="store_true")
    client.add_argument("--latency-seconds", type=float, default=0.0,
                        help="stop the round trips after about this long (0: all of them)")
    client.add_argument("--modes", nargs="*", choices=MODES, default=[])
    client.add_argument("--streams", type=int, nargs="*", default=[1])
    client.add_argument("--seconds", type=float, default=5.0)
    client.add_argument("--omit", type=float, default=1.0)
    client.add_argument("--iperf3-port", type=int, default=0)
    stop = sub.add_parser(BENCH_STOP)
    stop.add_argument("--run-dir", required=True)


# --- answers -------------------------------------------------------------------------------


@dataclass
class ServeAnswer(Record):
    pid: int                             # the server (a process group leader)
    port: int
    iperf3: str | None = None            # iperf3's path when the node has it
    iperf3_port: int | None = None       # where `iperf3 -s` listens, when started


@dataclass
class LatencyAnswer(Record):
    """Round-trip times in microseconds: nearest-rank percentiles of ``count`` samples."""

    count: int
    min: float
    p50: float
    p90: float
    p99: float
    max: float


@dataclass
class RunAnswer(Record):
    """One bandwidth run. Gbit/s are decimal (1e9 bit/s), each counted by its receiver
    over the receiver's own window (the first ``omit`` seconds left out)."""

    mode: str                            # UP, DOWN or BOTH
    streams: int
    tool: str                            # MLXOPS_TOOL or IPERF3_TOOL
    up_gbps: float | None = None         # client -> peer (UP, BOTH)
    down_gbps: float | None = None       # peer -> client (DOWN, BOTH)
    seconds: float = 0.0                 # the measured window


@dataclass
class ClientAnswer(Record):
    latency: LatencyAnswer | None
    runs: list[RunAnswer] = field(default_factory=list)



@dataclass
class StopServerAnswer(Record):
    pid: int | None                      # from the pid file, None when there was none
    was_running: bool
    alive: bool                          # still alive after SIGTERM and SIGKILL: failed


ANSWERS: dict[str, type[Record]] = {
    BENCH_SERVE: ServeAnswer, BENCH_CLIENT: ClientAnswer, BENCH_STOP: StopServerAnswer,
}

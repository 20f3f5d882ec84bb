"""The bench's node side on this machine's loopback: the server and the client speak
their wire, ``bench-serve`` starts detached and ``bench-stop`` ends it, the arguments and
answers survive the protocol, and iperf3's JSON is read the way iperf3 means it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from bench_server import free_port, server  # noqa: F401 - the fixture

from mlxops.node import protocol
from mlxops.node.netclient import bandwidth_run, iperf3_argv, iperf3_result, measure_latency
from mlxops.node.netwire import nearest_rank
from mlxops.node.procs import group_alive
from mlxops.node.protocol import bench as benchproto
from mlxops.node.protocol.bench import BOTH, DOWN, UP

ROOT = Path(__file__).resolve().parents[3]


def test_latency_is_2000_round_trips_with_ordered_percentiles(server):  # noqa: F811
    lat = measure_latency("127.0.0.1", server)
    assert lat.count == benchproto.LATENCY_ROUNDS == 2000
    assert 0 < lat.min <= lat.p50 <= lat.p90 <= lat.p99 <= lat.max


@pytest.mark.parametrize("mode", [UP, DOWN, BOTH])
def test_bandwidth_is_counted_by_the_receiver_over_its_window(server, mode):  # noqa: F811
    began = time.monotonic()
    run = bandwidth_run("127.0.0.1", server, mode, 2, seconds=0.3, omit=0.1)
    elapsed = time.monotonic() - began
    assert run.mode == mode and run.streams == 2 and run.tool == "mlxops"
    assert (run.up_gbps is not None) == (mode in (UP, BOTH))
    assert (run.down_gbps is not None) == (mode in (DOWN, BOTH))
    for gbps in (run.up_gbps, run.down_gbps):
        assert gbps is None or gbps > 0.01  # loopback carries far more than 10 Mbit/s
    # The window, not the whole run: the receiver's clock reads its start at least `omit`
    # after the run began and its end before its answer came back. How long it is on a
    # busy machine depends on when the receiver's thread wakes (0.18 s of 0.3 in a CI run).
    assert 0 < run.seconds <= elapsed - 0.1, (run.seconds, elapsed)


def test_the_server_refuses_a_bad_test_and_a_stray_stream(server):  # noqa: F811
    from mlxops.node.netwire import WireError, connect, expect, send_line

    sock = connect("127.0.0.1", server)
    send_line(sock, {"op": "test", "id": "x", "mode": "sideways", "streams": 1,
                     "seconds": 1, "omit": 0})
    with pytest.raises(WireError, match="bad test"):
        expect(sock, "ok", 5)
    sock.close()
    sock = connect("127.0.0.1", server)
    send_line(sock, {"op": "data", "id": "nobody", "dir": UP})
    with pytest.raises(WireError, match="no test"):
        expect(sock, "ok", 5)
    sock.close()


def test_nearest_rank_percentiles():
    values = sorted(float(v) for v in range(1, 101))  # 1..100
    assert nearest_rank(values, 50) == 50
    assert nearest_rank(values, 99) == 99
    assert nearest_rank(values, 100) == 100
    assert nearest_rank([5.0], 99) == 5.0
    assert nearest_rank([1.0, 2.0, 3.0], 50) == 2.0  # ceil(1.5) = 2nd


def node(*args: str, timeout: float = 30) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mlxops.node", *args], capture_output=True,
                          text=True, timeout=timeout, cwd=ROOT, stdin=subprocess.DEVNULL,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})


def test_serve_detaches_answers_and_stop_ends_it(tmp_path):
    port = free_port()
    run_dir = str(tmp_path / "runs" / benchproto.BENCH_JOB)
    started = node(*benchproto.serve_args(run_dir, ip="127.0.0.1", port=port, deadline=60))
    assert started.returncode == 0, started.stderr
    answer = protocol.parse_answer(benchproto.BENCH_SERVE, started.stdout.strip())
    assert answer.port == port and group_alive(answer.pid)
    try:
        assert (Path(run_dir) / benchproto.SERVER_PID).read_text().strip() == str(answer.pid)
        client = node(*benchproto.client_args(peer="127.0.0.1", port=port, latency=True,
                                              modes=[UP], streams=[1], seconds=0.2,
                                              omit=0.0))
        assert client.returncode == 0, client.stderr
        got = protocol.parse_answer(benchproto.BENCH_CLIENT, client.stdout.strip())
        assert got.latency.count == 2000 and got.runs[0].up_gbps > 0
        busy = node(*benchproto.serve_args(str(tmp_path / "other"), ip="127.0.0.1", port=port,
                                           deadline=60))
        assert busy.returncode != 0 and f"port {port}" in busy.stderr.strip().splitlines()[-1]
    finally:
        stopped = node(*benchproto.stop_args(run_dir))
    answer2 = protocol.parse_answer(benchproto.BENCH_STOP, stopped.stdout.strip())
    assert answer2.was_running and not answer2.alive and not group_alive(answer.pid)
    assert not (Path(run_dir) / benchproto.SERVER_PID).exists()
    again = protocol.parse_answer(benchproto.BENCH_STOP, node(*benchproto.stop_args(
        run_dir)).stdout.strip())
    assert again == benchproto.StopServerAnswer(pid=None, was_running=False, alive=False)


def test_a_server_exits_by_itself_at_its_deadline(tmp_path):
    run_dir = str(tmp_path / "bench")
    started = node(*benchproto.serve_args(run_dir, ip="127.0.0.1", port=free_port(),
                                          deadline=1))
    pid = protocol.parse_answer(benchproto.BENCH_SERVE, started.stdout.strip()).pid
    deadline = time.monotonic() + 10
    while group_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not group_alive(pid)
    assert not (Path(run_dir) / benchproto.SERVER_PID).exists()


@pytest.mark.parametrize("argv,want", [
    (benchproto.serve_args("/r/runs/mlxops-bench", ip="10.0.0.2", port=23290, deadline=600,
                           iperf3_port=23291),
     {"cmd": "bench-serve", "ip": "10.0.0.2", "port": 23290, "deadline": 600.0,
      "iperf3_port": 23291}),
    (benchproto.client_args(peer="10.0.0.3", port=23290, latency=True, modes=[UP, DOWN],
                            streams=[1, 4], seconds=2.5, omit=1.0),
     {"cmd": "bench-client", "peer": "10.0.0.3", "latency": True, "modes": [UP, DOWN],
      "streams": [1, 4], "seconds": 2.5, "omit": 1.0, "iperf3_port": 0}),
    (benchproto.client_args(peer="10.0.0.3", port=1, latency=False, modes=[BOTH], streams=[4],
                            seconds=1, omit=0, iperf3_port=2),
     {"latency": False, "modes": [BOTH], "iperf3_port": 2}),
    (benchproto.stop_args("/r/runs/mlxops-bench"),
     {"cmd": "bench-stop", "run_dir": "/r/runs/mlxops-bench"}),
])
def test_the_node_parses_the_bench_commands_the_controller_builds(argv, want):
    args = vars(protocol.parser().parse_args(argv))
    assert {k: args[k] for k in want} == want


@pytest.mark.parametrize("command,answer", [
    (benchproto.BENCH_SERVE, benchproto.ServeAnswer(pid=7, port=23290, iperf3="/usr/bin/iperf3",
                                                    iperf3_port=23291)),
    (benchproto.BENCH_CLIENT, benchproto.ClientAnswer(
        latency=benchproto.LatencyAnswer(count=2000, min=20.0, p50=25.0, p90=30.0, p99=90.0,
                                         max=400.0),
        runs=[benchproto.RunAnswer(mode=BOTH, streams=4, tool="iperf3", up_gbps=0.19,
                                   down_gbps=0.18, seconds=2.0)])),
    (benchproto.BENCH_CLIENT, benchproto.ClientAnswer(latency=None, runs=[])),
    (benchproto.BENCH_STOP, benchproto.StopServerAnswer(pid=7, was_running=True, alive=False)),
])
def test_bench_answers_survive_the_wire(command, answer):
    assert protocol.parse_answer(command, protocol.answer_line(answer)) == answer


def test_iperf3_is_read_as_the_receiver_counted():
    def end(**sums):
        return {"end": {k: {"bits_per_second": v * 1e9, "seconds": 2.0}
                        for k, v in sums.items()}}

    up = iperf3_result(UP, 4, end(sum_sent=0.21, sum_received=0.2))
    assert (up.up_gbps, up.down_gbps, up.tool) == (0.2, None, "iperf3")
    down = iperf3_result(DOWN, 1, end(sum_sent=0.3, sum_received=0.19))
    assert (down.up_gbps, down.down_gbps) == (None, 0.19)
    both = iperf3_result(BOTH, 4, end(sum_received=0.18, sum_received_bidir_reverse=0.17,
                                      sum_sent=1.0, sum_sent_bidir_reverse=1.0))
    assert (both.up_gbps, both.down_gbps) == (0.18, 0.17)
    argv = iperf3_argv("/usr/bin/iperf3", "10.0.0.3", 23291, DOWN, 4, 2.4, 1.0)
    assert argv == ["/usr/bin/iperf3", "-c", "10.0.0.3", "-p", "23291", "-J", "-t", "2",
                    "-O", "1", "-P", "4", "-R"]
    assert iperf3_argv("i", "h", 1, BOTH, 1, 0.3, 0)[-1] == "--bidir"
    assert json.loads(protocol.answer_line(both))["tool"] == "iperf3"


def test_the_synced_node_modules_import_only_the_standard_library():
    """Macs run them with whatever Python has mlx: nothing else may be assumed there. The
    rank programs (the all-reduce bench and the collectives check) and their shared start
    (rankrun.py) import mlx at the top: they run only as ranks, where mlx is there by
    definition. Pre-flight and memory.py
    import it inside a function, for its version and its GPU working set."""
    import ast

    rank_programs = ("allreduce.py", "collectives.py", "rankrun.py")
    for path in sorted((ROOT / "mlxops" / "node").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) and
                     not node.level else [])
            for name in names:
                top = name.split(".")[0]
                ok = top in sys.stdlib_module_names or name.startswith("mlxops.node") \
                    or name == "__future__"
                assert ok or (path.name in ("preflight.py", "memory.py", *rank_programs)
                          and top == "mlx"), (
                path.name, name)


def test_the_sweep_s_gather_checks_the_blocks_order_and_counts_the_bytes_gathered():
    import mlx.core as mx

    from mlxops.node.allreduce import AllGather, AllSum

    # three ranks' blocks: in rank order right, two swapped wrong (values alone would pass)
    assert AllGather().wrong(mx.array([1.0, 1, 2, 2, 3, 3]), 3) == 0
    assert AllGather().wrong(mx.array([2.0, 2, 1, 1, 3, 3]), 3) == 4
    assert AllGather().nbytes(AllGather().operand(4096, 0, 3), 3) == 4104  # ceil(4096/12)
    assert AllSum().wrong(mx.array([6.0, 6, 7]), 3) == 1

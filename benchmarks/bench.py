"""Benchmark: ``mlxops bench``'s full matrix on 8 nodes, and its figures beside iperf3's.

On its own sandbox (N fake nodes with shaped links; needs root and iperf3):

1. wall time of the full matrix: ``mlxops bench INVENTORY --sizes none`` over every pair
   (latency, both directions at each stream count), the loopback runs, the ring search and
   the ring's links both ways; timed from the CLI's start to its exit (target <= 30 s for
   8 nodes here), with the phases from its ``seconds``;
2. the same matrix with ``--iperf3``: each pair's figure measured by ``iperf3 -c -J``
   against ``iperf3 -s`` on the same nodes, and the ratio mlxops / iperf3 per directed pair
   (iperf3 takes whole seconds: its runs last ``max(1, round(seconds))`` s).

3. with ``--defaults RATE,..``, instead: ``mlxops bench INVENTORY`` at its defaults (the
   30 s time budget, the all-reduce included), timed from the CLI's start to its exit,
   with every link shaped to each rate in turn; then, at the same rate, iperf3 on every
   pair (``--iperf3 --streams 4 --seconds 1 --omit 1 --sizes none``) and the ratio of the
   defaults' figure to iperf3's per directed pair (target: within 10%).

One untimed run first syncs the node helpers to every node (as a first ``mlxops bench``
would), so that the timed run is what a user sees from the second bench on.

    sudo .venv/bin/python benchmarks/bench.py [--nodes 8] [--rate 1gbit] [--seconds 0.5]
                                              [--omit 0.25] [--streams 4]
                                              [--defaults 200mbit,1gbit]

The sandbox is taken down at the end, also on Ctrl-C.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from mlxops.sandbox import Sandbox, netns, prerequisites


def free_subnet(pid: int) -> str:
    return netns.free_subnet(range(240, 250), pid)


def bench(box: Sandbox, env: dict, *args: str) -> tuple[float, dict]:
    """``mlxops bench --json ARGS`` on the sandbox: (wall seconds, document)."""
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "mlxops", "bench", str(box.inventory_path),
                           "--json", *args], capture_output=True, text=True, env=env,
                          timeout=900, stdin=subprocess.DEVNULL)
    wall = time.monotonic() - start
    if proc.returncode != 0:
        sys.exit(f"mlxops bench {' '.join(args)}: exit {proc.returncode}\n{proc.stderr[-2000:]}")
    return wall, json.loads(proc.stdout)


def table(rows: list[list[str]], headers: list[str]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    line = lambda cells: "  ".join(c.rjust(w) if i else c.ljust(w)  # noqa: E731
                                   for i, (c, w) in enumerate(zip(cells, widths, strict=True)))
    return "\n".join([line(headers), "-" * len(line(headers)), *map(line, rows)])


def run(opts: argparse.Namespace, box: Sandbox, env: dict) -> None:
    common = ["--streams", opts.streams, "--seconds", str(opts.seconds), "--omit",
              str(opts.omit), "--sizes", "none"]
    print("warm-up (syncs the node helpers) ...", file=sys.stderr)
    bench(box, env, "--pairs", "ring", "--streams", "1", "--seconds", "0.2", "--omit", "0",
          "--sizes", "none")
    print("full matrix, mlxops' own streams ...", file=sys.stderr)
    wall, ours = bench(box, env, *common)
    print("full matrix, --iperf3 ...", file=sys.stderr)
    wall3, theirs = bench(box, env, *common, "--iperf3")

    n = len(ours["hosts"])
    print(f"\n{n} nodes, links shaped to {opts.rate}, --streams {opts.streams} --seconds "
          f"{opts.seconds} --omit {opts.omit}:")
    phases = ", ".join(f"{k} {v:.1f}" for k, v in ours["seconds"].items() if k != "total")
    print(f"  full matrix ({len(ours['pairs'])} directed pairs): {wall:.1f} s wall "
          f"(target <= 30 s; phases: {phases})")
    print(f"  the same with --iperf3: {wall3:.1f} s wall\n")

    key = max(opts.streams.split(","), key=int)
    rows, ratios = [], []
    for p in ours["pairs"]:
        q = next(x for x in theirs["pairs"] if (x["src"], x["dst"]) == (p["src"], p["dst"]))
        mine, ref = p["streams"].get(key), q["streams"].get(key)
        ratio = mine / ref if mine and ref else None
        if ratio:
            ratios.append(ratio)
        rows.append([f"{p['src']} -> {p['dst']}", f"{mine:.3f}", f"{ref:.3f}",
                     f"{ratio:.3f}" if ratio else "-", f"{p['latency_us']['median']:.0f}"])
    print(table(rows, ["pair", "mlxops Gbit/s", "iperf3 Gbit/s", "ratio", "rtt p50 us"]))
    print(f"\nratio mlxops / iperf3 over {len(ratios)} pairs ({key} streams): median "
          f"{statistics.median(ratios):.3f}, min {min(ratios):.3f}, max {max(ratios):.3f}")
    ring = ours["ring"]
    print(f"ring: {' -> '.join(ring['order'])}, slowest link {ring['bottleneck_gbps']:.3f} "
          f"Gbit/s ({'exact' if ring['exact'] else 'heuristic'})")


def ratios(ours: dict, theirs: dict, key: str = "4") -> list[float]:
    """mlxops' Gbit/s over iperf3's, per directed pair both measured."""
    found = []
    for p in ours["pairs"]:
        q = next(x for x in theirs["pairs"] if (x["src"], x["dst"]) == (p["src"], p["dst"]))
        mine, ref = p["streams"].get(key), q["streams"].get(key)
        if mine and ref:
            found.append(mine / ref)
    return found


def run_defaults(opts: argparse.Namespace, box: Sandbox, env: dict) -> None:
    print("warm-up (syncs the node helpers) ...", file=sys.stderr)
    bench(box, env, "--pairs", "ring", "--streams", "1", "--seconds", "0.2", "--omit", "0",
          "--sizes", "none")
    print(f"\n{len(box.nodes)} nodes, `mlxops bench` at its defaults (30 s budget):\n")
    print("| links | wall | phases (s) | all-reduce up to | pairs / iperf3 (median, min-max) "
          "| runs |")
    print("|---|---|---|---|---|---|")
    for rate in opts.defaults.split(","):
        for node in box.nodes:
            box.set_rate(node, rate)
        print(f"at {rate}: defaults ...", file=sys.stderr)
        wall, ours = bench(box, env)
        print(f"at {rate}: iperf3 ...", file=sys.stderr)
        _, theirs = bench(box, env, "--iperf3", "--streams", "4", "--seconds", "1", "--omit",
                          "1", "--sizes", "none")
        found = ratios(ours, theirs)
        phases = ", ".join(f"{k} {v:.1f}" for k, v in ours["seconds"].items() if k != "total")
        rows = ours["allreduce"]
        largest = rows[-1]["bytes"] >> 20 if rows else 0
        o = ours["options"]
        print(f"| {rate} | {wall:.1f} s | {phases} | {largest} MiB ({len(rows)} sizes) | "
              f"{statistics.median(found):.3f} ({min(found):.3f}-{max(found):.3f}), "
              f"{len(found)} pairs | {o['streams']} streams, {o['seconds']} s + {o['omit']} s "
              "|")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nodes", type=int, default=8)
    p.add_argument("--rate", default="1gbit", help="every node's link (tc tbf)")
    p.add_argument("--streams", default="4")
    p.add_argument("--seconds", type=float, default=0.5)
    p.add_argument("--omit", type=float, default=0.25)
    p.add_argument("--subnet", default=None)
    p.add_argument("--defaults", default="", metavar="RATE,..",
                   help="time `mlxops bench` at its defaults at each link rate, beside iperf3")
    opts = p.parse_args()
    why = prerequisites()
    if why:
        sys.exit(f"benchmarks/bench.py: the sandbox {why}")
    work = Path(tempfile.mkdtemp(prefix="mlxops-bench-bench-", dir="/var/tmp"))
    work.chmod(0o755)  # the node user reads its home under it
    pid = os.getpid()
    box = Sandbox(work / "sandbox", prefix=f"mxbb{pid % 100000}",
                  subnet=opts.subnet or free_subnet(pid))
    env = {**os.environ, "MLXOPS_HOME": str(work / "controller")}
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        print(f"starting {opts.nodes} sandbox nodes ...", file=sys.stderr)
        box.up(opts.nodes, rate=opts.rate)
        (run_defaults if opts.defaults else run)(opts, box, env)
    finally:
        box.down()
        subprocess.run(["rm", "-rf", str(work)], check=False)


if __name__ == "__main__":
    main()

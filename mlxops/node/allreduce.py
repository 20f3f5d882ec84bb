"""``python -m mlxops.node.allreduce --sizes BYTES...``: one rank of ``mlxops bench``'s
all-reduce sweep, started the way jobs start ranks (an internal job, docs/cli.md,
``mlxops bench``).

Imports mlx (and the standard library): unlike the rest of ``mlxops/node`` it runs only as
a rank. For each size, float32 filled with ``rank + 1``: warm-ups, then as many timed
``mx.distributed.all_sum`` calls as fill about ``--target`` seconds (every rank runs the
same count: the slowest rank's warm-up decides, agreed with ``all_max``), each one waited
for (``mx.eval``). A rank's time is its own average per call; the controller takes the
maximum over ranks, as nccl-tests does. Correctness: every element of the sum must be
n(n+1)/2; ``wrong`` counts those that are not. Writes ``allreduce-rank-<r>.json`` in the
run directory, and a heartbeat (``progress/rank-<r>.json``) after each warm-up and size and
every 5 s of timed calls, so that the job's status sees it alive. With ``--budget``, the
sweep stops growing once the next size would take longer than its share (:func:`sweep`).
"""

from __future__ import annotations

import argparse
import math
import sys
import time

import mlx.core as mx

from mlxops.node import protocol
from mlxops.node.protocol.bench import allreduce_result
from mlxops.node.rankrun import join, write_json

SECOND_WARMUP_BELOW = 1.0   # seconds: a size whose first call took less gets a second one
BEAT_EVERY = 5.0            # seconds between heartbeats during a size's timed calls


def _agree_max(value: float, group: mx.distributed.Group) -> float:
    """The largest ``value`` over all ranks (the same on every rank)."""
    if group.size() == 1:
        return value
    out = mx.distributed.all_max(mx.array([value], dtype=mx.float32), group=group,
                                 stream=mx.cpu)
    return float(out.item())


def _call(x: mx.array, group: mx.distributed.Group) -> tuple[mx.array, float]:
    start = time.perf_counter()
    y = mx.distributed.all_sum(x, group=group)
    mx.eval(y)
    return y, time.perf_counter() - start


def sweep(sizes: list[int], group: mx.distributed.Group, *, target: float, min_iters: int,
          max_iters: int, beat, budget: float = 0.0) -> list[dict]:
    """Each size in turn, ascending; with ``budget`` (seconds), the sweep stops growing
    once the next size's least work would not fit its share, ``budget / len(sizes)``: a
    warm-up and ``min_iters`` timed calls, each taking up to twice this size's (a size
    twice as large, where bandwidth decides). The timed calls of a size fill about
    ``target`` seconds, so small sizes take about that whatever the link; a slow link
    stops the growth early. Every rank takes the same decision (the slowest rank's time
    per call, agreed with ``all_max``)."""
    rank, n = group.rank(), group.size()
    expected = n * (n + 1) / 2
    share = budget / len(sizes) if budget > 0 and sizes else 0.0
    rows = []
    for i, size in enumerate(sizes):
        x = mx.full((size // 4,), float(rank + 1), dtype=mx.float32)
        mx.eval(x)
        _, first = _call(x, group)
        beat(i)
        slowest = _agree_max(first, group)
        if slowest < SECOND_WARMUP_BELOW:
            _, again = _call(x, group)
            slowest = _agree_max(again, group)
            beat(i)
        iters = max(min_iters, min(max_iters, math.ceil(target / max(slowest, 1e-6))))
        _agree_max(0.0, group)  # a barrier: every rank starts the timed calls together
        start = last = time.perf_counter()
        for _ in range(iters):
            y, _ = _call(x, group)
            if time.perf_counter() - last > BEAT_EVERY:  # slow links, big sizes
                beat(i)
                last = time.perf_counter()
        elapsed = time.perf_counter() - start
        wrong = int((y != expected).astype(mx.int32).sum().item())
        rows.append({"bytes": size, "iterations": iters, "time_us": elapsed / iters * 1e6,
                     "wrong": wrong})
        del x, y
        beat(i + 1)
        if share and (1 + min_iters) * 2 * _agree_max(elapsed / iters, group) > share:
            break  # the largest size reached is the last row
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m mlxops.node.allreduce")
    p.add_argument("--sizes", type=int, nargs="+", required=True, help="bytes, multiples of 4")
    p.add_argument("--target", type=float, default=0.3,
                   help="seconds of timed calls per size (about)")
    p.add_argument("--min-iters", type=int, default=3)
    p.add_argument("--max-iters", type=int, default=200)
    p.add_argument("--budget", type=float, default=0.0,
                   help="seconds for the whole sweep: stop growing once the next size would "
                        "take longer than its share (0: every size)")
    args = p.parse_args(argv)
    ranks = join()
    group, rank, beat = ranks.group, ranks.rank, ranks.beat
    beat(0)
    sizes = sorted(args.sizes)
    target = args.target
    if args.budget > 0:  # timed calls take a third of a size's share at most
        target = min(target, args.budget / len(sizes) / 3)
    rows = sweep(sizes, group, target=target, min_iters=args.min_iters,
                 max_iters=args.max_iters, beat=beat, budget=args.budget)
    write_json(ranks.run_dir / allreduce_result(rank), {
        "rank": rank, "world_size": ranks.world, "backend": ranks.backend, "results": rows})
    beat(len(rows), protocol.FINISHED)
    print(f"rank {rank}: {len(rows)} sizes, {sum(r['wrong'] for r in rows)} wrong", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

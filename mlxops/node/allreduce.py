"""``python -m mlxops.node.allreduce --sizes BYTES...``: one rank of ``mlxops bench``'s
collective sweep (``all_sum``, then ``all_gather``, at each size), started the way jobs
start ranks (an internal job, docs/cli.md, ``mlxops bench``).

Imports mlx (and the standard library): unlike the rest of ``mlxops/node`` it runs only as
a rank. For each size and collective, float32 filled with ``rank + 1``: warm-ups, then as
many timed calls as fill about half of ``--target`` seconds (every rank runs the same
count: the slowest rank's warm-up decides, agreed with ``all_max``), each one waited for
(``mx.eval``). A rank's time is its own average per call; the controller takes the maximum
over ranks, as nccl-tests does.

- ``all_sum`` of ``size`` bytes: every element of the sum must be n(n+1)/2.
- ``all_gather`` of ``size`` bytes gathered (ZeRO-1's gather of the weights: what
  ``mlxops plan`` predicts): each rank gives ``ceil(size / 4n)`` floats, so the row's
  bytes are that times ``4n`` (``size`` where ``4n`` divides it). Rank ``r``'s block of
  the result must be ``r + 1`` (order checked).

``wrong`` counts the elements that are not. Writes ``allreduce-rank-<r>.json`` in the run
directory (``results``: the all_sum rows; ``all_gather``: the gather's), and a heartbeat
(``progress/rank-<r>.json``) after each warm-up and size and every 5 s of timed calls, so
that the job's status sees it alive. With ``--budget``, the sweep stops growing once the
next size would take longer than its share (:func:`sweep`).
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


class AllSum:
    """``size`` bytes summed: every element must be n(n+1)/2."""

    def operand(self, size: int, rank: int, n: int) -> mx.array:
        return mx.full((size // 4,), float(rank + 1), dtype=mx.float32)

    def call(self, x: mx.array, group: mx.distributed.Group) -> mx.array:
        return mx.distributed.all_sum(x, group=group)

    def nbytes(self, x: mx.array, n: int) -> int:
        return x.nbytes

    def wrong(self, y: mx.array, n: int) -> int:
        return int((y != n * (n + 1) / 2).astype(mx.int32).sum().item())


class AllGather:
    """``size`` bytes gathered: ``ceil(size / 4n)`` floats from each rank, rank ``r``'s
    block of the result all ``r + 1`` (the order checked, not only the values)."""

    def operand(self, size: int, rank: int, n: int) -> mx.array:
        return mx.full((-(-size // (4 * n)),), float(rank + 1), dtype=mx.float32)

    def call(self, x: mx.array, group: mx.distributed.Group) -> mx.array:
        return mx.distributed.all_gather(x, group=group)

    def nbytes(self, x: mx.array, n: int) -> int:
        return x.nbytes * n   # the gathered result, as the plan counts the weights

    def wrong(self, y: mx.array, n: int) -> int:
        want = mx.arange(1, n + 1, dtype=mx.float32)[:, None]
        return int((y.reshape(n, -1) != want).astype(mx.int32).sum().item())


#: The collectives of a size, in order: each gets half the size's ``target``.
COLLECTIVES = {"results": AllSum(), "all_gather": AllGather()}


def _call(op, x: mx.array, group: mx.distributed.Group) -> tuple[mx.array, float]:
    start = time.perf_counter()
    y = op.call(x, group)
    mx.eval(y)
    return y, time.perf_counter() - start


def _measure(op, size: int, group: mx.distributed.Group, *, target: float, min_iters: int,
             max_iters: int, beat) -> tuple[dict, float]:
    """One collective at one size: its row and the slowest rank's seconds per call."""
    rank, n = group.rank(), group.size()
    x = op.operand(size, rank, n)
    mx.eval(x)
    _, first = _call(op, x, group)
    beat()
    slowest = _agree_max(first, group)
    if slowest < SECOND_WARMUP_BELOW:
        _, again = _call(op, x, group)
        slowest = _agree_max(again, group)
        beat()
    iters = max(min_iters, min(max_iters, math.ceil(target / max(slowest, 1e-6))))
    _agree_max(0.0, group)  # a barrier: every rank starts the timed calls together
    start = last = time.perf_counter()
    for _ in range(iters):
        y, _ = _call(op, x, group)
        if time.perf_counter() - last > BEAT_EVERY:  # slow links, big sizes
            beat()
            last = time.perf_counter()
    elapsed = time.perf_counter() - start
    row = {"bytes": op.nbytes(x, n),
           "iterations": iters, "time_us": elapsed / iters * 1e6, "wrong": op.wrong(y, n)}
    return row, _agree_max(elapsed / iters, group)


def sweep(sizes: list[int], group: mx.distributed.Group, *, target: float, min_iters: int,
          max_iters: int, beat, budget: float = 0.0) -> dict[str, list[dict]]:
    """Each size in turn, ascending, each collective of :data:`COLLECTIVES` at it; its
    rows by collective. With ``budget`` (seconds), the sweep stops growing once the next
    size's least work would not fit its share, ``budget / len(sizes)``: per collective, a
    warm-up and ``min_iters`` timed calls, each taking up to twice this size's (a size
    twice as large, where bandwidth decides). The timed calls of a size fill about
    ``target`` seconds, so small sizes take about that whatever the link; a slow link
    stops the growth early. Every rank takes the same decision (the slowest rank's time
    per call, agreed with ``all_max``)."""
    share = budget / len(sizes) if budget > 0 and sizes else 0.0
    rows: dict[str, list[dict]] = {name: [] for name in COLLECTIVES}
    for i, size in enumerate(sizes):
        per_call = 0.0
        for name, op in COLLECTIVES.items():
            row, slowest = _measure(op, size, group, target=target / len(COLLECTIVES),
                                    min_iters=min_iters, max_iters=max_iters,
                                    beat=lambda i=i: beat(i))
            rows[name].append(row)
            per_call += slowest
        beat(i + 1)
        if share and (1 + min_iters) * 2 * per_call > share:
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
        "rank": rank, "world_size": ranks.world, "backend": ranks.backend, **rows})
    done = rows["results"]
    beat(len(done), protocol.FINISHED)
    wrong = sum(r["wrong"] for got in rows.values() for r in got)
    print(f"rank {rank}: {len(done)} sizes, {wrong} wrong", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

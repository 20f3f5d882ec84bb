"""``python -m mlxops.node.collectives --ops all_sum all_gather send_recv``: one rank of
the collectives check, run as an internal job (``mlxops-collectives``) on a job's hosts
and backend before the job trusts those collectives with its data
(:mod:`mlxops.jobs.collectives`; docs/node-protocol.md, "Collectives check").

Imports mlx (and the standard library): like :mod:`mlxops.node.allreduce` it runs only
as a rank. Every value a rank sends names it, and its place: ``rank * K + i % K`` (K = 64
in float32, 8 in bfloat16, exact in either), so a wrong answer says whose data came back
where. Each check is run at an odd small size and at one large enough for the backend to
cut it into several messages (the sizes where ring implementations go wrong):

- ``all_sum`` (float32): element i must be ``n (n + 1) / 2 * (1 + i % 7)`` (each rank
  sends ``(rank + 1) (1 + i % 7)``);
- ``all_gather`` (float32 and bfloat16, the dtypes ZeRO-1 gathers): row k must be rank
  k's, in rank order;
- ``send_recv`` (float32): each rank sends to its right neighbour on the ring and receives
  from its left one (even ranks send first, odd ranks receive first, so that no pair
  waits on each other), and must get the left neighbour's values.

Each collective is evaluated on its own, in the same order on every rank. A wrong answer
is not an error of the program: each rank writes a
:class:`~mlxops.node.protocol.collectives.CollectivesAnswer` (what it checked, one line
per wrong answer) to ``collectives-rank-<r>.json`` in the run directory and exits 0; the
controller refuses. A heartbeat after each check keeps a slow rank (its CPU kernels compiled
on first use, on a loaded machine) from looking stalled; a collective that hangs is the
job's stall timeout's to catch.

Test hook: :data:`~mlxops.node.protocol.collectives.FAULT_ENV` corrupts a collective's
answer on one rank (a broken backend, for the tests that show a wrong answer refused).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable

import mlx.core as mx

from mlxops.node import protocol
from mlxops.node.protocol.collectives import (
    ALL_GATHER,
    ALL_SUM,
    COLLECTIVES,
    FAULT_ENV,
    SEND_RECV,
    CollectivesAnswer,
    collectives_result,
)
from mlxops.node.rankrun import join, write_json

#: Elements per rank: an odd few, and enough for several messages (1 MiB of float32).
SIZES = (1031, 262147)
#: Positions a value codes, per dtype: ``rank * K + i % K`` is exact in it for these worlds.
CODE = {mx.float32: 64, mx.bfloat16: 8}


def faults(env: dict[str, str] | None = None) -> set[tuple[str, int]]:
    """The test hook's ``(collective, rank)`` pairs."""
    text = (os.environ if env is None else env).get(FAULT_ENV, "")
    out = set()
    for item in filter(None, (s.strip() for s in text.split(","))):
        op, _, rank = item.partition(":")
        out.add((op, int(rank)))
    return out


def coded(rank: int, size: int, dtype: mx.Dtype) -> mx.array:
    k = CODE[dtype]
    return (rank * k + mx.arange(size) % k).astype(dtype)


def _first_wrong(got: mx.array, want: mx.array) -> tuple[int, int, float, float]:
    """(how many wrong, first wrong index, its value, the value wanted)."""
    bad = got != want
    count = int(bad.sum().item())
    i = int(mx.argmax(bad).item())
    return count, i, float(got[i].item()), float(want[i].item())


def check_all_sum(group: mx.distributed.Group, size: int, broken: bool) -> list[str]:
    n, rank = group.size(), group.rank()
    pattern = 1 + mx.arange(size) % 7
    got = mx.distributed.all_sum((rank + 1) * pattern.astype(mx.float32), group=group)
    if broken:
        got = got + (mx.arange(size) == size // 2)
    mx.eval(got)
    want = (n * (n + 1) // 2 * pattern).astype(mx.float32)
    count, i, value, wanted = _first_wrong(got, want)
    if not count:
        return []
    return [f"all_sum float32 x {size}: {count} of {size} sums wrong on rank {rank} "
            f"(element {i}: {value:g}, want {wanted:g})"]


def check_all_gather(group: mx.distributed.Group, size: int, dtype: mx.Dtype,
                     broken: bool) -> list[str]:
    n, rank = group.size(), group.rank()
    rows = mx.distributed.all_gather(coded(rank, size, dtype), group=group).reshape(n, size)
    if broken and n > 1:  # two ranks' rows in each other's place
        rows = mx.concatenate([rows[1:2], rows[0:1], rows[2:]])
    mx.eval(rows)
    name = "bfloat16" if dtype == mx.bfloat16 else "float32"
    wrong = []
    for k in range(n):
        count, i, value, wanted = _first_wrong(rows[k], coded(k, size, dtype))
        if not count:
            continue
        whose = int(rows[k][0].item()) // CODE[dtype]
        if whose != k and 0 <= whose < n and \
                mx.array_equal(rows[k], coded(whose, size, dtype)).item():
            wrong.append(f"all_gather {name} x {size}: rank {rank} got rank {whose}'s values "
                         f"where rank {k}'s belong (order wrong)")
        else:
            wrong.append(f"all_gather {name} x {size}: rank {rank} got {count} of {size} "
                         f"values of rank {k} wrong (element {i}: {value:g}, want {wanted:g})")
    return wrong


def check_send_recv(group: mx.distributed.Group, size: int, broken: bool) -> list[str]:
    n, rank = group.size(), group.rank()
    right, left = (rank + 1) % n, (rank - 1) % n
    mine = coded(rank, size, mx.float32)
    if broken:
        mine = mine + (mx.arange(size) == size // 2)

    def send() -> None:
        mx.eval(mx.distributed.send(mine, right, group=group))

    def recv() -> mx.array:
        got = mx.distributed.recv_like(mine, left, group=group)
        mx.eval(got)
        return got

    if rank % 2 == 0:
        send()
        got = recv()
    else:
        got = recv()
        send()
    count, i, value, wanted = _first_wrong(got, coded(left, size, mx.float32))
    if not count:
        return []
    return [f"send_recv float32 x {size}: rank {rank} received {count} of {size} values "
            f"from rank {left} wrong (element {i}: {value:g}, want {wanted:g})"]


def run(group: mx.distributed.Group, ops: list[str], backend: str,
        broken: set[tuple[str, int]] = frozenset(),
        beat: Callable[[], None] = lambda: None) -> CollectivesAnswer:
    """Every check of ``ops`` at every size, in the same order on every rank; ``beat``
    after each (a rank's first use of an op compiles its CPU kernel, which on a loaded
    machine takes a while: the heartbeat says it is alive)."""
    rank = group.rank()
    checked, wrong = [], []
    for size in SIZES:
        if ALL_SUM in ops:
            checked.append(f"all_sum float32 x {size}")
            wrong += check_all_sum(group, size, (ALL_SUM, rank) in broken)
            beat()
        if ALL_GATHER in ops:
            for dtype, name in ((mx.float32, "float32"), (mx.bfloat16, "bfloat16")):
                checked.append(f"all_gather {name} x {size}")
                wrong += check_all_gather(group, size, dtype, (ALL_GATHER, rank) in broken)
                beat()
        if SEND_RECV in ops and group.size() > 1:
            checked.append(f"send_recv float32 x {size}")
            wrong += check_send_recv(group, size, (SEND_RECV, rank) in broken)
            beat()
    return CollectivesAnswer(rank=rank, world_size=group.size(), backend=backend,
                             mlx=mx.__version__, checked=checked, wrong=wrong)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m mlxops.node.collectives")
    p.add_argument("--ops", nargs="+", choices=COLLECTIVES, required=True)
    args = p.parse_args(argv)
    ranks = join()
    rank = ranks.rank
    ranks.beat(0)
    answer = run(ranks.group, args.ops, ranks.backend, faults(), lambda: ranks.beat(0))
    write_json(ranks.run_dir / collectives_result(rank), answer.to_dict())
    ranks.beat(0, protocol.FINISHED)
    print(f"rank {rank}: {len(answer.checked)} checked, {len(answer.wrong)} wrong"
          + "".join(f"\n  {line}" for line in answer.wrong), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

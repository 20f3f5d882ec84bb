"""Rank logs, merged: each line prefixed with its host and rank; ``follow`` tails them.

An mpi job's launcher (mpirun, on its first host) has a log too: it comes first, as
``[host mpirun]``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

from mlxops.jobs import nodecmd
from mlxops.jobs.record import JobRecord, inventory_hosts, load_record
from mlxops.jobs.status import gather
from mlxops.node.protocol import FAILED, FINISHED, STOPPED
from mlxops.transport import Connector, HostResult, run_parallel
from mlxops.transport.results import OK

Offsets = dict[int, int]
LAUNCHER = -1  # the launcher's place among the ranks: its log sorts first


def _key(rank: int) -> str:
    return "launcher" if rank == LAUNCHER else str(rank)


def fetch(record: JobRecord, connector: Connector, offsets: Offsets, *, rank: int | None = None,
          tail: int = 0) -> list[tuple[int, str, str]]:
    """New log text per rank since ``offsets`` (updated in place): [(rank, host, text)]."""
    hosts = inventory_hosts(record)
    chunks: list[tuple[int, str, str]] = []
    wanted = [h for h in record.hosts
              if rank is None or any(r.rank == rank for r in record.ranks_on(h.name))]

    def work(host) -> HostResult:
        h = record.host(host.name)
        paths = h.paths(record.name)
        mine = [r.rank for r in record.ranks_on(host.name)]
        if record.backend == "mpi" and record.ranks and record.ranks[0].host == host.name:
            mine.append(LAUNCHER)
        args = ["logs", "--run-dir", paths.run_dir, "--tail", str(tail)]
        if rank is not None:
            args += ["--rank", str(rank)]
        known = [f"{_key(r)}:{offsets[r]}" for r in mine if r in offsets]
        if known:
            args += ["--offsets", *known]
        answer = nodecmd.run_node(connector.connect(host), h.python, paths.code, args)
        for key, item in answer.get("logs", {}).items():
            r = LAUNCHER if key == "launcher" else int(key)
            if r not in mine:
                continue  # a script of an earlier attempt's layout
            offsets[r] = item["offset"]
            if item["text"]:
                chunks.append((r, host.name, item["text"]))
        return HostResult(host.name, OK)

    run_parallel([hosts[h.name] for h in wanted], work)
    return sorted(chunks)


def prefixed(chunks: list[tuple[int, str, str]]) -> Iterator[str]:
    for rank, host, text in chunks:
        for line in text.splitlines():
            yield f"[{host} {'mpirun' if rank == LAUNCHER else f'r{rank}'}] {line}"


def follow(name: str, connector: Connector, emit: Callable[[str], None], *,
           rank: int | None = None, interval: float = 1.0, tail: int = 4096) -> None:
    """Print new lines until the job has ended (Ctrl-C stops following earlier)."""
    offsets: Offsets = {}
    first = True
    while True:
        record = load_record(name)  # a watchdog may have restarted it on other hosts
        ended = gather(record, connector).state in (FINISHED, FAILED, STOPPED)
        for line in prefixed(fetch(record, connector, offsets, rank=rank,
                                   tail=tail if first else 0)):
            emit(line)
        first = False
        if ended:
            return
        time.sleep(interval)

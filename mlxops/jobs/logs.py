"""Rank logs, merged: each line prefixed with its host and rank; ``follow`` tails them.

An mpi job's launcher (mpirun, on its first host) has a log too, keyed
``protocol.LAUNCHER``: it comes first, as ``[host mpirun]``. Each node's answer is a
:class:`mlxops.node.protocol.LogsAnswer` (docs/node-protocol.md).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

from mlxops.jobs.record import JobRecord, inventory_hosts, load_record
from mlxops.jobs.status import JobStatus, job_status
from mlxops.node import protocol
from mlxops.node.protocol import ENDED_STATES, LAUNCHER
from mlxops.transport import Connector, nodecmd, run_parallel

Key = int | str                      # a rank, or LAUNCHER
Offsets = dict[Key, int]
Chunk = tuple[Key, str, str]         # (rank or LAUNCHER, host, text)


def _order(chunk: Chunk) -> tuple[int, int]:
    """The launcher's log first, then the ranks in order."""
    key = chunk[0]
    return (0, 0) if key == LAUNCHER else (1, int(key))


def fetch(record: JobRecord, connector: Connector, offsets: Offsets, *, rank: int | None = None,
          tail: int = 0) -> list[Chunk]:
    """New log text per rank since ``offsets`` (updated in place): [(rank, host, text)]."""
    hosts = inventory_hosts(record)
    wanted = [h for h in record.hosts
              if rank is None or any(r.rank == rank for r in record.ranks_on(h.name))]

    def work(host) -> tuple[list[Chunk], Offsets]:
        h = record.host(host.name)
        paths = h.paths(record.name)
        log_keys: list[Key] = [r.rank for r in record.ranks_on(host.name)]
        if record.backend == protocol.MPI and record.ranks and record.ranks[0].host == host.name:
            log_keys.append(LAUNCHER)
        known = {r: offsets[r] for r in log_keys if r in offsets}
        answer = nodecmd.run_node(connector.connect(host), h.python, paths.code,
                                  protocol.logs_args(paths.run_dir, rank=rank, offsets=known,
                                                     tail=tail))
        chunks: list[Chunk] = []
        moved: Offsets = {}
        for key, chunk in answer.logs.items():
            if key not in log_keys:
                continue  # a script of an earlier attempt's layout
            moved[key] = chunk.offset
            if chunk.text:
                chunks.append((key, host.name, chunk.text))
        return chunks, moved

    results = run_parallel([hosts[h.name] for h in wanted], work)
    found: list[Chunk] = []
    for chunks, moved in results.succeeded_values().values():
        found += chunks
        offsets.update(moved)
    return sorted(found, key=_order)


def prefixed(chunks: list[Chunk]) -> Iterator[str]:
    for rank, host, text in chunks:
        for line in text.splitlines():
            yield f"[{host} {'mpirun' if rank == LAUNCHER else f'r{rank}'}] {line}"


def follow(name: str, connector: Connector, emit: Callable[[str], None], *,
           rank: int | None = None, interval: float = 1.0, tail: int = 4096) -> JobStatus:
    """Print new lines until the job has ended (Ctrl-C stops following earlier); returns
    its status as it ended."""
    offsets: Offsets = {}
    first = True
    while True:
        record = load_record(name)  # a watchdog may have restarted it on other hosts
        status = job_status(record, connector)
        for line in prefixed(fetch(record, connector, offsets, rank=rank,
                                   tail=tail if first else 0)):
            emit(line)
        first = False
        if status.state in ENDED_STATES:
            return status
        time.sleep(interval)

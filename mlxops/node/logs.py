"""New bytes of a job's logs since what the controller already has: the ``logs`` command
(docs/node-protocol.md)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from mlxops.node import protocol
from mlxops.node.rundir import process_path, ranks_in


def read_logs(run_dir: Path, *, rank: int | None, offsets: Mapping[int | str, int],
              tail: int, max_bytes: int) -> protocol.LogsAnswer:
    """Each log from its offset (or, without offsets, ``tail`` bytes before its end), at
    most ``max_bytes`` each. Keyed by rank, plus LAUNCHER (mpirun's own log, on an mpi
    job's first host) when the whole job is asked for."""
    logs: dict[int | str, Path] = {
        r: process_path(run_dir, r, protocol.LOG) for r in ranks_in(run_dir)
        if rank is None or r == rank}
    launcher = process_path(run_dir, protocol.LAUNCHER, protocol.LOG)
    if rank is None and launcher.exists():
        logs[protocol.LAUNCHER] = launcher
    out = {}
    for key, path in logs.items():
        start = int(offsets.get(key, 0))
        data = b""
        if path.exists():
            with open(path, "rb") as f:
                size = f.seek(0, 2)
                if tail and not offsets:
                    start = max(0, size - tail)
                f.seek(start if start <= size else 0)
                data = f.read(max_bytes)
                start = f.tell()
        out[key] = protocol.LogChunk(data.decode(errors="replace"), start)
    return protocol.LogsAnswer(out)

"""One rank of an internal job (the bench's all-reduce sweep, the collectives check): the
group it joins and what it writes in the run directory.

Imports mlx (and the standard library): it runs only as a rank, like its users
(:mod:`mlxops.node.allreduce`, :mod:`mlxops.node.collectives`). The group is the one the
launcher's environment names (:class:`~mlxops.node.protocol.rankenv.RankEnv`), strict
where there is more than one rank: a group of another size than the job's is an exit
naming both, never a sweep or check over the wrong ranks. Files are written whole (a
temporary file, then a rename), so that the controller reading them never sees half.
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlx.core as mx

from mlxops.node import protocol
from mlxops.node.protocol.rankenv import RankEnv


def write_json(path: Path, doc: dict) -> None:
    """``doc`` as one JSON line at ``path``, its folder made if needed, written whole."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(doc) + "\n")
    os.replace(tmp, path)


@dataclass(frozen=True)
class RankRun:
    """This rank's group, and the job it is a rank of."""

    group: Any  # mx.distributed.Group
    rank: int
    world: int
    backend: str
    run_dir: Path

    def beat(self, step: int, state: str = protocol.RUNNING) -> None:
        """The rank's heartbeat (``progress/rank-<r>.json``), at ``step`` in ``state``."""
        write_json(self.run_dir / protocol.progress_file(self.rank), protocol.Progress(
            rank=self.rank, step=step, time=time.time(), pid=os.getpid(),
            world_size=self.world, state=state).to_dict())


def join() -> RankRun:
    """The group this rank's environment names; exits if it is not the job's size."""
    env = RankEnv.from_env()
    world = env.world_size or 1
    backend = env.backend or "any"
    group = mx.distributed.init(strict=world > 1, backend=backend)
    if group.size() != world:
        sys.exit(f"expected {world} ranks, the {backend} group has {group.size()}")
    return RankRun(group=group, rank=group.rank(), world=world, backend=backend,
                   run_dir=Path(env.run_dir or "."))

"""The rank environment: what mlxops exports to every rank it starts, and the variables of
MLX's own launcher it sets the way ``mlx.launch`` does (docs/job-file.md, "What each rank
gets").

Written by the controller into each rank's start script (``jobs/placement.py``), read by
the trainer (``trainer/distributed.py``) and the bench's all-reduce ranks
(``node/allreduce.py``). The trainer also runs under plain ``mlx.launch``, where none of
mlxops' variables is set: so every field may be absent, and a reader falls back to what the
launcher exported. A variable that is set must read as its type; when it does not,
:meth:`RankEnv.from_env` names it.
"""

from __future__ import annotations

import os
import typing
from collections.abc import Mapping
from dataclasses import dataclass, fields

# MLX's launcher variables (``mlx/_distributed_utils/launch.py``).
MLX_RANK = "MLX_RANK"
MLX_HOSTFILE = "MLX_HOSTFILE"                  # ring: a JSON list, one entry per rank
MLX_IBV_DEVICES = "MLX_IBV_DEVICES"            # jaccl: one row per rank
MLX_JACCL_COORDINATOR = "MLX_JACCL_COORDINATOR"
MLX_JACCL_RING = "MLX_JACCL_RING"
MLX_MPI_LIBNAME = "MLX_MPI_LIBNAME"
#: What the trainer's world size falls back on under other launchers (nccl, mpirun, PMI).
LAUNCHER_WORLD_SIZES = ("MLX_WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE")

#: mlxops' own variables, by the :class:`RankEnv` field each carries.
VARIABLES = {
    "world_size": "MLXOPS_WORLD_SIZE",   # expected number of ranks
    "local_rank": "MLXOPS_LOCAL_RANK",   # index within its host: local rank 0 writes ckpts
    "backend": "MLXOPS_BACKEND",         # the distributed backend to init
    "run_dir": "MLXOPS_RUN_DIR",         # the job's run directory on this node
    "resume": "MLXOPS_RESUME",           # "1" when the attempt resumes, else "0"
    "host": "MLXOPS_HOST",               # the rank's host, as the inventory names it
}


@dataclass(frozen=True)
class RankEnv:
    """mlxops' variables of one rank; None: not set (a launcher other than mlxops)."""

    world_size: int | None = None
    local_rank: int | None = None
    backend: str | None = None
    run_dir: str | None = None
    resume: bool | None = None
    host: str | None = None

    def to_env(self) -> dict[str, str]:
        """The variables of the fields that are set, as the start script exports them."""
        out = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if value is not None:
                out[VARIABLES[f.name]] = ("1" if value else "0") if isinstance(value, bool) \
                    else str(value)
        return out

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> RankEnv:
        """This process's (or ``env``'s) variables; an empty one counts as not set.
        ValueError naming the variable when one does not read as its field's type."""
        env = os.environ if env is None else env
        kinds = typing.get_type_hints(cls)
        got: dict[str, object] = {}
        for f in fields(cls):
            name = VARIABLES[f.name]
            text = env.get(name) or ""
            if not text:
                continue
            if kinds[f.name] == int | None:
                try:
                    got[f.name] = int(text)
                except ValueError:
                    raise ValueError(f"{name}={text!r}: want an integer") from None
            elif kinds[f.name] == bool | None:
                if text not in ("0", "1"):
                    raise ValueError(f"{name}={text!r}: want 0 or 1")
                got[f.name] = text == "1"
            else:
                got[f.name] = text
        return cls(**got)  # type: ignore[arg-type]

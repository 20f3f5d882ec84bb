"""``MLX_METAL_FAST_SYNCH`` as a decision, per job as well as per inventory.

MLX's fast synchronization makes each GPU/CPU crossing of a collective cost about 4 us
instead of about 180 us (ml-explore/mlx#4438), and MLX's docs now call it unreliable: a
fence can leave the GPU wedged until the Mac reboots (ml-explore/mlx#3830, #3142). So it is
off unless asked for:

- the job's ``fast_synch: true|false`` decides for that job (it becomes the job's
  ``MLX_METAL_FAST_SYNCH``, which wins over every host's ``env.sh``);
- else the job's ``env: {MLX_METAL_FAST_SYNCH: ...}`` does;
- else the inventory's ``mlxops_metal_fast_synch`` (0 by default, the same on every host
  of a job), as ``env.sh`` exports it.

Where it ends up on, the job record keeps it and ``mlxops status`` and the report say so
with the risk (:data:`RISK`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

VAR = "MLX_METAL_FAST_SYNCH"
RISK = ("MLX_METAL_FAST_SYNCH on: faster collectives from the GPU, but MLX warns a fence "
        "can wedge the GPU until the Mac reboots")


def fast_synch_on(job_env: dict[str, str], hosts: Sequence[Any]) -> bool:
    """Whether the job's ranks run with fast synchronization: the job's own value (its
    ``fast_synch`` is in its env by then), else every host's inventory value."""
    if VAR in job_env:
        return job_env[VAR] == "1"
    return bool(hosts) and all(str(h.var("mlxops_metal_fast_synch")) == "1" for h in hosts)

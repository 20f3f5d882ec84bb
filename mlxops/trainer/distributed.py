"""Bring up the process group, refusing to silently train alone.

``mx.distributed.init()`` returns a size-1 group when no backend comes up; with several
ranks expected that would make every node train on its own. So the expected world size is
derived from the environment first and, when it is above 1, ``init(strict=True)`` is used
and the group size checked.
"""

from __future__ import annotations

import json
import os
import socket
import zlib

import mlx.core as mx

from mlxops.node.protocol.rankenv import (
    LAUNCHER_WORLD_SIZES,
    MLX_HOSTFILE,
    MLX_IBV_DEVICES,
    VARIABLES,
    RankEnv,
)


class DistributedError(RuntimeError):
    """The group did not come up as expected. Exit code 1."""


def expected_world_size(env: dict[str, str] | None = None) -> int:
    """How many ranks this run should have, from what the launcher exported.

    ``MLXOPS_WORLD_SIZE`` (set by mlxops) wins. Under plain ``mlx.launch``: ring exports
    ``MLX_HOSTFILE`` (a JSON list with one entry per rank; an empty file for one rank),
    jaccl ``MLX_IBV_DEVICES`` (one row per rank), nccl ``MLX_WORLD_SIZE``, mpirun
    ``OMPI_COMM_WORLD_SIZE``. Nothing set means a single process.
    """
    env = dict(os.environ) if env is None else env
    mine = RankEnv.from_env(env).world_size
    if mine is not None:
        return mine
    for var in (MLX_HOSTFILE, MLX_IBV_DEVICES):
        path = env.get(var)
        if path:
            try:
                with open(path) as f:
                    text = f.read().strip()
            except OSError:
                continue
            if not text:
                return 1
            try:
                hosts = json.loads(text)
            except ValueError:
                continue
            if isinstance(hosts, list):
                return max(1, len(hosts))
    for var in LAUNCHER_WORLD_SIZES:
        if env.get(var):
            return int(env[var])
    return 1


def init_group(expected: int, backend: str | None = None) -> mx.distributed.Group:
    backend = backend or RankEnv.from_env().backend or "any"
    if expected > 1:
        try:
            group = mx.distributed.init(strict=True, backend=backend)
        except Exception as e:  # the backend's own message says what failed
            raise DistributedError(
                f"expected {expected} ranks but the {backend!r} backend did not come up: {e}"
            ) from None
    else:
        group = mx.distributed.init(backend=backend)
    if group.size() != expected:
        raise DistributedError(
            f"expected world size {expected} ({VARIABLES['world_size']} / launcher "
            "environment) but "
            f"the {backend!r} group has {group.size()} ranks"
        )
    return group


def is_node_writer(group: mx.distributed.Group) -> bool:
    """True on exactly one rank per host: the one that writes this node's checkpoints.

    mlxops exports ``MLXOPS_LOCAL_RANK`` (rank index within its host). Otherwise the
    hostnames are all-gathered and the lowest rank of each host writes.
    """
    local = RankEnv.from_env().local_rank
    if local is not None:
        return local == 0
    if group.size() == 1:
        return True
    h = zlib.crc32(socket.gethostname().encode()) & 0x7FFFFFFF
    ids = mx.distributed.all_gather(mx.array([h], dtype=mx.int32), group=group, stream=mx.cpu)
    ids = ids.tolist()
    return ids.index(h) == group.rank()


def all_gather_cpu(x: mx.array, group: mx.distributed.Group) -> mx.array:
    if group.size() == 1:
        return x
    return mx.distributed.all_gather(x, group=group, stream=mx.cpu)


def host_names(group: mx.distributed.Group) -> list[str]:
    """Every rank's host, in rank order: ``MLXOPS_HOST`` (the inventory name mlxops gives
    each rank), else the machine's hostname; at most 64 bytes each."""
    name = (RankEnv.from_env().host or socket.gethostname()).encode()[:64]
    row = mx.array(list(name.ljust(64, b"\0")), dtype=mx.uint8)[None]
    rows = all_gather_cpu(row, group).tolist()
    return [bytes(r).rstrip(b"\0").decode(errors="replace") for r in rows]

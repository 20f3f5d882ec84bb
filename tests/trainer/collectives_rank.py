"""One rank of the collectives test (tests/trainer/test_step.py), run as 3 local ring ranks.

Every rank builds a gradient tree of its own (seeded by its rank), reduces it with
nn.average_gradients and with mlxops' mean_over_ranks (float32 and bfloat16 on the wire,
one buffer and many), and saves what it got to ``OUT/rank-<r>.npz``.
"""

from __future__ import annotations

import sys

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx.utils import tree_flatten

from mlxops.trainer import step


def main(out: str) -> None:
    group = mx.distributed.init(strict=True)
    rank = group.rank()
    mx.random.seed(100 + rank)
    grads = {"a": mx.random.normal((33, 7)), "b": [mx.random.normal((5,)),
                                                   {"c": mx.random.normal((4, 4, 3))}]}
    stats = mx.array([1.5 + rank, 1.0])
    saved: dict[str, np.ndarray] = {}

    def keep(prefix: str, tree: dict, s: mx.array | None = None) -> None:
        mx.eval(tree, s)
        for k, v in tree_flatten(tree):
            saved[f"{prefix}/{k}"] = np.array(v)
        if s is not None:
            saved[f"{prefix}/stats"] = np.array(s)

    keep("local", grads)
    keep("average_gradients", nn.average_gradients(grads, group=group))
    keep("fp32", *step.mean_over_ranks(grads, stats, group))
    keep("bf16", *step.mean_over_ranks(grads, stats, group, mx.bfloat16))
    step.GROUP_BYTES = 64  # many buffers, each all-reduce chained to the one before
    keep("fp32-groups", *step.mean_over_ranks(grads, stats, group))
    keep("bf16-groups", *step.mean_over_ranks(grads, stats, group, mx.bfloat16))
    np.savez(f"{out}/rank-{rank}.npz", **saved)


if __name__ == "__main__":
    main(sys.argv[1])

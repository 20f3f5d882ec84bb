"""The data cursor: where in a corpus the next sample comes from, saved in every checkpoint.

A corpus of ``n`` windows (``seq_len + 1`` tokens each, cut from token shards, or one
example each for fine-tuning) is read epoch by epoch. Sample ``i`` of the stream is in
epoch ``e = i // n`` at place ``k = i % n``, and is window ``order(seed, e)[k]``, where
``order(seed, e)`` is a permutation of ``range(n)`` that depends on the shuffle seed and
the epoch only (numpy's PCG64 seeded with ``[seed, e]``): every rank derives the same one,
a new epoch gets a fresh one, and no rank has to tell another where it is.

Step ``s`` of a run with global batch ``G`` reads samples ``[s*G, (s+1)*G)``, whatever the
number of ranks, so the cursor is a function of the step: a resume (on as many ranks or
fewer) reads the same global batches, and a checkpoint's cursor that does not match its
step (another corpus, another seed) is refused. The cursor is saved as
:class:`DataCursor`: the sample index with where it points, ``(epoch, shard, position)``,
for a person to read and for the resume check.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from mlxops.node.protocol.decode import Record


@dataclass(frozen=True)
class DataCursor(Record):
    """The next sample to read: saved in state.json as ``data_position``."""

    sample: int     # its index in the stream (step * global_batch)
    epoch: int      # sample // windows
    shard: int      # the shard holding its window (index in the manifest; 0 for one file)
    position: int   # the window's first token, as an offset in that shard
    seed: int       # the shuffle seed (data.seed): epoch e reads order(seed, e)


class EpochOrder:
    """Sample index -> window index over ``windows`` windows, a fresh shuffle each epoch.

    Keeps the permutation of the epoch it was last asked about, so reading a stream in
    order computes each epoch's permutation once.
    """

    def __init__(self, windows: int, seed: int) -> None:
        if windows < 1:
            raise ValueError(f"a corpus needs at least one window, got {windows}")
        self.windows, self.seed = windows, seed
        self._epoch, self._perm = -1, np.empty(0, dtype=np.int64)

    def permutation(self, epoch: int) -> np.ndarray:
        """``order(seed, epoch)``: the windows of that epoch in the order they are read."""
        if epoch != self._epoch:
            self._perm = np.random.default_rng([self.seed, epoch]).permutation(self.windows)
            self._epoch = epoch
        return self._perm

    def window(self, sample: int) -> int:
        epoch, k = divmod(sample, self.windows)
        return int(self.permutation(epoch)[k])

    def cursor(self, sample: int, locate: Callable[[int], tuple[int, int]]) -> DataCursor:
        """The cursor at ``sample``; ``locate`` maps a window index to (shard, position)."""
        shard, position = locate(self.window(sample))
        return DataCursor(sample=sample, epoch=sample // self.windows, shard=shard,
                          position=position, seed=self.seed)

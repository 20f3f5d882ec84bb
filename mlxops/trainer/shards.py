"""The ``shards`` data source: a prepared directory of token shards, memory-mapped.

``data.path`` names a directory ``mlxops data prepare`` wrote (its ``manifest.json`` and
shards, in the format of trainer/shardformat.py). Each shard of a split is cut into
non-overlapping windows of ``seq_len + 1`` tokens, ``seq_len`` apart (a window's last token
is the next one's first, as the text sources cut bytes), never across two shards:
shard ``j`` of ``c_j`` tokens gives ``w_j = (c_j - 1) // seq_len`` windows, and window ``g``
of the split is window ``g - W_j`` of the shard with ``W_j <= g < W_{j+1}`` (``W`` the
running sum of ``w``), starting at token ``(g - W_j) * seq_len`` of it.

Training samples come in the order of trainer/cursor.py (a fresh shuffle each epoch, from
``data.seed``); validation batches are the validation split's first windows in file order,
the same ones at every evaluation, so the curve compares like with like.

Shards are opened with ``np.memmap``: a step reads only its rows' pages, and a corpus many
times larger than memory trains. The manifest's vocabulary is the model's: a config whose
``model.vocab_size`` differs is refused, naming both. Whether the shards' bytes are the
manifest's is checked before launch (pre-flight hashes them); here each shard's token
count must be the manifest's, which costs nothing.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .config import ConfigError
from .cursor import DataCursor, EpochOrder
from .shardformat import TRAIN, VAL, ShardError, open_shard, read_manifest


class ShardSplit:
    """One split's windows over its memory-mapped shards."""

    def __init__(self, directory: Path, shards: list, seq_len: int, where: str) -> None:
        self.seq_len = seq_len
        self.tokens: list[np.ndarray] = []
        counts = []
        for info in shards:
            try:
                tokens = open_shard(directory / info.name)
            except ShardError as exc:
                raise ConfigError(f"{where}: data.path: {exc}") from None
            if len(tokens) != info.tokens:
                raise ConfigError(f"{where}: data.path: {directory / info.name}: "
                                  f"{len(tokens)} tokens, the manifest says {info.tokens}")
            self.tokens.append(tokens)
            counts.append(max(0, (len(tokens) - 1) // seq_len))
        self.starts = np.cumsum([0] + counts)   # W_j: the first window of shard j
        self.windows = int(self.starts[-1])

    def locate(self, window: int) -> tuple[int, int]:
        """(shard, first token) of window ``window`` of the split."""
        shard = int(np.searchsorted(self.starts, window, side="right") - 1)
        return shard, (window - int(self.starts[shard])) * self.seq_len

    def rows(self, windows: np.ndarray) -> np.ndarray:
        """The windows' tokens, ``(len(windows), seq_len + 1)`` int32, read shard by shard."""
        n = self.seq_len + 1
        out = np.empty((len(windows), n), dtype=np.int32)
        shard_of = np.searchsorted(self.starts, windows, side="right") - 1
        for shard in np.unique(shard_of):
            picked = np.nonzero(shard_of == shard)[0]
            first = (windows[picked] - self.starts[shard]) * self.seq_len
            out[picked] = self.tokens[shard][first[:, None] + np.arange(n)]
        return out


class ShardSource:
    """Sample ``i`` -> ``seq_len + 1`` token ids of the training split (data.py's Source)."""

    def __init__(self, path: str, seed: int, vocab: int, seq_len: int,
                 where: str = "config") -> None:
        directory = Path(path)
        try:
            self.manifest = read_manifest(directory)
        except ShardError as exc:
            raise ConfigError(f"{where}: data.path: {exc}") from None
        if self.manifest.vocab_size != vocab:
            raise ConfigError(f"{where}: model.vocab_size: {vocab}, but the corpus at {path} "
                              f"was tokenized with a vocabulary of "
                              f"{self.manifest.vocab_size} (its manifest.json): set "
                              f"model.vocab_size: {self.manifest.vocab_size}")
        self.train = ShardSplit(directory, self.manifest.shards(TRAIN), seq_len, where)
        if self.train.windows < 1:
            raise ConfigError(f"{where}: data.path: the training split of {path} has fewer "
                              "than seq_len+1 tokens")
        self.val = ShardSplit(directory, self.manifest.shards(VAL), seq_len, where)
        self.order = EpochOrder(self.train.windows, seed)
        self.seq_len, self.windows = seq_len, self.train.windows
        self.path, self.where = path, where

    def samples(self, start: int, count: int) -> np.ndarray:
        picked = np.fromiter((self.order.window(i) for i in range(start, start + count)),
                             dtype=np.int64, count=count)
        return self.train.rows(picked)

    def cursor(self, sample: int) -> DataCursor:
        return self.order.cursor(sample, self.train.locate)

    def validation(self, start: int, count: int) -> np.ndarray:
        """Validation samples ``[start, start + count)``: the split's windows in file order
        (from the first again past its end)."""
        if self.val.windows < 1:
            raise ConfigError(f"{self.where}: data.path: {self.path} has no validation split "
                              "(prepare it with a validation share), but train.eval_every "
                              "is set")
        return self.val.rows(np.arange(start, start + count, dtype=np.int64) % self.val.windows)

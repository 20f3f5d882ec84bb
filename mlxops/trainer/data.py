"""Deterministic, sharded token streams.

Sample ``i`` of the stream is a pure function of ``(data.seed, i)``; step ``s`` uses samples
``[s*G, (s+1)*G)`` with ``G = train.global_batch``. Rank ``r`` of ``W`` takes the contiguous
slice ``[r*G/W, (r+1)*G/W)`` of that global batch (or, with ``train.balance``, a slice of
its own size after the slices of the ranks before it) and walks it micro-batch by
micro-batch.
So any world size and any accumulation read exactly the same global batches, and resuming
needs only the step number (the data cursor ``s*G`` is saved with each checkpoint).

Sources:
- ``synthetic``: a fixed random first-order Markov chain over the vocabulary (4 successors
  per token, probabilities .7/.1/.1/.1). No download; entropy ~0.94 nats/token, so the loss
  falls visibly from ln(vocab) in a few hundred steps.
- ``text``: a file or every file under a directory (sorted), read as bytes via np.memmap
  (streamed from disk, never loaded whole); files are joined with a newline.
- ``jsonl``: a file or every ``*.jsonl`` under a directory; the ``text`` field of each line,
  UTF-8 bytes, joined with a newline (held in memory as uint8).
- ``shards``: a directory of token shards ``mlxops data prepare`` wrote (trainer/shards.py),
  memory-mapped; the model's vocabulary is its manifest's.
Text sources are cut into windows of ``seq_len + 1`` tokens, visited in a per-epoch
permutation seeded by ``(data.seed, epoch)`` (trainer/cursor.py).

Validation (``train.eval_every``) reads :meth:`Source.validation`: the shards' validation
split, or for ``synthetic`` samples of the same chain from indices training never reaches
(``VALIDATION_START`` on).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from .config import SYNTHETIC_SUCCESSORS as SUCCESSORS
from .config import ConfigError, DataConfig
from .cursor import DataCursor, EpochOrder
from .shards import ShardSource

PROBS = np.array([0.7, 0.1, 0.1, 0.1])
#: The synthetic corpus's validation samples are its samples from this index on: a run
#: would need 2**62 sequences to reach them.
VALIDATION_START = 1 << 62


class Source:
    """Sample ``i`` -> ``seq_len + 1`` token ids."""

    def samples(self, start: int, count: int) -> np.ndarray:
        raise NotImplementedError

    def validation(self, start: int, count: int) -> np.ndarray:
        """Validation samples ``[start, start + count)`` (config.EVAL_SOURCES have them)."""
        raise NotImplementedError(f"{type(self).__name__} has no validation data")

    def cursor(self, sample: int) -> DataCursor | None:
        """Where sample ``sample`` is read from, for the checkpoint (None: nowhere to say,
        the sample index is all)."""
        return None


class SyntheticSource(Source):
    def __init__(self, seed: int, vocab: int, seq_len: int):
        rng = np.random.default_rng([seed, 0x5EED])
        self.table = np.stack([rng.choice(vocab, SUCCESSORS, replace=False)
                               for _ in range(vocab)]).astype(np.int32)
        self.cdf = np.cumsum(PROBS)
        self.seed, self.vocab, self.seq_len = seed, vocab, seq_len

    def samples(self, start: int, count: int) -> np.ndarray:
        n = self.seq_len + 1
        # One generator per sample keyed by (seed, index): independent of batch layout.
        u = np.stack([np.random.default_rng([self.seed, start + j]).random(n + 1)
                      for j in range(count)])
        out = np.empty((count, n), dtype=np.int32)
        out[:, 0] = (u[:, 0] * self.vocab).astype(np.int32)
        choice = np.searchsorted(self.cdf, u[:, 1:], side="right").clip(0, SUCCESSORS - 1)
        for t in range(1, n):
            out[:, t] = self.table[out[:, t - 1], choice[:, t]]
        return out

    def validation(self, start: int, count: int) -> np.ndarray:
        return self.samples(VALIDATION_START + start, count)


class TokenSource(Source):
    """Windows over a concatenation of byte arrays (memmaps for text files)."""

    def __init__(self, parts: list[np.ndarray], seed: int, seq_len: int, where: str):
        self.parts = [p for p in parts if len(p)]
        self.offsets = np.cumsum([0] + [len(p) for p in self.parts])
        self.total = int(self.offsets[-1])
        self.seq_len, self.seed = seq_len, seed
        self.windows = (self.total - 1) // seq_len
        if self.windows < 1:
            raise ConfigError(f"{where}: data.path: fewer than seq_len+1 tokens of data")
        self.order = EpochOrder(self.windows, seed)

    def _read(self, pos: int, n: int) -> np.ndarray:
        out = np.empty(n, dtype=np.int32)
        filled = 0
        while filled < n:
            p = int(np.searchsorted(self.offsets, pos, side="right") - 1)
            local = pos - int(self.offsets[p])
            take = min(n - filled, len(self.parts[p]) - local)
            out[filled:filled + take] = self.parts[p][local:local + take]
            filled += take
            pos += take
        return out

    def samples(self, start: int, count: int) -> np.ndarray:
        return np.stack([self._read(self.order.window(i) * self.seq_len, self.seq_len + 1)
                         for i in range(start, start + count)])


def _files(path: Path, pattern: str, where: str) -> list[Path]:
    if path.is_file():
        return [path]
    if path.is_dir():
        files = sorted(p for p in path.rglob(pattern) if p.is_file())
        if files:
            return files
    raise ConfigError(f"{where}: data.path: no data files at {path}")


def make_source(cfg: DataConfig, vocab: int, seq_len: int, where: str = "config"
                ) -> Source | ShardSource:
    if cfg.source == "synthetic":
        return SyntheticSource(cfg.seed, vocab, seq_len)
    if cfg.source == "shards":
        return ShardSource(cfg.path or "", cfg.seed, vocab, seq_len, where)
    path = Path(cfg.path or "")
    newline = np.frombuffer(b"\n", dtype=np.uint8)
    parts: list[np.ndarray] = []
    if cfg.source == "text":
        for f in _files(path, "*", where):
            if f.stat().st_size:
                parts += [np.memmap(f, dtype=np.uint8, mode="r"), newline]
    else:
        for f in _files(path, "*.jsonl", where):
            with open(f, "rb") as fh:
                for n, line in enumerate(fh, 1):
                    if not line.strip():
                        continue
                    try:
                        text = json.loads(line)[cfg.text_field]
                    except (ValueError, KeyError, TypeError):
                        raise ConfigError(
                            f"{f}:{n}: data.text_field: no {cfg.text_field!r} string field"
                        ) from None
                    parts += [np.frombuffer(str(text).encode(), dtype=np.uint8), newline]
    return TokenSource(parts, cfg.seed, seq_len, where)


class Batches:
    """This rank's micro-batches of a step: a deterministic function of (seed, step).

    ``counts``: sequences per rank (``train.balance``, trainer/balance.py); rank r takes
    the contiguous slice after the first r ranks' counts. None: ``global_batch / world``
    each (which divides: config.check_world, run before the trainer builds this).
    """

    def __init__(self, source: Source | ShardSource, global_batch: int, rank: int, world: int,
                 counts: list[int] | None = None):
        self.source, self.global_batch = source, global_batch
        self.rank, self.world = rank, world
        self.counts = counts or [global_batch // world] * world
        assert len(self.counts) == world and sum(self.counts) == global_batch, self.counts
        self.per_rank = self.counts[rank]
        self.offset = sum(self.counts[:rank])

    def cursor(self, step: int) -> int:
        """Index of the first sample of ``step`` in the stream."""
        return step * self.global_batch

    def plan(self, step: int) -> tuple[int, int]:
        """(first sample, count) of this rank's rows of ``step``."""
        return self.cursor(step) + self.offset, self.per_rank

    def micro_batches(self, step: int, micro: int, rows: np.ndarray | None = None
                      ) -> list[tuple[np.ndarray, np.ndarray]]:
        """``(inputs, targets)`` of each micro-batch of ``step``; ``rows``: this rank's rows
        of it when read already (prefetch.py), else read here."""
        if rows is None:
            rows = self.source.samples(*self.plan(step))
        out = []
        for a in range(0, self.per_rank, micro):
            chunk = rows[a:a + micro]
            out.append((chunk[:, :-1], chunk[:, 1:]))
        return out


def split_rank(per_rank: int, micro_batch: int) -> tuple[int, int]:
    """(micro, accumulation) of one rank's ``per_rank`` sequences: the largest divisor of
    ``per_rank`` not above ``micro_batch``, and how many of them make ``per_rank``."""
    micro = max(d for d in range(1, min(micro_batch, per_rank) + 1) if per_rank % d == 0)
    return micro, per_rank // micro

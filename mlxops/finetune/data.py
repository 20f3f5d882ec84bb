"""Fine-tuning data: mlx-lm's datasets, our exact cursor.

``train.jsonl`` / ``valid.jsonl`` are read and tokenized by mlx-lm's own classes
(``load_local_dataset``: chat ``messages`` through the tokenizer's chat template,
``prompt``/``completion``, ``text``; ``mask_prompt`` gives each example the offset where
its loss starts). Every example is tokenized once at start (mlx-lm's ``CacheDataset``
does it lazily; the batch order needs every length first).

The order is mlx-lm's ``iterate_batches``' idea (examples sorted by length, cut into
consecutive batches so that a batch pads little, batches visited in a shuffled order)
with the order a pure function of ``(train.seed, step)``: the epoch ``e = step // B`` (B
batches per epoch; an incomplete last batch is dropped, as mlx-lm drops it) visits the
batches in the permutation seeded by ``(seed, e)``. So resuming needs only the step, and
any world size reads the same global batches; ``iterate_batches`` itself does not fit: it
shuffles with NumPy's global seed once per process, interleaves ranks by example, and
splits only equally. Rank r takes the contiguous slice after the first r ranks' counts
(:mod:`mlxops.trainer.balance`), cut into micro-batches, each padded as mlx-lm pads (to
``1 + 32k`` tokens, at most ``max_seq_len``) with ``(offset, length)`` per row: the
arguments of mlx-lm's ``default_loss``.

The shuffle and the cursor are the trainer's (:mod:`mlxops.trainer.cursor`): here a
"window" is one length-sorted batch, so ``EpochOrder`` over the batches gives step ``s``
its batch, and the checkpoint's ``DataCursor`` is ``(sample = steps done, epoch, shard 0,
position = the next batch, seed)``.
"""

from __future__ import annotations

import types
from pathlib import Path
from typing import Any

import numpy as np

from mlxops.trainer.cursor import DataCursor, EpochOrder

from .config import ConfigError, FinetuneConfig

#: mlx-lm pads a batch to one plus a multiple of this (``iterate_batches``).
PAD_TO = 32


class Examples:
    """Tokenized examples: ``tokens[i]`` (ids) and ``offsets[i]`` (where the loss starts)."""

    def __init__(self, rows: list[tuple[list[int], int]]):
        self.tokens = [np.asarray(t, dtype=np.int32) for t, _ in rows]
        self.offsets = np.asarray([o for _, o in rows], dtype=np.int64)
        self.lengths = np.asarray([len(t) for t in self.tokens], dtype=np.int64)

    def __len__(self) -> int:
        return len(self.tokens)


def load_examples(cfg: FinetuneConfig, tokenizer: Any) -> tuple[Examples, Examples, int]:
    """``(train, valid, left out)`` of ``data.path`` through mlx-lm's datasets (valid may
    be empty); left out: the examples with no token to learn (every target masked)."""
    from mlx_lm.tuner.datasets import load_local_dataset

    path = Path(cfg.data.path or "")
    if not (path / "train.jsonl").is_file():
        raise ConfigError(f"{path}: data.path: no train.jsonl")
    options = types.SimpleNamespace(mask_prompt=cfg.data.mask_prompt)
    try:
        train, valid, _ = load_local_dataset(path, tokenizer, options)
    except ValueError as e:  # mlx-lm's: an unknown format, masking a text dataset
        raise ConfigError(f"{path}: data.path: {str(e).splitlines()[0]}") from None
    parts, dropped = [], 0
    for name, dataset in (("train", train), ("valid", valid)):
        rows = [dataset.process(dataset[i]) for i in range(len(dataset))]
        # An example whose every target is masked (a prompt as long as max_seq_len) would
        # make default_loss divide by zero: it teaches nothing, so it is left out.
        kept = [r for r in rows if _targets(len(r[0]), r[1], cfg.train.max_seq_len) > 0]
        dropped += len(rows) - len(kept)
        parts.append(Examples(kept))
        if name == "train" and len(parts[0]) < cfg.train.global_batch:
            raise ConfigError(f"{path / 'train.jsonl'}: train.global_batch: "
                              f"{cfg.train.global_batch} examples per step, but the file "
                              f"has {len(parts[0])}")
    return parts[0], parts[1], dropped


def _targets(length: int, offset: int, max_seq_len: int) -> int:
    """Tokens ``default_loss`` counts in one example (see :func:`token_count`)."""
    return max(0, min(length, max_seq_len - 1) - max(offset, 1) + 1)


def length_batches(examples: Examples, size: int) -> list[np.ndarray]:
    """Example indices sorted by length (stable), cut into full batches of ``size``."""
    order = np.argsort(examples.lengths, kind="stable")
    return [order[i:i + size] for i in range(0, len(order) - size + 1, size)]


def token_count(examples: Examples, rows: np.ndarray, max_seq_len: int) -> int:
    """Tokens ``default_loss`` counts for ``rows``: targets ``1..T`` between each row's
    offset and its (cut) length, ``T`` being at least the row's length minus one."""
    lengths = np.minimum(examples.lengths[rows], max_seq_len - 1)
    return int(np.clip(lengths - np.maximum(examples.offsets[rows], 1) + 1, 0, None).sum())


def pad(examples: Examples, rows: np.ndarray, max_seq_len: int) -> tuple[np.ndarray, np.ndarray]:
    """``(tokens [b, L], lengths [b, 2])`` as mlx-lm's ``iterate_batches`` builds them."""
    lengths = np.minimum(examples.lengths[rows], max_seq_len)
    width = min(1 + PAD_TO * ((int(examples.lengths[rows].max()) + PAD_TO - 1) // PAD_TO),
                max_seq_len)
    batch = np.zeros((len(rows), width), np.int32)
    for j, i in enumerate(rows):
        batch[j, :lengths[j]] = examples.tokens[i][:lengths[j]]
    return batch, np.stack([examples.offsets[rows], lengths], axis=1).astype(np.int32)


class Cursor:
    """The global batch of every step, and each rank's share of it."""

    def __init__(self, examples: Examples, global_batch: int, seed: int, max_seq_len: int):
        self.examples, self.max_seq_len = examples, max_seq_len
        self.batches = length_batches(examples, global_batch)
        self.order = EpochOrder(len(self.batches), seed)

    @property
    def per_epoch(self) -> int:
        return len(self.batches)

    def position(self, step: int) -> DataCursor:
        """The cursor after ``step`` steps (what a checkpoint at ``step`` records)."""
        return self.order.cursor(step, lambda batch: (0, batch))

    def global_rows(self, step: int) -> np.ndarray:
        """The example indices of step ``step`` (1-based, as the loop counts)."""
        return self.batches[self.order.window(step - 1)]

    def rank_rows(self, step: int, counts: list[int], rank: int) -> np.ndarray:
        start = sum(counts[:rank])
        return self.global_rows(step)[start:start + counts[rank]]

    def step_tokens(self, step: int) -> int:
        """Tokens the loss counts over the whole global batch of ``step`` (every rank)."""
        return token_count(self.examples, self.global_rows(step), self.max_seq_len)


def micro_batches(examples: Examples, rows: np.ndarray, pieces: int, max_seq_len: int
                  ) -> list[tuple[np.ndarray, np.ndarray]]:
    """``rows`` cut into ``pieces`` near-equal micro-batches (fewer if it has fewer rows),
    each padded on its own."""
    return [pad(examples, part, max_seq_len)
            for part in np.array_split(rows, min(pieces, len(rows)))]

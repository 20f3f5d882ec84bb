"""A prepared directory as ``mlxops data prepare`` writes it (trainer/shardformat.py's
format and manifest), written directly for the trainer's tests: a learnable token stream
(the synthetic corpus's Markov chain, made up by the trainer itself) cut into shards."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np

from mlxops.trainer.data import SyntheticSource
from mlxops.trainer.shardformat import (
    MANIFEST,
    TRAIN,
    VAL,
    Manifest,
    ShardInfo,
    TokenizerInfo,
    dtype_for,
    header,
    shard_name,
    write_tokens,
)


def write_shard(path: Path, tokens: np.ndarray, dtype: str) -> ShardInfo:
    with open(path, "wb") as fh:
        fh.write(header(dtype, len(tokens)))
        write_tokens(fh, tokens, dtype)
    data = path.read_bytes()
    return ShardInfo(name=path.name, sha256=hashlib.sha256(data).hexdigest(),
                     bytes=len(data), tokens=len(tokens))


def write_corpus(directory: Path, splits: dict[str, list[np.ndarray]], vocab: int) -> Path:
    """Shards of each split's token arrays, and their manifest."""
    directory.mkdir(parents=True, exist_ok=True)
    dtype = dtype_for(vocab)
    infos = {split: [write_shard(directory / shard_name(split, i), tokens, dtype)
                     for i, tokens in enumerate(arrays)] for split, arrays in splits.items()}
    manifest = Manifest(tokenizer=TokenizerInfo("test", "markov chain", "0" * 64),
                        vocab_size=vocab, dtype=dtype, train=infos.get(TRAIN, []),
                        val=infos.get(VAL, []))
    (directory / MANIFEST).write_text(manifest.text())
    return directory


def markov_corpus(directory: Path, vocab: int = 64, train: tuple[int, ...] = (3000, 2500, 3100),
                  val: int = 1200, seed: int = 5) -> Path:
    """Shards of one long walk of the synthetic chain: learnable, different in each shard."""
    chain = SyntheticSource(seed, vocab, 99).samples(0, (sum(train) + val) // 100 + 1).ravel()
    parts, at = [], 0
    for n in (*train, val):
        parts.append(chain[at:at + n])
        at += n
    return write_corpus(directory, {TRAIN: parts[:-1], VAL: parts[-1:]}, vocab)

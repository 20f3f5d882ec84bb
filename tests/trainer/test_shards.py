"""The shards source (trainer/shards.py) and read-ahead (trainer/prefetch.py), in process."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from shard_corpus import markov_corpus, write_corpus

from mlxops.trainer.config import ConfigError, DataConfig
from mlxops.trainer.data import Batches, make_source
from mlxops.trainer.prefetch import Prefetcher
from mlxops.trainer.shards import ShardSource


@pytest.fixture
def counting(tmp_path):
    """Shards whose tokens are their own positions in the split (ids mod 65,536 don't
    matter here: vocabulary 70,000, so uint32), two training shards and one validation."""
    train = [np.arange(0, 1001), np.arange(5000, 5501)]
    return write_corpus(tmp_path / "corpus", {"train": train, "val": [np.arange(9000, 9300)]},
                        vocab=70_000)


def test_windows_never_cross_a_shard_and_each_epoch_reads_each_once(counting):
    src = ShardSource(str(counting), seed=0, vocab=70_000, seq_len=100)
    assert src.train.windows == 10 + 5 and src.manifest.dtype == "uint32"
    epoch0 = src.samples(0, 15)
    firsts = sorted(int(r[0]) for r in epoch0)
    assert firsts == [*range(0, 1000, 100), *range(5000, 5500, 100)]
    for row in epoch0:   # consecutive tokens of one shard
        assert np.array_equal(row, np.arange(row[0], row[0] + 101))
    epoch1 = src.samples(15, 15)
    assert sorted(int(r[0]) for r in epoch1) == firsts
    assert [int(r[0]) for r in epoch1] != [int(r[0]) for r in epoch0]   # a fresh shuffle
    # A fresh source (another rank, a resumed process) reads the same sample anywhere.
    again = ShardSource(str(counting), seed=0, vocab=70_000, seq_len=100)
    assert np.array_equal(again.samples(22, 3), epoch1[7:10])


def test_the_cursor_points_at_the_sample(counting):
    src = ShardSource(str(counting), seed=3, vocab=70_000, seq_len=100)
    for i in (0, 7, 14, 15, 29):
        cur = src.cursor(i)
        row = src.samples(i, 1)[0]
        base = (0, 5000)[cur.shard]
        assert row[0] == base + cur.position and cur.epoch == i // 15 and cur.seed == 3


def test_validation_reads_the_val_split_in_order_and_wraps(counting):
    src = ShardSource(str(counting), seed=0, vocab=70_000, seq_len=100)
    assert src.val.windows == 2
    assert [int(r[0]) for r in src.validation(0, 3)] == [9000, 9100, 9000]


def test_no_validation_split_is_named_when_asked_for(tmp_path):
    corpus = write_corpus(tmp_path / "c", {"train": [np.arange(500)]}, vocab=600)
    src = ShardSource(str(corpus), seed=0, vocab=600, seq_len=10)
    with pytest.raises(ConfigError, match="data.path: .* has no validation split"):
        src.validation(0, 1)


def test_the_vocabulary_is_the_manifests(counting):
    with pytest.raises(ConfigError, match="model.vocab_size: 256, but the corpus .* "
                                          "vocabulary of 70000 .* set model.vocab_size: 70000"):
        make_source(DataConfig(source="shards", path=str(counting)), 256, 100)


def test_a_shard_cut_short_is_named(counting):
    shard = counting / "train-000001.bin"
    shard.write_bytes(shard.read_bytes()[:-8])
    with pytest.raises(ConfigError, match="train-000001.bin: .* cut short"):
        ShardSource(str(counting), seed=0, vocab=70_000, seq_len=100)


def test_no_manifest_is_one_line(tmp_path):
    with pytest.raises(ConfigError, match="data.path: .*manifest.json.*mlxops data prepare"):
        ShardSource(str(tmp_path), seed=0, vocab=64, seq_len=8)


def test_prefetch_gives_the_rows_a_direct_read_gives(tmp_path):
    src = ShardSource(str(markov_corpus(tmp_path / "c")), seed=1, vocab=64, seq_len=32)
    batches = Batches(src, 8, rank=1, world=2)
    direct = [batches.micro_batches(s, 2) for s in range(1, 30)]
    ahead = Prefetcher(src.samples, batches.plan, depth=2)
    got = [batches.micro_batches(s, 2, ahead.rows(s)) for s in range(1, 30)]
    ahead.close()
    assert ahead.misses == 0
    for want, have in zip(direct, got, strict=True):
        for (x, y), (x2, y2) in zip(want, have, strict=True):
            assert np.array_equal(x, x2) and np.array_equal(y, y2)


def test_prefetch_rereads_when_the_split_changes_or_a_step_is_redone(tmp_path):
    src = ShardSource(str(markov_corpus(tmp_path / "c")), seed=1, vocab=64, seq_len=32)
    plan = {"counts": (0, 4)}
    ahead = Prefetcher(src.samples, lambda s: (s * 8 + plan["counts"][0], plan["counts"][1]),
                       depth=3)
    assert np.array_equal(ahead.rows(1), src.samples(8, 4))
    assert np.array_equal(ahead.rows(2), src.samples(16, 4))
    plan["counts"] = (4, 4)             # balance: auto took another split
    assert np.array_equal(ahead.rows(3), src.samples(28, 4))
    assert np.array_equal(ahead.rows(3), src.samples(28, 4))   # an out-of-memory redo
    assert np.array_equal(ahead.rows(4), src.samples(36, 4))
    assert ahead.misses == 2
    ahead.close()
    assert not [t for t in threading.enumerate() if t.name == "mlxops-prefetch"]


def test_a_read_error_reaches_the_loop(tmp_path):
    def read(start: int, count: int) -> np.ndarray:
        if start >= 3:
            raise OSError("disk gone")
        return np.zeros((count, 2), dtype=np.int32)

    ahead = Prefetcher(read, lambda s: (s, 1), depth=2)
    ahead.rows(1)
    ahead.rows(2)
    with pytest.raises(OSError, match="disk gone"):
        ahead.rows(3)
    ahead.close()

import json

import numpy as np

from mlxops.trainer.config import DataConfig
from mlxops.trainer.data import Batches, SyntheticSource, make_source, split_rank


def global_batch(source, step, gb, world, micro):
    rows = []
    for r in range(world):
        for x, y in Batches(source, gb, r, world).micro_batches(step, micro):
            assert np.array_equal(x[:, 1:], y[:, :-1])
            rows.append(np.concatenate([x, y[:, -1:]], axis=1))
    return np.concatenate(rows)


def test_same_global_batch_for_any_world_size():
    src = SyntheticSource(3, 256, 16)
    ref = global_batch(src, 7, 8, 1, 8)
    for world, micro in [(1, 2), (2, 1), (2, 4), (4, 2), (8, 1)]:
        assert np.array_equal(global_batch(src, 7, 8, world, micro), ref)
    # a fresh source (a resumed process) gives the same tokens
    assert np.array_equal(global_batch(SyntheticSource(3, 256, 16), 7, 8, 2, 2), ref)
    assert not np.array_equal(global_batch(src, 8, 8, 1, 8), ref)


def test_synthetic_is_learnable_markov_chain():
    src = SyntheticSource(0, 256, 64)
    rows = src.samples(0, 64)
    assert rows.min() >= 0 and rows.max() < 256
    # every transition is one of the 4 successors of its token
    prev, nxt = rows[:, :-1].ravel(), rows[:, 1:].ravel()
    assert all(n in src.table[p] for p, n in zip(prev[:500], nxt[:500], strict=True))


def test_split_rank_adapts_accumulation():
    assert split_rank(32, 8) == (8, 4)
    assert split_rank(16, 8) == (8, 2)
    assert split_rank(8, 8) == (8, 1)
    assert split_rank(12, 5) == (4, 3)  # micro_batch is an upper bound: the largest divisor
    assert split_rank(7, 4) == (1, 7)   # a prime per-rank batch: one sequence at a time
    for world in (1, 2, 4):
        m, a = split_rank(16 // world, 4)
        assert m * a * world == 16


def test_text_and_jsonl_sources(tmp_path):
    (tmp_path / "a.txt").write_text("hello world " * 50)
    (tmp_path / "b.txt").write_text("other text " * 50)
    src = make_source(DataConfig(source="text", path=str(tmp_path), seed=0), 256, 16)
    rows = src.samples(0, src.windows + 3)  # wraps into a second epoch
    assert rows.shape == (src.windows + 3, 17)
    text = bytes(rows[0].astype(np.uint8))
    assert text in (("hello world " * 50) + "\n" + ("other text " * 50)).encode()
    assert np.array_equal(src.samples(5, 2), make_source(
        DataConfig(source="text", path=str(tmp_path)), 256, 16).samples(5, 2))

    j = tmp_path / "d.jsonl"
    j.write_text("\n".join(json.dumps({"text": f"doc {i} " * 20}) for i in range(5)))
    src = make_source(DataConfig(source="jsonl", path=str(j)), 256, 16)
    assert src.samples(0, 4).shape == (4, 17)

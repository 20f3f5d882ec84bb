"""trainer/cursor.py: the epoch order every rank derives, and the cursor saved with it."""

from __future__ import annotations

import json

import numpy as np

from mlxops.trainer.cursor import DataCursor, EpochOrder


def test_each_epoch_visits_every_window_once_in_a_fresh_order():
    order = EpochOrder(windows=50, seed=7)
    first = [order.window(i) for i in range(50)]
    second = [order.window(i) for i in range(50, 100)]
    assert sorted(first) == sorted(second) == list(range(50))
    assert first != second


def test_the_order_depends_on_the_seed_and_epoch_only():
    a, b = EpochOrder(1000, seed=3), EpochOrder(1000, seed=3)
    # Read out of order (a rank of a resumed run starts mid-epoch): the same windows.
    assert [a.window(i) for i in (2500, 17, 999, 1000)] == \
           [b.window(i) for i in (2500, 17, 999, 1000)]
    assert not np.array_equal(EpochOrder(1000, 4).permutation(0), a.permutation(0))


def test_the_cursor_names_shard_and_position_and_survives_json():
    order = EpochOrder(windows=10, seed=1)

    def locate(window: int) -> tuple[int, int]:   # 4 windows of 65 tokens per shard
        return window // 4, (window % 4) * 64

    cur = order.cursor(23, locate)
    assert cur.sample == 23 and cur.epoch == 2 and cur.seed == 1
    assert (cur.shard, cur.position) == locate(order.permutation(2)[3])
    assert DataCursor.from_dict(json.loads(json.dumps(cur.to_dict()))) == cur

"""The exact cursor and the token-weighted loss, against mlx-lm's own batching and loss."""

from __future__ import annotations

import types

import mlx.core as mx
import numpy as np
import pytest
from mlx.utils import tree_flatten

from mlxops.finetune.config import load_config
from mlxops.finetune.data import Cursor, load_examples, micro_batches, pad, token_count
from mlxops.finetune.dropout import ExampleDropout, RowSeeds, fmix32
from mlxops.finetune.model import apply_method, load_base
from mlxops.finetune.objective import seed_of, token_loss


@pytest.fixture(scope="module")
def loaded(tiny):
    cfg = load_config({"model": {"path": str(tiny.llama)},
                       "data": {"path": str(tiny.data["chat"]), "mask_prompt": True},
                       "method": {"num_layers": -1}, "train": {"max_seq_len": 48}})
    mx.random.seed(0)
    model, tokenizer = load_base(cfg)
    apply_method(model, cfg)
    train, valid, dropped = load_examples(cfg, tokenizer)
    return cfg, model, tokenizer, train, valid, dropped


def test_examples_are_mlx_lm_s_own(loaded, tiny):
    from mlx_lm.tuner.datasets import load_local_dataset

    cfg, _, tokenizer, train, valid, dropped = loaded
    theirs, _, _ = load_local_dataset(tiny.data["chat"], tokenizer,
                                      types.SimpleNamespace(mask_prompt=True))
    tokens, offset = theirs.process(theirs[0])
    assert train.tokens[0].tolist() == tokens and train.offsets[0] == offset
    assert len(train) + dropped == len(theirs) and len(valid) > 0


def test_padding_is_iterate_batches(loaded):
    """Our micro-batch is the array mlx-lm's iterate_batches makes of the same rows."""
    from mlx_lm.tuner.datasets import CacheDataset
    from mlx_lm.tuner.trainer import iterate_batches

    cfg, _, _, train, _, _ = loaded

    class Rows:  # the examples mlx-lm's iterator sees: ours, already tokenized
        def __init__(self, rows):
            self.rows = rows

        def __len__(self):
            return len(self.rows)

        def __getitem__(self, i):
            return self.rows[i]

        def process(self, row):
            return row

    rows = np.array([3, 10, 17, 40])
    data = CacheDataset(Rows([(train.tokens[i].tolist(), int(train.offsets[i])) for i in rows]))
    batch, lengths = next(iterate_batches(data, 4, cfg.train.max_seq_len))
    # CacheDataset sorts by its items' len(), here each a (tokens, offset) pair: all 2, so
    # the batch keeps the rows' order.
    mine, my_lengths = pad(train, rows, cfg.train.max_seq_len)
    assert np.array_equal(np.array(batch), mine)
    assert np.array_equal(np.array(lengths), my_lengths)


def test_token_count_is_default_loss_s(loaded):
    from mlx_lm.tuner.trainer import default_loss

    cfg, model, _, train, _, _ = loaded
    cursor = Cursor(train, 8, 0, cfg.train.max_seq_len)
    for step in (1, 2, cursor.per_epoch + 1):
        rows = cursor.global_rows(step)
        x, lengths = pad(train, rows, cfg.train.max_seq_len)
        _, ntoks = default_loss(model, mx.array(x), mx.array(lengths))
        assert ntoks.item() == token_count(train, rows, cfg.train.max_seq_len) == \
            cursor.step_tokens(step)


def test_cursor_is_a_function_of_the_step(loaded):
    cfg, _, _, train, _, _ = loaded
    a = Cursor(train, 4, 7, cfg.train.max_seq_len)
    b = Cursor(train, 4, 7, cfg.train.max_seq_len)
    steps = list(range(1, 2 * a.per_epoch + 2))
    first = [a.global_rows(s).tolist() for s in steps]
    assert [b.global_rows(s).tolist() for s in reversed(steps)] == first[::-1]
    epoch = sorted(sum(first[:a.per_epoch], []))
    assert len(epoch) == len(set(epoch)) == a.per_epoch * 4  # each example once an epoch
    assert first[:a.per_epoch] != first[a.per_epoch:2 * a.per_epoch]  # reshuffled
    assert a.position(a.per_epoch).epoch == 1 and a.position(3).sample == 3
    for counts in ([2, 2], [3, 1], [1, 1, 2]):
        parts = [a.rank_rows(5, counts, r) for r in range(len(counts))]
        assert np.concatenate(parts).tolist() == a.global_rows(5).tolist()


def test_the_split_does_not_change_the_loss_or_its_gradient(loaded):
    """sum over ranks and micro-batches of token_loss (weight 1/T) = the global mean."""
    from mlx_lm.tuner.trainer import default_loss

    cfg, model, _, train, _, _ = loaded
    msl = cfg.train.max_seq_len
    cursor = Cursor(train, 4, 0, msl)
    rows = cursor.global_rows(1)
    weight = mx.array(1.0 / cursor.step_tokens(1))
    grad = mx.value_and_grad(lambda p, *b: (model.update(p), token_loss(model, *b))[1])
    params = model.trainable_parameters()

    def total(parts):
        loss, grads = 0.0, None
        for x, lengths in parts:
            value, g = grad(params, mx.array(x), mx.array(lengths), weight)
            loss += value.item()
            flat = [v for _, v in tree_flatten(g)]
            grads = flat if grads is None else [a + b for a, b in zip(grads, flat, strict=True)]
        return loss, grads

    whole, whole_grads = total(micro_batches(train, rows, 1, msl))
    mean, _ = default_loss(model, *(mx.array(a) for a in pad(train, rows, msl)))
    assert abs(whole - mean.item()) < 1e-5
    split, split_grads = total(micro_batches(train, rows[:3], 2, msl)
                               + micro_batches(train, rows[3:], 1, msl))
    assert abs(split - whole) < 1e-5
    for a, b in zip(split_grads, whole_grads, strict=True):
        assert mx.allclose(a, b, atol=1e-6).item()


def test_dropout_seeds_depend_on_the_example_not_the_rank():
    assert seed_of(0, 5, 2) == seed_of(0, 5, 2) != seed_of(0, 5, 3) != seed_of(1, 5, 2)


def test_an_examples_dropout_mask_ignores_its_micro_batch():
    """A row's mask is the same alone or beside others, at any padded width; p of the
    elements drop, the rest are scaled by 1/(1-p); evaluation drops nothing."""
    seeds = RowSeeds()
    drop = ExampleDropout(0.25, seeds)
    drop.train()
    x = mx.ones((3, 65, 16))
    seeds.value = mx.array([11, 12, 13], mx.uint32)
    together = drop(x)
    seeds.value = mx.array([12], mx.uint32)
    alone = drop(mx.ones((1, 33, 16)))
    assert mx.array_equal(together[1, :33], alone[0]).item()
    assert not mx.array_equal(together[0], together[1]).item()
    assert abs((together == 0).mean().item() - 0.25) < 0.02
    assert set(np.unique(np.array(together)).tolist()) == {0.0, np.float32(1 / 0.75)}
    drop.eval()
    assert drop(x) is x
    # MurmurHash3's fmix32 (its published value for 1)
    assert fmix32(mx.array([1], mx.uint32)).item() == 0x514E28B7

"""Sliding-window attention (model.window) against attention computed naively."""

from __future__ import annotations

import math

import mlx.core as mx
import numpy as np
import pytest

from mlxops.trainer.config import ModelConfig, TrainerConfig
from mlxops.trainer.model import Attention, Transformer, window_mask
from mlxops.trainer.plan import attended_keys, attention_flops_per_token, estimate


def naive(q: np.ndarray, k: np.ndarray, v: np.ndarray, window: int) -> np.ndarray:
    """Each query's softmax over its own keys, one at a time, in float64."""
    b, h, t, d = q.shape
    out = np.zeros_like(q, dtype=np.float64)
    for bi in range(b):
        for hi in range(h):
            for i in range(t):
                keys = range(max(0, i - window + 1) if window else 0, i + 1)
                scores = np.array([q[bi, hi, i] @ k[bi, hi, j] for j in keys]) / math.sqrt(d)
                weights = np.exp(scores - scores.max())
                weights /= weights.sum()
                out[bi, hi, i] = sum(w * v[bi, hi, j] for w, j in zip(weights, keys,
                                                                         strict=True))
    return out


def test_the_mask_is_the_window():
    m = np.array(window_mask(5, 2))
    assert m.tolist() == [[i - 2 < j <= i for j in range(5)] for i in range(5)]


@pytest.mark.parametrize("window", [1, 3, 0, 16])
def test_the_fused_attention_with_the_mask_is_the_naive_one(window):
    cfg = ModelConfig(dims=16, heads=2, seq_len=12, window=window)
    attn = Attention(cfg)
    x = mx.random.normal((2, 12, 16), key=mx.random.key(3))
    got = np.array(attn(x))
    # The same projections and rotary embedding as the layer, then attention by hand.
    b, t, d = x.shape
    q, k, v = mx.split(attn.qkv(x), 3, axis=-1)
    q, k, v = (a.reshape(b, t, 2, 8).transpose(0, 2, 1, 3) for a in (q, k, v))
    q, k = attn.rope(q), attn.rope(k)
    o = naive(np.array(q, dtype=np.float64), np.array(k, dtype=np.float64),
              np.array(v, dtype=np.float64), window)
    want = np.array(attn.out(mx.array(o.transpose(0, 2, 1, 3).reshape(b, t, d),
                                      dtype=mx.float32)))
    assert np.allclose(got, want, atol=1e-5), np.abs(got - want).max()


def test_a_window_changes_what_a_late_token_sees():
    x = mx.random.normal((1, 10, 16), key=mx.random.key(4))
    full = Attention(ModelConfig(dims=16, heads=2, seq_len=10))
    local = Attention(ModelConfig(dims=16, heads=2, seq_len=10, window=4))
    local.update(full.parameters())
    a, b = np.array(full(x)), np.array(local(x))
    assert np.allclose(a[:, :4], b[:, :4], atol=1e-6)   # the first 4 see the same keys
    assert not np.allclose(a[:, 4:], b[:, 4:], atol=1e-4)


@pytest.mark.parametrize("seq_len,window", [(8, 0), (8, 2), (8, 8), (64, 5), (64, 100)])
def test_attended_keys_is_what_the_mask_lets_through(seq_len, window):
    allowed = np.array(window_mask(seq_len, window or seq_len)).sum() / seq_len
    assert attended_keys(seq_len, window) == pytest.approx(allowed)


def test_the_plan_counts_the_mask_and_less_attention():
    cfg = TrainerConfig(model=ModelConfig(dims=64, heads=4, seq_len=256))
    windowed = TrainerConfig(model=ModelConfig(dims=64, heads=4, seq_len=256, window=32))
    assert estimate(windowed, 4).compute - estimate(cfg, 4).compute == 256 ** 2
    assert estimate(windowed, 4).update == estimate(cfg, 4).update
    ratio = attention_flops_per_token(windowed) / attention_flops_per_token(cfg)
    assert ratio == pytest.approx(attended_keys(256, 32) / attended_keys(256, 0))
    assert ratio < 0.25


def test_a_windowed_model_is_the_same_with_gradient_checkpointing():
    cfg = ModelConfig(dims=16, heads=2, layers=2, seq_len=12, vocab_size=32, window=3)
    mx.random.seed(1)
    plain = Transformer(cfg)
    checkpointed = Transformer(cfg, grad_checkpoint=True)
    checkpointed.update(plain.parameters())
    tokens = mx.array(np.arange(24).reshape(2, 12) % 32)
    assert np.allclose(np.array(plain(tokens)), np.array(checkpointed(tokens)), atol=1e-5)

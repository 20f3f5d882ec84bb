"""Sliding-window attention (model.window) against attention computed naively."""

from __future__ import annotations

import math

import mlx.core as mx
import numpy as np
import pytest

from mlxops.trainer.config import ModelConfig
from mlxops.trainer.model import Attention, window_mask


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

"""The Mojo decoding kernels alone, against NumPy in float64 (each op in a small graph of its own)."""

from __future__ import annotations

import numpy as np
import pytest
from max.driver import CPU, Buffer
from max.dtype import DType
from max.engine import InferenceSession, Model
from max.graph import BufferType, DeviceRef, Graph, TensorType, ops

from max_gpt2.kernels import MOJO_PACKAGE, skinny_matmul_graph

CPU_REF = DeviceRef.CPU()
LOWEST = -1.7e38  # what `padding_bias` gives padding


@pytest.fixture(scope="module")
def session() -> InferenceSession:
    return InferenceSession(devices=[CPU()])


@pytest.fixture(scope="module")
def matmul(session) -> Model:
    return session.load(skinny_matmul_graph())


@pytest.fixture(scope="module")
def attention(session) -> Model:
    types = [
        BufferType(DType.float32, [2, "B", "H", "M", "d"], CPU_REF),
        TensorType(DType.float32, ["B", "S", "E"], CPU_REF),
        TensorType(DType.float32, ["B", "T"], CPU_REF),
    ]
    with Graph("cached_attention_alone", input_types=types, custom_extensions=[MOJO_PACKAGE]) as graph:
        cache, qkv, key_bias = graph.inputs
        batch, seq_len, _ = qkv.tensor.shape
        out = TensorType(DType.float32, [batch, seq_len, cache.shape[2] * cache.shape[4]], CPU_REF)
        graph.output(*ops.inplace_custom("gpt2_cached_attention", CPU_REF, [cache, qkv, key_bias], [out]))
    return session.load(graph)


@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 8, 11])
@pytest.mark.parametrize(("k", "n"), [(60, 180), (17, 5), (768, 2304), (3072, 97), (100, 1001)])
def test_skinny_matmul_matches_numpy(matmul, rows, k, n):
    """Every block size (1 to 8 rows of x, more in passes), K with and without a 16-lane tail."""
    rng = np.random.default_rng(rows * k + n)
    x = rng.standard_normal((rows, k), dtype=np.float32)
    w = rng.standard_normal((n, k), dtype=np.float32)
    (y,) = matmul.execute(Buffer.from_numpy(x), Buffer.from_numpy(w))
    expected = x.astype(np.float64) @ w.astype(np.float64).T
    np.testing.assert_allclose(
        y.to_numpy(), expected, rtol=0, atol=2e-6 * np.sqrt(k) * np.abs(expected).max()
    )


def attention_reference(cache, qkv, key_bias, heads):
    """The new keys and values stored, and causal softmax attention over positions 0..T-1, float64."""
    batch, seq_len, width = qkv.shape
    head_dim, total = width // 3 // heads, key_bias.shape[1]
    past = total - seq_len
    cache = cache.astype(np.float64)
    q, k, v = (
        part.reshape(batch, seq_len, heads, head_dim).transpose(0, 2, 1, 3)
        for part in np.split(qkv.astype(np.float64), 3, axis=-1)
    )
    cache[0, :, :, past:total], cache[1, :, :, past:total] = k, v
    scores = q @ cache[0, :, :, :total].transpose(0, 1, 3, 2) / np.sqrt(head_dim) + key_bias[:, None, None]
    future = np.arange(total)[None, :] > past + np.arange(seq_len)[:, None]  # [S, T]
    scores = np.where(future, -np.inf, scores)
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    weights /= weights.sum(-1, keepdims=True)
    out = (weights @ cache[1, :, :, :total]).transpose(0, 2, 1, 3).reshape(batch, seq_len, heads * head_dim)
    return out, cache


@pytest.mark.parametrize(
    ("batch", "new", "total", "cache_len", "heads", "head_dim"),
    [
        (1, 1, 1, 4, 2, 16),  # the first token
        (1, 1, 160, 200, 12, 64),  # a GPT-2 small decoding step
        (3, 1, 9, 12, 5, 12),  # a batch of steps, head_dim below one register
        (2, 4, 7, 7, 3, 20),  # several new tokens after a past, cache exactly full
        (2, 6, 6, 10, 4, 64),  # a whole prompt
        (16, 1, 300, 300, 12, 64),  # enough work for both threads
    ],
)
def test_cached_attention_matches_numpy(attention, batch, new, total, cache_len, heads, head_dim):
    """Writes exactly the new positions, and attends causally, skipping padding (key bias)."""
    rng = np.random.default_rng(total * batch + new)
    cache = rng.standard_normal((2, batch, heads, cache_len, head_dim), dtype=np.float32)
    qkv = rng.standard_normal((batch, new, 3 * heads * head_dim), dtype=np.float32)
    key_bias = np.where(rng.random((batch, total)) < 0.3, LOWEST, 0).astype(np.float32)
    key_bias[:, total - new :] = 0  # the new tokens are real
    expected, expected_cache = attention_reference(cache, qkv, key_bias, heads)
    written = Buffer.from_numpy(cache.copy())
    (out,) = attention.execute(written, Buffer.from_numpy(qkv), Buffer.from_numpy(key_bias))
    np.testing.assert_allclose(out.to_numpy(), expected, rtol=0, atol=2e-6)
    np.testing.assert_array_equal(written.to_numpy()[..., :total, :], expected_cache[..., :total, :])
    np.testing.assert_array_equal(written.to_numpy()[..., total:, :], cache[..., total:, :])


def test_cached_attention_refuses_inconsistent_shapes(attention):
    cache = Buffer.from_numpy(np.zeros((2, 1, 2, 4, 8), np.float32))
    qkv = Buffer.from_numpy(np.zeros((1, 1, 48), np.float32))
    too_long = Buffer.from_numpy(np.zeros((1, 5), np.float32))  # 5 positions, a cache of 4
    with pytest.raises(Exception, match="total <= cache length"):
        attention.execute(cache, qkv, too_long)

"""The Mojo decoding kernels alone, against NumPy in float64 (each op in a small graph of its own)."""

from __future__ import annotations

import numpy as np
import pytest
from max.driver import CPU, Buffer
from max.dtype import DType
from max.engine import InferenceSession, Model
from max.graph import BufferType, DeviceRef, Graph, TensorType, ops

from max_gpt2.kernels import MOJO_PACKAGE, skinny_matmul_graph
from max_gpt2.model import weight_formats as wf
from max_gpt2.model.dtypes import bfloat16_bits_to_float32, float32_to_bfloat16_bits

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


@pytest.fixture(scope="module")
def packed(session) -> Model:
    """The three packed matmuls and the two dequantize ops in one graph (one compile)."""
    x = TensorType(DType.float32, ["M", "K"], CPU_REF)
    bf16 = TensorType(DType.bfloat16, ["N", "K"], CPU_REF)
    q8 = TensorType(DType.int8, ["G", "K8"], CPU_REF)
    q4 = TensorType(DType.uint8, ["G", "K4"], CPU_REF)
    scales = TensorType(DType.float16, ["G", "Kb8"], CPU_REF)
    rows = TensorType(DType.float32, ["N"], CPU_REF)  # only its length, N, is read
    types = [x, bf16, q8, scales, q4, scales, rows]
    with Graph("packed_matmuls_alone", input_types=types, custom_extensions=[MOJO_PACKAGE]) as graph:
        x, bf16, q8, q8_scales, q4, q4_scales, rows = (value.tensor for value in graph.inputs)
        product = TensorType(DType.float32, [x.shape[0], rows.shape[0]], CPU_REF)
        weight = TensorType(DType.float32, [rows.shape[0], x.shape[1]], CPU_REF)
        outputs = [
            *ops.custom("packed_matmul_bf16", CPU_REF, [x, bf16], [product]),
            *ops.custom("packed_matmul_q8_0", CPU_REF, [x, q8, q8_scales], [product]),
            *ops.custom("packed_matmul_q4_0", CPU_REF, [x, q4, q4_scales], [product]),
            *ops.custom("dequantize_q8_0", CPU_REF, [q8, q8_scales], [weight]),
            *ops.custom("dequantize_q4_0", CPU_REF, [q4, q4_scales], [weight]),
        ]
        graph.output(*outputs)
    return session.load(graph)


def quantized_activations(x: np.ndarray) -> np.ndarray:
    """What the q8_0 and q4_0 kernels multiply by: x in blocks of 32, each rounded to int8 steps of
    its largest magnitude / 127 (llama.cpp's q8_0 for activations), float64 [M, K]."""
    blocks = np.zeros((x.shape[0], -(-x.shape[1] // wf.BLOCK) * wf.BLOCK), np.float32)
    blocks[:, : x.shape[1]] = x
    blocks = blocks.reshape(x.shape[0], -1, wf.BLOCK)
    largest = np.abs(blocks).max(axis=-1, keepdims=True)
    inverse = np.divide(np.float32(127), largest, out=np.zeros_like(largest), where=largest != 0)
    steps = np.rint(blocks * inverse).astype(np.float64)
    return (steps * (largest.astype(np.float64) / 127)).reshape(x.shape[0], -1)[:, : x.shape[1]]


@pytest.mark.parametrize("rows", [1, 3, 8, 11])
@pytest.mark.parametrize(
    ("k", "n"), [(32, 8), (17, 5), (33, 9), (60, 180), (100, 1001), (768, 2304), (3072, 97), (64, 50257)]
)
def test_packed_matmuls_match_numpy_on_the_weights_they_store(packed, rows, k, n):
    """Each format against float64 on the weights it stores: K with a block tail or none, N with
    every remainder of a group of 8 rows, x's rows one to more than a register block."""
    rng = np.random.default_rng(rows * k + n)
    x = rng.standard_normal((rows, k), dtype=np.float32)
    w = rng.standard_normal((n, k), dtype=np.float32)
    bits = float32_to_bfloat16_bits(w)
    q8_values, q8_scales = wf.quantize_q8_0(w)
    q4_values, q4_scales = wf.quantize_q4_0(w)
    inputs = [
        Buffer.from_numpy(x),
        Buffer.from_numpy(bits).view(DType.bfloat16),
        *map(Buffer.from_numpy, wf.interleave(q8_values, q8_scales, "q8_0")),
        *map(Buffer.from_numpy, wf.interleave(q4_values, q4_scales, "q4_0")),
        Buffer.from_numpy(np.zeros(n, np.float32)),
    ]
    y_bf16, y_q8, y_q4, w_q8, w_q4 = (out.to_numpy() for out in packed.execute(*inputs))
    stored = {
        "q8_0": wf.dequantize(q8_values, q8_scales, "q8_0", k),
        "q4_0": wf.dequantize(q4_values, q4_scales, "q4_0", k),
    }
    np.testing.assert_array_equal(w_q8, stored["q8_0"])
    np.testing.assert_array_equal(w_q4, stored["q4_0"])
    x_steps = quantized_activations(x)
    cases = [
        (y_bf16, x.astype(np.float64), bfloat16_bits_to_float32(bits)),
        (y_q8, x_steps, stored["q8_0"]),
        (y_q4, x_steps, stored["q4_0"]),
    ]
    for got, activations, weight in cases:
        expected = activations @ weight.astype(np.float64).T
        np.testing.assert_allclose(got, expected, rtol=0, atol=2e-6 * np.sqrt(k) * np.abs(expected).max())


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

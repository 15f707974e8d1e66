"""The compiled MAX attention against the NumPy reference, on CPU."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from max.driver import CPU
from max.dtype import DType
from max.experimental.nn import Module
from max.experimental.tensor import Tensor, TensorType

from max_gpt2 import causal_mask
from max_gpt2.testing import random_attention_weights
from max_gpt2.verify import check
from tests.support import (
    CPU_LAYOUTS,
    ODD,
    SEQ_LENS,
    layout_id,
    random_input,
)


@pytest.mark.parametrize("config", CPU_LAYOUTS, ids=layout_id)
@pytest.mark.parametrize("seq_len", SEQ_LENS)
@pytest.mark.parametrize("batch", [1, 2, 3, 4])
def test_matches_reference(compiled, config, batch, seq_len):
    weights = random_attention_weights(config, seed=seq_len)
    attention = compiled(config).with_weights(weights)
    x = random_input(batch, seq_len, config.n_embd)
    result = attention(x)
    assert result.shape == x.shape and result.dtype == np.float32
    comparison = check(result, x, weights, config.n_head, "float32")
    assert comparison.passed, comparison


# float16 on CPU computes through the same graph ops; it is left to the GPU tests (a compile each).
@pytest.mark.parametrize("dtype", ["bfloat16"])
@pytest.mark.parametrize("seq_len", [1, 7, 129])
def test_low_precision_on_cpu_matches_reference(compiled, dtype, seq_len):
    weights = random_attention_weights(ODD, seed=3)
    attention = compiled(ODD, dtype).with_weights(weights)
    x = random_input(2, seq_len, ODD.n_embd)
    comparison = check(attention(x), x, weights, ODD.n_head, dtype)
    assert comparison.passed, comparison


@settings(max_examples=25, deadline=None)
@given(
    batch=st.integers(1, 4),
    seq_len=st.integers(1, 40),
    seed=st.integers(0, 2**32 - 1),
    scale=st.floats(0.01, 30.0),  # up to scores in the thousands, where rounding grows
)
def test_matches_reference_on_random_shapes_and_scales(compiled, batch, seq_len, seed, scale):
    weights = random_attention_weights(ODD, seed=seed)
    x = scale * random_input(batch, seq_len, ODD.n_embd, seed=seed)
    result = compiled(ODD).with_weights(weights)(x)
    comparison = check(result, x, weights, ODD.n_head, "float32")
    assert comparison.passed, comparison


@pytest.mark.parametrize("position", [0, 1, 10, 23])
def test_changing_a_token_leaves_earlier_outputs_unchanged(compiled, position):
    attention = compiled(ODD)
    x = random_input(2, 24, ODD.n_embd)
    changed = x.copy()
    changed[:, position] += 5.0 * random_input(2, 1, ODD.n_embd, seed=9)[:, 0]
    before, after = attention(x), attention(changed)
    np.testing.assert_array_equal(after[:, :position], before[:, :position])
    # The changed token itself must see the change, or this test could not fail.
    assert not np.allclose(after[:, position], before[:, position])


def test_heads_are_independent(compiled):
    # Zeroing one head's value columns must zero exactly that head's slice of the merged
    # output (seen through an identity output projection), and leave every other slice alone.
    config = ODD
    weights = random_attention_weights(config, seed=7)
    weights["c_proj.weight"] = np.eye(config.n_embd, dtype=np.float32)
    weights["c_proj.bias"] = np.zeros(config.n_embd, dtype=np.float32)
    silenced = {name: value.copy() for name, value in weights.items()}
    head = slice(2 * config.head_dim, 3 * config.head_dim)  # head 2's value columns
    values = slice(2 * config.n_embd, 3 * config.n_embd)
    silenced["c_attn.weight"][values][head] = 0
    silenced["c_attn.bias"][values][head] = 0
    x = random_input(2, 9, config.n_embd)
    base = compiled(config).with_weights(weights)(x)
    quiet = compiled(config).with_weights(silenced)(x)
    np.testing.assert_allclose(quiet[..., head], 0, atol=1e-6)
    np.testing.assert_array_equal(np.delete(quiet, np.r_[head], -1), np.delete(base, np.r_[head], -1))


class _Masks(Module):
    """Graph exposing causal_mask with static and symbolic lengths."""

    def forward(self, queries: Tensor, cached: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        seq_len = queries.shape[0]
        return tuple(
            causal_mask(seq_len, past_len, DType.float32, CPU()) for past_len in (0, 3, cached.shape[0])
        )


@pytest.fixture(scope="module")
def masks():
    run = _Masks().compile(
        TensorType(DType.float32, ("seq",), device=CPU()), TensorType(DType.float32, ("past",), device=CPU())
    )

    def masks_for(seq_len: int, past_len: int) -> list[np.ndarray]:
        outputs = run(
            Tensor.from_dlpack(np.zeros(seq_len, np.float32)),
            Tensor.from_dlpack(np.zeros(past_len, np.float32)),
        )
        return [np.from_dlpack(output) for output in outputs]

    return masks_for


def expected_mask(seq_len: int, past_len: int) -> np.ndarray:
    query = past_len + np.arange(seq_len)[:, None]
    key = np.arange(past_len + seq_len)[None, :]
    return np.where(key > query, -np.inf, 0.0).astype(np.float32)


@pytest.mark.parametrize(("seq_len", "past_len"), [(1, 0), (4, 0), (5, 2), (1, 6), (3, 1)])
def test_causal_mask_values_and_shape(masks, seq_len, past_len):
    no_past, static_past, symbolic_past = masks(seq_len, past_len)
    assert no_past.shape == (seq_len, seq_len)
    np.testing.assert_array_equal(no_past, expected_mask(seq_len, 0))
    np.testing.assert_array_equal(static_past, expected_mask(seq_len, 3))
    assert symbolic_past.shape == (seq_len, past_len + seq_len)
    np.testing.assert_array_equal(symbolic_past, expected_mask(seq_len, past_len))


def test_causal_mask_small_case_spelled_out(masks):
    inf = np.inf
    np.testing.assert_array_equal(masks(2, 1)[2], np.array([[0, 0, -inf], [0, 0, 0]], dtype=np.float32))

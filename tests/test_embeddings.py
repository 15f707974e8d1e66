"""Embeddings: the hidden states against the float64 reference, pooled and normalised by this test's own
arithmetic (served: test_serve_embeddings.py)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from max_gpt2 import reference
from max_gpt2.inference.embeddings import Pooling, embed, normalized
from max_gpt2.verify import compare
from tests.support import LM, left_padding, prompts


def expected_hidden(weights, ids, mask):
    run = reference.lm_forward(ids, weights, LM, mask)
    return run.hidden, run.largest_score


def test_hidden_states_match_the_reference(compiled_lm, lm_weights):
    lm, ids, mask = compiled_lm(LM), prompts(LM, 3, 11, seed=5), left_padding(3, 11)
    expected, largest_score = expected_hidden(lm_weights(LM), ids, mask)
    hidden = lm.hidden_states(ids, mask)
    assert hidden.shape == (3, 11, LM.n_embd) and hidden.dtype == np.float32
    real = mask.astype(bool)
    comparison = compare(hidden[real], expected[real], "float32", largest_score)
    assert comparison.passed, comparison


@pytest.mark.parametrize("pooling", list(Pooling))
def test_embeddings_pool_the_reference_states(compiled_lm, lm_weights, pooling):
    """The last token's state or the mean over the real tokens, divided by its Euclidean length."""
    lm, ids, mask = compiled_lm(LM), prompts(LM, 3, 9, seed=6), left_padding(3, 9)
    hidden, _ = expected_hidden(lm_weights(LM), ids, mask)
    if pooling is Pooling.LAST:
        pooled = hidden[:, -1]
    else:
        pooled = np.stack([hidden[row, mask[row] == 1].mean(axis=0) for row in range(3)])
    expected = pooled / np.sqrt((pooled**2).sum(axis=1, keepdims=True))
    vectors = embed(lm, ids, mask, pooling)
    assert vectors.shape == (3, LM.n_embd) and vectors.dtype == np.float32
    np.testing.assert_allclose(vectors, expected, atol=2e-5)
    as_is = embed(lm, ids, mask, pooling, norm=-1)
    np.testing.assert_allclose(as_is, pooled, rtol=1e-4, atol=1e-4)


def test_a_text_embeds_the_same_alone_and_padded_in_a_batch(compiled_lm):
    lm, ids, mask = compiled_lm(LM), prompts(LM, 3, 10, seed=7), left_padding(3, 10)
    for pooling in Pooling:
        batched = embed(lm, ids, mask, pooling)
        for row in range(3):
            alone = embed(lm, ids[row : row + 1, 2 * row :], pooling=pooling)[0]
            np.testing.assert_allclose(batched[row], alone, atol=1e-5, err_msg=f"{pooling} row {row}")


def test_right_padding_is_refused(compiled_lm):
    mask = np.array([[1, 1, 1, 0]])
    with pytest.raises(ValueError, match=r"rows \[0\] end in padding: .* pad prompts on the left"):
        embed(compiled_lm(LM), prompts(LM, 1, 4), mask)


def test_packed_weights_embed_near_float32(compiled_lm):
    """q8_0's projections and head (the hidden graph through the packed kernels) point nearly the same way
    as float32's."""
    ids = prompts(LM, 2, 12, seed=8)
    exact = embed(compiled_lm(LM), ids)
    packed = embed(compiled_lm(LM, weights="q8_0"), ids)
    cosines = (exact * packed).sum(axis=1)
    assert (cosines > 0.999).all(), cosines


@settings(max_examples=60, deadline=None)
@given(
    vectors=arrays(np.float32, (3, 8), elements=st.floats(-1e3, 1e3, width=32)),
    norm=st.sampled_from([-1, 0, 1, 2, 3, 5]),
)
def test_normalized_is_llama_cpps_embd_normalize(vectors, norm):
    result = normalized(vectors, norm)
    for row, out in zip(vectors.astype(np.float64), result, strict=True):
        if norm == -1:
            np.testing.assert_array_equal(out, row.astype(np.float32))
            continue
        size = np.abs(row).max() / 32760.0 if norm == 0 else np.linalg.norm(row, ord=norm)
        expected = row / size if size > 0 else np.zeros_like(row)
        np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-6 * max(1.0, np.abs(expected).max()))


@pytest.mark.parametrize("norm", [-2, 1.5])
def test_a_norm_llama_cpp_does_not_have_is_refused(norm):
    with pytest.raises(ValueError, match=rf"norm: -1 \(none\), 0 .* got {norm}"):
        normalized(np.ones((1, 4), np.float32), norm)

"""Choosing the next token: greedy, temperature, top-k and top-p, on logits made up here."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from max_gpt2.inference.sampling import Sampler, softmax

logit_rows = arrays(
    np.float64, st.tuples(st.integers(1, 3), st.integers(2, 40)), elements=st.floats(-20, 20, width=32)
)


def test_greedy_takes_the_largest_logit():
    logits = np.array([[0.1, 3.0, -1.0, 2.9], [5.0, 0.0, 0.0, 5.0]])
    np.testing.assert_array_equal(Sampler()(logits, Sampler().generator()), [1, 0])  # ties: the first


@given(logit_rows, st.integers(1, 10), st.integers(0, 2**32))
@settings(max_examples=60, deadline=None)
def test_top_k_never_picks_outside_the_k_largest(logits, top_k, seed):
    sampler = Sampler(do_sample=True, top_k=top_k, seed=seed)
    rng = sampler.generator()
    kth_largest = np.sort(logits, axis=-1)[:, ::-1][:, min(top_k, logits.shape[-1]) - 1]
    for _ in range(5):
        tokens = sampler(logits, rng)
        assert (logits[np.arange(len(tokens)), tokens] >= kth_largest).all()


@given(logit_rows, st.floats(0.05, 1.0), st.floats(0.3, 3.0), st.integers(0, 2**32))
@settings(max_examples=60, deadline=None)
def test_top_p_never_picks_outside_the_nucleus(logits, top_p, temperature, seed):
    """The nucleus: the most likely tokens whose mass, without the last one added, is below top_p."""
    sampler = Sampler(do_sample=True, top_p=top_p, temperature=temperature, seed=seed)
    probabilities = softmax(logits / temperature)
    rng = sampler.generator()
    for _ in range(5):
        tokens = sampler(logits, rng)
        chosen = probabilities[np.arange(len(tokens)), tokens]
        more_likely_mass = np.where(probabilities > chosen[:, None], probabilities, 0).sum(axis=-1)
        assert (more_likely_mass < top_p + 1e-12).all()


def test_top_p_keeps_the_token_that_crosses_the_threshold():
    logits = np.log(np.array([[0.5, 0.3, 0.15, 0.05]]))
    allowed = np.isfinite(Sampler(do_sample=True, top_p=0.7).candidates(logits))
    np.testing.assert_array_equal(allowed, [[True, True, False, False]])
    allowed = np.isfinite(Sampler(do_sample=True, top_p=0.5).candidates(logits))
    np.testing.assert_array_equal(allowed, [[True, False, False, False]])


def test_top_k_then_top_p_as_hugging_face_orders_them():
    logits = np.log(np.array([[0.4, 0.3, 0.2, 0.1]]))
    # top_k=2 renormalises to 4/7 and 3/7; top_p=0.5 then keeps only the first.
    allowed = np.isfinite(Sampler(do_sample=True, top_k=2, top_p=0.5).candidates(logits))
    np.testing.assert_array_equal(allowed, [[True, False, False, False]])


def test_same_seed_same_tokens_and_the_distribution_is_followed():
    logits = np.log(np.array([[0.7, 0.2, 0.1]] * 4000))
    sampler = Sampler(do_sample=True, seed=7)
    first = sampler(logits, sampler.generator())
    np.testing.assert_array_equal(first, sampler(logits, sampler.generator()))
    np.testing.assert_allclose(np.bincount(first, minlength=3) / len(first), [0.7, 0.2, 0.1], atol=0.03)


def test_temperature_sharpens_and_flattens():
    logits = np.log(np.array([[0.6, 0.4]] * 4000))
    for temperature, expected in [(0.5, 0.6**2 / (0.6**2 + 0.4**2)), (2.0, 0.6**0.5 / (0.6**0.5 + 0.4**0.5))]:
        sampler = Sampler(do_sample=True, temperature=temperature, seed=1)
        share = (sampler(logits, sampler.generator()) == 0).mean()
        assert share == pytest.approx(expected, abs=0.03)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"temperature": 0.0}, "temperature must be a positive number, got 0.0"),
        ({"temperature": True}, "temperature must be a positive number, got True"),
        ({"top_k": 2.5}, "top_k must be a positive integer or None, got 2.5"),
        ({"top_p": 0.0}, r"top_p must be a number in \(0, 1\] or None, got 0.0"),
    ],
)
def test_bad_settings(options, message):
    with pytest.raises(ValueError, match=message):
        Sampler(do_sample=True, **options)

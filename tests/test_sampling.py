"""Choosing the next token: greedy, temperature, top-k, top-p and min-p, and the logits controls
(penalties, n-gram bans, biases) with the history of tokens they read, on logits made up here."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from max_gpt2.inference.context_shift import kept_tail
from max_gpt2.inference.sampling import Sampler, softmax
from max_gpt2.inference.token_history import TokenHistory
from tests.support import looped_controls

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
        ({"temperature": 0.0}, "temperature must be a positive finite number, got 0.0"),
        ({"temperature": True}, "temperature must be a positive finite number, got True"),
        ({"temperature": float("inf")}, "temperature must be a positive finite number, got inf"),
        ({"seed": -1}, r"seed must be an integer of 0 or more, or None, got -1"),
        ({"seed": 1.5}, r"seed must be an integer of 0 or more, or None, got 1.5"),
        ({"top_k": 2.5}, "top_k must be a positive integer or None, got 2.5"),
        ({"top_p": 0.0}, r"top_p must be a number in \(0, 1\] or None, got 0.0"),
        ({"min_p": 1.5}, r"min_p must be a number in \[0, 1\] or None, got 1.5"),
        ({"repetition_penalty": 0}, r"repetition_penalty must be a positive number \(1: none\), got 0"),
        ({"no_repeat_ngram_size": -1}, r"no_repeat_ngram_size must be an integer of 0 \(none\) or more"),
        ({"frequency_penalty": 2.5}, r"frequency_penalty must be a number in \[-2, 2\], got 2.5"),
        ({"presence_penalty": -3}, r"presence_penalty must be a number in \[-2, 2\], got -3"),
        ({"logit_bias": {5: 101}}, r"logit_bias must map token ids to numbers in \[-100, 100\]"),
        ({"logit_bias": {-1: 1}}, r"logit_bias must map token ids to numbers in \[-100, 100\]"),
    ],
)
def test_bad_settings(options, message):
    with pytest.raises(ValueError, match=message):
        Sampler(do_sample=True, **options)


@given(logit_rows, st.floats(0.0, 1.0), st.floats(0.3, 3.0))
@settings(max_examples=60, deadline=None)
def test_min_p_keeps_the_tokens_at_least_min_p_times_as_likely_as_the_top_one(logits, min_p, temperature):
    kept = np.isfinite(Sampler(do_sample=True, min_p=min_p, temperature=temperature).candidates(logits))
    probabilities = softmax(logits / temperature)
    threshold = min_p * probabilities.max(axis=-1, keepdims=True)
    np.testing.assert_array_equal(kept, probabilities >= threshold)


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    repetition=st.floats(0.5, 2.0),
    frequency=st.floats(-2.0, 2.0),
    presence=st.floats(-2.0, 2.0),
    ngram=st.integers(0, 3),
)
def test_controls_over_a_batch_equal_the_controls_token_by_token(
    seed, repetition, frequency, presence, ngram
):
    """Each row of a left-padded batch, after several steps, against the controls applied one token at a
    time to its own tokens (padding is no token)."""
    rng = np.random.default_rng(seed)
    vocab, batch = 12, 3
    sampler = Sampler(
        repetition_penalty=repetition,
        frequency_penalty=frequency,
        presence_penalty=presence,
        no_repeat_ngram_size=ngram,
        logit_bias={3: 2.5, 7: -100},
    )
    ids = rng.integers(0, vocab, (batch, 6))
    mask = (np.arange(6)[None, :] >= np.array([[0], [2], [5]])).astype(np.int64)
    history = sampler.history(ids, mask, vocab)
    generated = rng.integers(0, vocab, (batch, 5))
    for step in range(5):
        logits = (rng.standard_normal((batch, vocab)) * 4).astype(np.float32)
        got = sampler.controlled(logits, history)
        for row in range(batch):
            prompt = ids[row][mask[row] == 1].tolist()
            expected = looped_controls(logits[row], prompt, generated[row, :step].tolist(), sampler)
            np.testing.assert_allclose(got[row], expected, rtol=1e-5, atol=1e-4)
        history.append(generated[:, step])


def test_a_reordered_history_gives_each_row_its_parents_past():
    ids = np.array([[1, 2, 3], [4, 5, 6]])
    history = TokenHistory(ids, np.ones_like(ids), vocab=8, ngram_size=2)
    history.append(np.array([2, 6]))
    moved = history.reordered(np.array([1, 1]))
    moved.append(np.array([5, 6]))
    assert moved.tokens == [[4, 5, 6, 6, 5], [4, 5, 6, 6, 6]]
    # What followed each row's last token before, in its own past only (a shared table would mix them).
    assert moved.banned_ngrams() == [(6,), (6, 6)]
    np.testing.assert_array_equal(moved.generated.sum(axis=1), [2, 2])
    assert history.tokens[0] == [1, 2, 3, 2]  # row 0 untouched by its copies


def test_the_kept_tail_is_each_rows_last_real_tokens_left_padded():
    ids = np.array([[0, 0, 5, 6], [1, 2, 3, 4]])
    mask = np.array([[0, 0, 1, 1], [1, 1, 1, 1]])
    tail, tail_mask = kept_tail(ids, mask, np.array([[7, 8], [9, 10]]), keep=5)
    np.testing.assert_array_equal(tail, [[0, 5, 6, 7, 8], [2, 3, 4, 9, 10]])
    np.testing.assert_array_equal(tail_mask, [[0, 1, 1, 1, 1], [1, 1, 1, 1, 1]])

"""Generation on the compiled language model: greedy against the reference, sampling, stopping at
end-of-text, and options refused before any work."""

from __future__ import annotations

import numpy as np
import pytest

from max_gpt2 import Sampler, reference
from tests.support import LM, LM_ONE_LAYER, left_padding, prompts


def test_a_left_padded_row_generates_what_it_generates_alone(compiled_lm):
    lm = compiled_lm(LM)
    ids, mask = prompts(LM, 3, 8, seed=6), left_padding(3, 8)
    batched = lm.generate(ids, 15, mask)
    assert batched.shape == (3, 8 + 15) and batched.dtype == np.int64
    np.testing.assert_array_equal(batched[:, :8], ids)
    for row in range(3):
        alone = lm.generate(ids[row : row + 1, 2 * row :], 15)
        np.testing.assert_array_equal(alone[0], batched[row, 2 * row :])


def test_generation_fills_the_context(compiled_lm):
    lm = compiled_lm(LM_ONE_LAYER)
    ids = prompts(LM_ONE_LAYER, 2, 3)
    out = lm.generate(ids, LM_ONE_LAYER.n_positions - 3)
    assert out.shape == (2, LM_ONE_LAYER.n_positions)
    np.testing.assert_array_equal(out, lm.generate(ids, LM_ONE_LAYER.n_positions - 3))


def test_greedy_is_argmax_of_the_reference(compiled_lm, lm_weights):
    """Token by token, greedy decoding picks the reference's most likely next token."""
    lm, weights = compiled_lm(LM), lm_weights(LM)
    out = lm.generate(prompts(LM, 2, 4, seed=8), 6)
    expected, _ = reference.lm_logits_and_largest_score(out[:, :-1], weights, LM)
    np.testing.assert_array_equal(np.argmax(expected[:, 3:], axis=-1), out[:, 4:])


# Sampling and stopping.


def test_sampling_is_seeded(compiled_lm):
    lm = compiled_lm(LM)
    ids = prompts(LM, 2, 5)
    first = lm.generate(ids, 10, sampler=Sampler(do_sample=True, temperature=1.5, seed=3))
    np.testing.assert_array_equal(
        first, lm.generate(ids, 10, sampler=Sampler(do_sample=True, temperature=1.5, seed=3))
    )
    assert not np.array_equal(
        first, lm.generate(ids, 10, sampler=Sampler(do_sample=True, temperature=1.5, seed=4))
    )
    assert not np.array_equal(first, lm.generate(ids, 10))


def test_top_k_one_is_greedy(compiled_lm):
    lm = compiled_lm(LM)
    ids = prompts(LM, 2, 5)
    np.testing.assert_array_equal(
        lm.generate(ids, 8, sampler=Sampler(do_sample=True, top_k=1, seed=0)), lm.generate(ids, 8)
    )


def test_sampled_tokens_stay_in_the_top_k(compiled_lm):
    lm = compiled_lm(LM)
    for step in lm.stream(
        prompts(LM, 3, 4), 10, sampler=Sampler(do_sample=True, temperature=3.0, top_k=4, seed=1)
    ):
        top = np.argsort(-step.logits, axis=-1)[:, :4]
        assert all(token in allowed for token, allowed in zip(step.tokens, top, strict=True))


def test_a_finished_row_keeps_producing_eos(compiled_lm):
    lm = compiled_lm(LM)
    ids = prompts(LM, 2, 5, seed=1)
    greedy = lm.generate(ids, 12)
    eos = int(greedy[0, 5 + 3])  # a token row 0 produces by its fourth step
    expected = greedy.copy()
    for row in expected:  # each row as greedy made it, up to its first eos; eos after that
        if (hits := np.flatnonzero(row[5:] == eos)).size:
            row[5 + hits[0] :] = eos
    np.testing.assert_array_equal(lm.generate(ids, 12, eos_token_id=eos), expected)


def test_several_eos_ids_each_end_a_row(compiled_lm):
    """eos_token_id as a list, as Hugging Face configs may hold it: a row ends at whichever comes first."""
    lm = compiled_lm(LM)
    ids = prompts(LM, 2, 5, seed=1)
    greedy = lm.generate(ids, 12)
    eos = [int(greedy[0, 5 + 3]), int(greedy[1, 5 + 1])]
    expected = greedy.copy()
    for row in expected:  # as greedy made it, up to its first end-of-text id, which then repeats
        if (hits := np.flatnonzero(np.isin(row[5:], eos))).size:
            row[5 + hits[0] :] = row[5 + hits[0]]
    assert not np.array_equal(expected, greedy)
    np.testing.assert_array_equal(lm.generate(ids, 12, eos_token_id=eos), expected)


def test_generation_stops_once_every_row_has_finished(compiled_lm):
    lm = compiled_lm(LM)
    ids = prompts(LM, 1, 5, seed=1)
    eos = int(lm.generate(ids, 1)[0, -1])  # the first token greedy decoding produces
    assert len(list(lm.stream(ids, 20, eos_token_id=eos))) == 1
    np.testing.assert_array_equal(lm.generate(ids, 20, eos_token_id=eos)[0, 5:], np.full(20, eos))


# Bad options.


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        ({"max_new_tokens": 0}, ValueError, "max_new_tokens must be positive, got 0"),
        ({"max_new_tokens": 2.0}, TypeError, "max_new_tokens must be an integer, got 2.0"),
        (
            {"max_new_tokens": 46},
            ValueError,
            r"3 prompt tokens \+ 46 new tokens = 49 positions, .*n_positions=48",
        ),
        ({"eos_token_id": 320}, ValueError, r"eos_token_id must be a token id in 0..319, .*; got 320"),
        (
            {"eos_token_id": [5, 320]},
            ValueError,
            r"eos_token_id must be a token id in 0..319, .*; got \[5, 320\]",
        ),
        (
            {"attention_mask": [[1, 1, 0]]},
            ValueError,
            r"rows \[0\] end in padding: .* pad prompts on the left",
        ),
    ],
)
def test_bad_generation_options_are_refused_before_any_work(compiled_lm, options, error, message):
    lm = compiled_lm(LM)
    arguments = {"input_ids": [[1, 2, 3]], "max_new_tokens": 4} | options
    with pytest.raises(error, match=message):
        lm.stream(**arguments)  # raises at the call, not at the first step
    with pytest.raises(error, match=message):
        lm.generate(**arguments)


def test_a_sampler_must_be_a_sampler(compiled_lm):
    with pytest.raises(TypeError, match="sampler must be a Sampler, got dict"):
        compiled_lm(LM).stream([[1, 2, 3]], 4, sampler={"temperature": 0.5})

"""Generation's controls on the compiled language model, against loops written here over the float64
reference: penalties and biases, a minimum length, stop strings, several sequences a prompt, the
context shift past n_positions, and beam search's cache reorder. (Against Hugging Face's `generate`:
tests/test_peers.py.)"""

from __future__ import annotations

import numpy as np
import pytest

from max_gpt2 import Sampler, load_tokenizer, reference
from max_gpt2.inference.stop_strings import StopTextStream, cut
from max_gpt2.inference.tokenizer import token_bytes
from tests.support import BANNED, LM, looped_controls, prompts


def reference_greedy(weights, prompt, steps, sampler=None, eos=(), min_new_tokens=0):
    """Greedy decoding of one prompt (ids [S]) recomputing the float64 reference's logits every step,
    with the controls applied token by token (`looped_controls`) and `eos` banned before
    `min_new_tokens`."""
    sampler, tokens = sampler or Sampler(), list(prompt)
    for step in range(steps):
        logits, _ = reference.lm_logits_and_largest_score(np.array([tokens]), weights, LM)
        row = looped_controls(logits[0, -1], list(prompt), tokens[len(prompt) :], sampler)
        if step < min_new_tokens:
            row[list(eos)] = BANNED
        tokens.append(int(np.argmax(row)))
    return np.array(tokens)


@pytest.mark.parametrize(
    "sampler",
    [
        Sampler(frequency_penalty=1.5),
        Sampler(presence_penalty=2.0),
        Sampler(logit_bias={7: 6.0, 11: -100}),
        Sampler(repetition_penalty=1.8, no_repeat_ngram_size=2, frequency_penalty=0.3),
    ],
    ids=["frequency", "presence", "logit_bias", "all"],
)
def test_controlled_greedy_equals_a_greedy_loop_over_the_reference(compiled_lm, lm_weights, sampler):
    lm, weights = compiled_lm(LM), lm_weights(LM)
    ids = prompts(LM, 2, 4, seed=8)
    got = lm.generate(ids, 10, sampler=sampler)
    for row in range(2):
        np.testing.assert_array_equal(got[row], reference_greedy(weights, ids[row], 10, sampler))
    assert not np.array_equal(got, lm.generate(ids, 10))  # the controls changed something


def test_end_of_text_is_banned_until_min_new_tokens(compiled_lm, lm_weights):
    lm, weights = compiled_lm(LM), lm_weights(LM)
    ids = prompts(LM, 1, 5, seed=1)
    eos = int(lm.generate(ids, 2)[0, -1])  # greedy produces it at the second step
    got = lm.generate(ids, 10, eos_token_id=eos, min_new_tokens=6)
    assert eos not in got[0, 5 : 5 + 6].tolist()
    expected = reference_greedy(weights, ids[0], 10, eos=(eos,), min_new_tokens=6)
    end = 5 + np.flatnonzero(expected[5:] == eos)[0] + 1 if eos in expected[5:] else expected.size
    np.testing.assert_array_equal(got[0, :end], expected[:end])


# Stop strings.


def first_completed(tokenizer, new_ids, string: str) -> int | None:
    """The index of the token whose bytes complete the first occurrence of `string`, searching the
    whole text again after each token."""
    text = b""
    for index, id_ in enumerate(new_ids):
        text += token_bytes(tokenizer, int(id_))
        if string.encode() in text:
            return index
    return None


def stop_cases(tokenizer, new_ids) -> dict[str, str]:
    """Stop strings for the greedy tokens `new_ids`: inside one token, across two, the first token, none."""
    pieces = [token_bytes(tokenizer, int(id_)).decode("utf-8", "replace") for id_ in new_ids]
    text = "".join(pieces)
    inside = next(
        piece[1:-1]
        for i, piece in enumerate(pieces)
        if len(piece) >= 3 and piece[1:-1] not in "".join(pieces[:i])
    )
    across = next(
        pieces[i][-1] + pieces[i + 1][0]
        for i in range(1, len(pieces) - 1)
        if (pieces[i][-1] + pieces[i + 1][0]) not in "".join(pieces[: i + 1])
    )
    assert "|never|" not in text
    return {"inside": inside, "across": across, "first": pieces[0], "never": "|never|"}


@pytest.mark.parametrize("case", ["inside", "across", "first", "never"])
def test_a_stop_string_ends_generation_at_the_token_that_completes_it(compiled_lm, lm_checkpoint, case):
    lm, tokenizer = compiled_lm(LM), load_tokenizer(lm_checkpoint(LM))
    ids = np.array([tokenizer.encode("The cat sat").ids])
    seq = ids.shape[1]
    sampler = Sampler(do_sample=True, seed=0)  # varied text: greedy's repeats a few tokens
    greedy = lm.generate(ids, 16, sampler=sampler)
    string = stop_cases(tokenizer, greedy[0, seq:])[case]
    completed = first_completed(tokenizer, greedy[0, seq:], string)
    got = lm.generate(ids, 16, sampler=sampler, stop_strings=string, tokenizer=tokenizer)
    end = 16 if completed is None else completed + 1
    assert (completed is None) == (case == "never") and (completed == 0) == (case == "first")
    np.testing.assert_array_equal(got, greedy[:, : seq + end])
    # The text helpers end the text before it.
    stream = StopTextStream(tokenizer, [string])
    streamed = "".join(stream(token) for token in greedy[0, seq:]) + stream.flush()
    full = tokenizer.decode(greedy[0, seq:].tolist(), skip_special_tokens=False)
    assert streamed == cut(full, [string]) == full[: full.find(string) if completed is not None else None]


def test_a_row_that_stops_holds_the_pad_id_while_the_others_go_on(compiled_lm, lm_checkpoint):
    lm, tokenizer = compiled_lm(LM), load_tokenizer(lm_checkpoint(LM))
    ids = prompts(LM, 2, 4, seed=3)
    greedy = lm.generate(ids, 12)
    string = token_bytes(tokenizer, int(greedy[0, 4 + 2])).decode("utf-8", "replace")
    got = lm.generate(ids, 12, stop_strings=[string], tokenizer=tokenizer, pad_token_id=5)
    stops = [first_completed(tokenizer, row[4:], string) for row in greedy]
    last = max(12 - 1 if stop is None else stop for stop in stops)
    assert got.shape == (2, 4 + last + 1)
    for row, stop in enumerate(stops):
        end = 4 + (last if stop is None else stop) + 1
        np.testing.assert_array_equal(got[row, :end], greedy[row, :end])
        assert (got[row, end:] == 5).all()


# Several sequences a prompt, and going on past n_positions.


def test_sampled_return_sequences_are_each_prompts_rows_together_and_seeded(compiled_lm):
    lm = compiled_lm(LM)
    ids = prompts(LM, 2, 5)
    sampler = Sampler(do_sample=True, temperature=1.5, seed=3)
    got = lm.generate(ids, 6, sampler=sampler, num_return_sequences=3)
    assert got.shape == (6, 11)
    np.testing.assert_array_equal(got[:, :5], np.repeat(ids, 3, axis=0))
    np.testing.assert_array_equal(got, lm.generate(ids, 6, sampler=sampler, num_return_sequences=3))
    np.testing.assert_array_equal(got, lm.generate(np.repeat(ids, 3, axis=0), 6, sampler=sampler))
    assert len({tuple(row) for row in got[:3]}) > 1  # three samples, not three copies


def test_the_context_shift_continues_from_the_kept_tail(compiled_lm):
    """Before the first shift, plain generation; the step after it sees the last half of the tokens as
    its prompt: its logits are those of that tail run alone."""
    lm = compiled_lm(LM)
    ids = prompts(LM, 1, 10, seed=2)
    steps = list(lm.stream(ids, 45, context_overflow="shift"))
    tokens = np.concatenate([ids, np.stack([step.tokens for step in steps], axis=1)], axis=1)
    fits = LM.n_positions - 10  # new tokens a plain generation may ask for
    np.testing.assert_array_equal(tokens[:, : 10 + fits], lm.generate(ids, fits))
    # The cache fills with the token of step `fits`; the next step's prompt is the last half.
    tail = tokens[:, 10 + fits + 1 - LM.n_positions // 2 : 10 + fits + 1]
    np.testing.assert_allclose(steps[fits + 1].logits, lm.logits(tail)[:, -1], rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="n_positions=48"):
        lm.generate(ids, 45)  # the default still refuses


# Beam search.


def test_a_reordered_cache_decodes_as_a_cache_of_the_reordered_prompts(compiled_lm):
    lm = compiled_lm(LM)
    ids, tokens = prompts(LM, 3, 6, seed=4), np.array([3, 9, 27])
    cache = lm.new_cache(3, 8)
    lm.prefill(ids, cache)
    lm.reorder_cache(cache, [2, 0, 0])
    fresh = lm.new_cache(3, 8)
    lm.prefill(ids[[2, 0, 0]], fresh)
    np.testing.assert_array_equal(lm.decode_step(tokens, cache), lm.decode_step(tokens, fresh))
    with pytest.raises(ValueError, match=r"rows must be 3 row indices in 0..2"):
        lm.reorder_cache(cache, [0, 1, 3])
    with pytest.raises(ValueError, match=r"kept must be 3 position counts in 0..7"):
        lm.reorder_cache(cache, [0, 0, 1], kept=[0, 8, 0])


def held(cache) -> np.ndarray:
    """Every layer's keys and values, copied to the host, [layers, 2, batch, heads, capacity, d]."""
    return np.stack([np.from_dlpack(buffer).copy() for buffer in cache.buffers])


def test_a_reorder_copies_each_row_from_its_kept_positions_on(compiled_lm):
    lm = compiled_lm(LM)
    cache = lm.new_cache(3, 8)
    lm.prefill(prompts(LM, 3, 6, seed=6), cache)
    before = held(cache)
    lm.reorder_cache(cache, [2, 0, 0], kept=[0, 6, 3])  # row 1 keeps all of its own, row 2 the first 3
    after = held(cache)
    np.testing.assert_array_equal(after[:, :, 0, :, :6], before[:, :, 2, :, :6])
    np.testing.assert_array_equal(after[:, :, 1], before[:, :, 1])
    np.testing.assert_array_equal(after[:, :, 2, :, :3], before[:, :, 2, :, :3])
    np.testing.assert_array_equal(after[:, :, 2, :, 3:6], before[:, :, 0, :, 3:6])


def test_rows_of_the_same_tokens_hold_the_same_keys_and_values(compiled_lm):
    """What lets beam search's reorder skip the positions a row shares with its parent: equal
    tokens give equal keys and values, bit for bit, whatever row of the batch they are in."""
    lm = compiled_lm(LM)
    cache = lm.new_cache(4, 9)
    lm.prefill(np.repeat(prompts(LM, 1, 5, seed=7), 4, axis=0), cache)
    for tokens in ([3, 3, 3, 3], [8, 8, 8, 8], [1, 1, 1, 1]):
        lm.decode_step(np.array(tokens), cache)
    keys_and_values = held(cache)[..., :8, :]
    for row in range(1, 4):
        np.testing.assert_array_equal(keys_and_values[:, :, row], keys_and_values[:, :, 0])


def test_beams_come_best_first_by_the_references_scores(compiled_lm, lm_weights):
    """Each returned beam's score (its new tokens' float64 log-probabilities, summed, over its length)
    is no better than the one before it, and the best is at least greedy's."""
    lm, weights = compiled_lm(LM), lm_weights(LM)
    ids = prompts(LM, 1, 4, seed=5)
    beams = lm.generate(ids, 6, num_beams=4, num_return_sequences=4)
    greedy = lm.generate(ids, 6)

    def score(row):
        logits, _ = reference.lm_logits_and_largest_score(row[None, :-1], weights, LM)
        shifted = logits[0, 3:] - logits[0, 3:].max(axis=-1, keepdims=True)
        log_probabilities = shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
        chosen = np.take_along_axis(log_probabilities, row[4:, None], axis=-1)
        return chosen.sum() / 6

    scores = [score(row) for row in beams]
    assert beams.shape == (4, 10) and len({tuple(row) for row in beams}) == 4
    assert (np.diff(scores) <= 1e-6).all()
    assert scores[0] >= score(greedy[0]) - 1e-9


# Bad options.


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"min_new_tokens": -1}, "min_new_tokens must be an integer of at least 0, got -1"),
        ({"num_return_sequences": 0}, "num_return_sequences must be an integer of at least 1, got 0"),
        ({"num_return_sequences": 2}, "num_return_sequences=2 of greedy decoding would be 2 copies"),
        (
            {"num_beams": 2, "num_return_sequences": 3},
            "num_return_sequences must be at most num_beams=2, got 3",
        ),
        ({"num_beams": 2, "early_stopping": "soon"}, "early_stopping must be True, False or 'never'"),
        ({"stop_strings": [""]}, "stop_strings must be a non-empty string or a list of them"),
        ({"stop_strings": "x"}, "stop_strings needs the tokenizer that spells the tokens: pass tokenizer="),
        ({"context_overflow": "wrap"}, r"context_overflow must be one of \('error', 'shift'\), got 'wrap'"),
        ({"pad_token_id": 320}, r"pad_token_id must be a token id in 0..319, got 320"),
        ({"sampler": Sampler(logit_bias={320: 1.0})}, r"logit_bias ids \[320\] are outside the vocabulary"),
    ],
)
def test_bad_options_are_refused_naming_the_argument(compiled_lm, options, message):
    lm = compiled_lm(LM)
    with pytest.raises(ValueError, match=message):
        lm.generate([[1, 2, 3]], 4, **options)


def test_settings_that_change_nothing_warn_as_hugging_face_warns(compiled_lm):
    with pytest.warns(UserWarning, match="do_sample is False: greedy decoding leaves top_p=0.9 unused"):
        Sampler(top_p=0.9)
    lm = compiled_lm(LM)
    with pytest.warns(UserWarning, match="num_beams is 1: length_penalty and early_stopping change nothing"):
        lm.generate([[1, 2, 3]], 2, length_penalty=2.0)
    with pytest.warns(UserWarning, match="min_new_tokens=5 > max_new_tokens=2: it stops at the latter"):
        assert lm.generate([[1, 2, 3]], 2, min_new_tokens=5).shape == (1, 5)


def test_an_option_generation_does_not_take_is_named_with_those_it_takes(compiled_lm):
    with pytest.raises(
        TypeError, match=r"no option max_length \(max_new_tokens, the second argument.*num_beams"
    ):
        compiled_lm(LM).generate([[1, 2, 3]], 4, max_length=9)

"""Speculative decoding: `extend` and `KVCache.truncate`, the drafters, and generation with them, against
plain decoding and the model's own distribution."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import numpy as np
import pytest

from max_gpt2 import Sampler, compile_lm, load_tokenizer
from max_gpt2.inference import generation
from max_gpt2.inference.drafting import LONGEST_PAUSE, Pacing, PromptLookup
from max_gpt2.reference import softmax
from tests.support import LM, LM_ONE_LAYER, prompts

FORMATS = ["float32", "bfloat16", "q8_0", "q4_0"]


def logits_step_by_step(lm, prompt: np.ndarray, tokens: np.ndarray) -> np.ndarray:
    cache = lm.new_cache(1, prompt.shape[1] + tokens.shape[1])
    lm.prefill(prompt, cache)
    return np.stack([lm.decode_step(tokens[:, i], cache) for i in range(tokens.shape[1])], axis=1)


@pytest.mark.parametrize("weights", FORMATS)
def test_extend_gives_each_rows_logits_of_one_step_at_a_time(compiled_lm, weights):
    """What greedy decoding with drafts equals plain greedy decoding by: a K-token step computes each
    token as a one-token step does, bit for bit (in bfloat16 too: kernels/bfloat16_products.mojo sums
    one row's products as it sums several rows')."""
    lm = compiled_lm(LM, weights=weights)
    rng = np.random.default_rng(3)
    prompt, tokens = rng.integers(0, LM.vocab_size, (1, 7)), rng.integers(0, LM.vocab_size, (1, 6))
    expected = logits_step_by_step(lm, prompt, tokens)
    cache = lm.new_cache(1, 13)
    lm.prefill(prompt, cache)
    first = lm.extend(tokens[:, :4], cache)
    cache.truncate(cache.length - 2)  # the last two dropped, and run again with what follows
    rest = lm.extend(tokens[:, 2:], cache)
    got = np.concatenate([first[:, :2], rest], axis=1)
    assert cache.length == 13 and got.shape == (1, 6, LM.vocab_size)
    np.testing.assert_array_equal(got, expected)


def test_extend_and_truncate_refuse_what_does_not_fit(compiled_lm):
    lm = compiled_lm(LM)
    cache = lm.new_cache(1, 6)
    with pytest.raises(ValueError, match="decoding needs a cache that holds a prompt"):
        lm.extend([[1, 2]], cache)
    lm.prefill([[1, 2, 3]], cache)
    with pytest.raises(ValueError, match=r"tokens must have shape \[batch=1, S >= 1\], got \[2\]"):
        lm.extend([1, 2], cache)
    with pytest.raises(ValueError, match=r"tokens\[0, 1\] = 320 is outside the vocabulary \(0..319\)"):
        lm.extend([[1, 320]], cache)
    with pytest.raises(ValueError, match="4 tokens do not fit the cache: 3 of 6 positions are written"):
        lm.extend([[1, 2, 3, 4]], cache)
    with pytest.raises(ValueError, match=r"length must be an integer in 0..3, got 4"):
        cache.truncate(4)
    assert cache.length == 3


def test_prompt_lookup_drafts_what_followed_the_last_ngram_first():
    """Hugging Face's rule: the longest n-gram (up to `max_ngram`) first, its first earlier occurrence."""
    lookup = PromptLookup(3, max_ngram=2)
    sequence = np.array([4, 5, 6, 9, 5, 6, 7, 8, 1, 5, 6])
    np.testing.assert_array_equal(lookup.propose(sequence, 3), [9, 5, 6])  # [5, 6] first at 1
    np.testing.assert_array_equal(lookup.propose(sequence, 2), [9, 5])  # no more than asked
    np.testing.assert_array_equal(lookup.propose(np.array([4, 5, 7, 2, 5]), 3), [7, 2, 5])  # [5] alone
    assert lookup.propose(np.array([1, 2, 3]), 3).size == 0  # nothing to look up


def test_drafts_grow_when_accepted_shrink_when_cut_and_pause_when_useless():
    pacing = Pacing(6)
    assert pacing.next_size() == 2  # the first draft: 2 at most
    pacing.record(2, 2)
    assert pacing.next_size() == 4  # accepted whole: twice as many
    pacing.record(6, 6)
    assert pacing.next_size() == 6  # no more than the most
    pacing.record(6, 2)
    assert pacing.next_size() == 3  # one more than were accepted
    pauses = []
    for _ in range(7):  # nothing accepted, time after time
        pacing.record(1, 0)
        pauses.append(next(i for i in range(100) if pacing.next_size()))
    assert pauses == [1, 2, 4, 8, LONGEST_PAUSE, LONGEST_PAUSE, LONGEST_PAUSE]
    assert pacing.size == 1
    sizes = []
    for _ in range(4):  # accepted whole, time after time: drafting at once, twice as many each time
        pacing.record(pacing.size, pacing.size)
        sizes.append(pacing.next_size())
    assert sizes == [2, 4, 6, 6]


def tokens_of(steps) -> np.ndarray:
    """A stream's tokens, one row's."""
    return np.array([step.tokens[0] for step in steps])


@pytest.fixture(scope="module")
def repeating_prompt() -> np.ndarray:
    """A prompt that repeats itself, so that prompt lookup finds drafts."""
    part = np.random.default_rng(5).integers(0, LM.vocab_size, 6)
    return np.concatenate([part, part, part[:3]])[None]


@pytest.mark.parametrize("weights", FORMATS)
def test_greedy_with_drafts_is_plain_greedy_token_for_token(
    compiled_lm, lm_weights, repeating_prompt, weights
):
    lm = compiled_lm(LM, weights=weights)
    other = compile_lm(LM, lm_weights(LM, seed=1), "cpu", weight_format=weights)  # a draft that errs
    sampler = Sampler(repetition_penalty=1.3)  # the controls apply to the drafted positions too
    for prompt in (repeating_prompt, prompts(LM, 1, 10, seed=2)):
        plain = lm.generate(prompt, 24, sampler=sampler)[0, prompt.shape[1] :]
        for drafting in (
            {"prompt_lookup_num_tokens": 5},
            {"assistant_model": lm, "num_assistant_tokens": 4},
            {"assistant_model": other, "num_assistant_tokens": 4},
        ):
            steps = lm.stream(prompt, 24, sampler=sampler, **drafting)
            np.testing.assert_array_equal(tokens_of(steps), plain, err_msg=str(drafting))
            assert 0 <= steps.drafts.accepted <= steps.drafts.drafted
    looked = lm.stream(repeating_prompt, 24, prompt_lookup_num_tokens=5)
    assert tokens_of(looked).size == 24 and looked.drafts.accepted > 0
    itself = lm.stream(repeating_prompt, 24, assistant_model=lm, num_assistant_tokens=4)
    assert tokens_of(itself).size == 24
    assert itself.drafts.accepted == itself.drafts.drafted > 0  # the model drafting for itself is right


def test_drafts_stop_at_end_of_text_and_respect_min_new_tokens(compiled_lm, repeating_prompt):
    lm = compiled_lm(LM)
    plain = lm.generate(repeating_prompt, 20)[0, repeating_prompt.shape[1] :]
    eos = int(plain[6])  # a token the model produces: generation ends there
    for min_new in (0, 9):
        options = {"eos_token_id": eos, "min_new_tokens": min_new}
        expected = lm.generate(repeating_prompt, 20, **options)
        got = lm.generate(repeating_prompt, 20, prompt_lookup_num_tokens=6, **options)
        np.testing.assert_array_equal(got, expected)


def test_a_stop_string_ends_drafted_text_where_it_ends_plain_text(compiled_lm, lm_checkpoint):
    """A stop string ends generation at the same token with drafts as without: each drafted token is
    taken one at a time, the stop strings checked after each."""
    lm, tokenizer = compiled_lm(LM), load_tokenizer(lm_checkpoint(LM))
    prompt = np.array([tokenizer.encode("The cat sat on the mat. The cat sat on the mat. The cat").ids])
    plain = lm.generate(prompt, 20)[0, prompt.shape[1] :]
    stop = tokenizer.decode(plain[:10].tolist(), skip_special_tokens=False)[-2:]  # completed by token 10
    options = {"stop_strings": stop, "tokenizer": tokenizer}
    expected = lm.generate(prompt, 20, **options)
    drafted = lm.stream(prompt, 20, prompt_lookup_num_tokens=6, **options)
    got = np.concatenate([prompt[0], tokens_of(drafted)])
    assert expected.shape[1] <= prompt.shape[1] + 10  # the stop string did end it
    np.testing.assert_array_equal(got, expected[0])
    assert drafted.drafts.accepted > 0


def test_sampling_with_drafts_keeps_the_models_distribution(compiled_lm):
    """Drafted tokens are accepted where the token sampled from the model is the drafted one, so the
    sequences follow the model's distribution: here the first three tokens' against the probabilities
    the model gives, where prompt lookup drafts [6, 7] after a first token 5."""
    lm = compiled_lm(LM)
    prompt = np.array([[5, 6, 7, 9, 5, 6, 7, 11]])
    bias = {5: 5.0, 6: 5.0, 7: 5.0}  # likely enough that drafts are often accepted, often not

    def probability(prefix: list[int], token: int) -> float:
        logits = lm.logits(np.array([[*prompt[0], *prefix]]))[0, -1].astype(np.float64)
        for id_, value in bias.items():
            logits[id_] += value
        return float(softmax(logits)[token])

    p5, p6, p7 = probability([], 5), probability([5], 6), probability([5, 6], 7)
    expected = np.array([p5 * p6 * p7, p5 * p6 * (1 - p7), p5 * (1 - p6), 1 - p5])
    counts, drafted, accepted = np.zeros(4), 0, 0
    runs = 3000
    for seed in range(runs):
        sampler = Sampler(do_sample=True, seed=seed, logit_bias=bias)
        steps = lm.stream(prompt, 3, sampler=sampler, prompt_lookup_num_tokens=2)
        t = tokens_of(steps)
        counts[
            0 if t[:3].tolist() == [5, 6, 7] else 1 if t[:2].tolist() == [5, 6] else 2 if t[0] == 5 else 3
        ] += 1
        drafted, accepted = drafted + steps.drafts.drafted, accepted + steps.drafts.accepted
    assert 0 < accepted < drafted
    chi_square = float(((counts - runs * expected) ** 2 / (runs * expected)).sum())
    assert chi_square < 21.1, (counts / runs, expected)  # 3 degrees of freedom: p = 1e-4


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"prompt_lookup_num_tokens": 0}, "prompt_lookup_num_tokens must be an integer of at least 1, got 0"),
        ({"prompt_lookup_num_tokens": 3, "max_matching_ngram_size": 0}, "max_matching_ngram_size must be"),
        ({"num_assistant_tokens": 0, "assistant_model": None}, "num_assistant_tokens must be an integer"),
        ({"prompt_lookup_num_tokens": 3, "assistant_model": "lm"}, "or assistant_model, not both"),
        ({"prompt_lookup_num_tokens": 3, "num_beams": 2}, "takes neither num_beams > 1"),
        ({"prompt_lookup_num_tokens": 3, "context_overflow": "shift"}, "nor context_overflow='shift'"),
        ({"prompt_lookup_num_tokens": 3, "num_return_sequences": 2, "sampler": Sampler(do_sample=True)},
         r"drafts for one sequence at a time .*; got 2 rows"),
        ({"assistant_model": 3}, "assistant_model must be a compiled language model, got int"),
    ],
)  # fmt: skip
def test_bad_speculative_options_are_refused_naming_the_argument(compiled_lm, options, message):
    lm = compiled_lm(LM)
    if options.get("assistant_model") == "lm":
        options = {**options, "assistant_model": lm}
    with pytest.raises((ValueError, TypeError), match=message):
        lm.generate(prompts(LM, 1, 4), 5, **options)
    with pytest.raises(ValueError, match=r"drafts for one sequence at a time .*; got 2 rows"):
        lm.generate(prompts(LM, 2, 4), 5, prompt_lookup_num_tokens=3)


def test_an_assistant_must_share_the_vocabulary_and_hold_the_context(compiled_lm):
    lm = compiled_lm(LM)
    with pytest.raises(ValueError, match="assistant_model's vocabulary has 101 tokens, the model's 320"):
        lm.generate(prompts(LM, 1, 4), 5, assistant_model=compiled_lm(LM_ONE_LAYER))
    longer = SimpleNamespace(config=dataclasses.replace(LM, n_positions=64), tokenizer=None)  # never run
    with pytest.raises(ValueError, match=r"assistant_model's n_positions=48 is shorter .* \(49 positions\)"):
        generation.generate(longer, prompts(LM, 1, 4), 45, assistant_model=lm)

"""llama-server's sampler chain on its `POST /completion`, through the real server: the cuts before the
temperature, top-n-sigma, typical-p, XTC, the dynamic temperature, and `ignore_eos` banning the
end-of-text (its penalties and DRY: `tests/test_serve_repeats.py`; Mirostat: `tests/test_serve_mirostat.py`).
The tokens each must give come from the tests' own loops over the served weights' logits, through
references written from llama.cpp's code (`tests/test_sampler_chain.py`); where llama.cpp is built
(`LLAMA_CPP`), llama-server itself samples on the same weights, its tokens ours or among those ours keeps."""

from __future__ import annotations

import numpy as np
import pytest

from max_gpt2.inference.sampler_chain import LOWEST, STEPS, chain
from max_gpt2.inference.tokenizer import END_OF_TEXT
from tests.support import requires_serving
from tests.test_serve import PROMPTS
from tests.test_serve_native import post

pytestmark = requires_serving()

CHAIN = {"top_k": 0, "top_p": 0.5, "min_p": 0.0, "temperature": 0.3}  # orders apart on this model


def chain_sets(lm, tokenizer) -> tuple[set[int], set[int]]:
    """The first tokens llama-server's chain keeps for `CHAIN` after `PROMPTS[1]`, and those cutting after
    the temperature (MAX's and vLLM's order) keeps; a check that those apart are likely enough to show."""
    row = lm.logits(np.array([tokenizer.encode(PROMPTS[1]).ids]))[0, -1]
    llama = np.flatnonzero(chain(row, [(name, CHAIN[name]) for name in STEPS if name in CHAIN]) > LOWEST)
    theirs = set(np.flatnonzero(chain(row, [("temperature", 0.3), ("top_p", 0.5)]) > LOWEST).tolist())
    odds = np.exp(row[llama] / 0.3 - (row[llama] / 0.3).max())
    beyond = odds[[token not in theirs for token in llama]].sum() / odds.sum()
    assert beyond > 0.2, "the prompt's logits show the two orders apart"  # 48 draws miss all: < 1e-4
    return set(llama.tolist()), theirs


def test_samples_come_from_llama_servers_chain_cuts_before_the_temperature(
    served_lm, served_model, served_tokenizer
):
    """At temperature 0.3 with top-p, llama-server cuts at the model's own temperature, then tempers:
    every first token sampled is one its chain keeps (`sampler_chain`, checked against a reference of
    llama.cpp's definitions in `tests/test_sampler_chain.py`, and against llama-server's own draws
    below), and tokens come that cutting after the temperature would never give; with `samplers`
    putting the temperature first, only those."""
    llama, theirs = chain_sets(served_model, served_tokenizer)
    for order, allowed, some_beyond in ((None, llama, True), ("tkp", theirs, False)):
        seen = set()
        for seed in range(3):
            body = {"prompt": PROMPTS[1], "n_predict": 1, **CHAIN, "seed": seed, "n_cmpl": 16}
            status, answers = post(
                served_lm, "/completion", {**body, "samplers": order, "return_tokens": True}
            )
            assert status == 200, answers
            seen |= {token for answer in answers for token in answer["tokens"][:1]}
        assert seen <= allowed and bool(seen - theirs) == some_beyond, (order, seen)


def test_ignore_eos_bans_the_end_of_text_as_llama_server_where_vllms_goes_past_it(
    served_lm, served_tokenizer
):
    eos = served_tokenizer.token_to_id(END_OF_TEXT)
    pushed = {
        "prompt": PROMPTS[0],
        "n_predict": 4,
        "temperature": 0,
        "ignore_eos": True,
        "return_tokens": True,
    }
    status, answer = post(served_lm, "/completion", {**pushed, "logit_bias": [[eos, 100]]})
    assert status == 200 and eos not in answer["tokens"] and answer["stop_type"] == "limit"
    v1 = {
        "prompt": PROMPTS[0],
        "max_tokens": 4,
        "temperature": 0,
        "ignore_eos": True,
        "return_token_ids": True,
    }
    status, answer = post(served_lm, "/v1/completions", {**v1, "logit_bias": {str(eos): 100}})
    assert answer["choices"][0]["token_ids"] == [eos] * 4


TYPICAL = {"typical_p": 0.3, "top_n_sigma": 1.0}  # each keeps other tokens than the argmax at times
CHAIN_STEP = {"typical_p": "typ_p", "top_n_sigma": "top_n_sigma"}  # each field's step in the chain
DEFAULTS = {"top_k": 40, "top_p": 0.95, "min_p": 0.05, "temperature": 0.7}  # llama-server's, tempered


LLAMA_DEFAULTS = [("top_k", 40), ("top_p", 0.95), ("min_p", 0.05)]


@pytest.mark.parametrize(
    ("fields", "steps"),
    [
        (TYPICAL, [("top_n_sigma", 1.0), ("top_k", 40), ("typ_p", 0.3), ("top_p", 0.95), ("min_p", 0.05)]),
        ({"xtc_probability": 1.0, "xtc_threshold": 0.02}, [*LLAMA_DEFAULTS, ("xtc", 1.0, 0.02)]),
    ],
    ids=["top_n_sigma, typical_p", "xtc"],
)
def test_the_samplers_only_llama_servers_chain_has_run_in_it(
    served_lm, served_model, served_tokenizer, fields, steps
):
    """Greedy, the chain's temperature 0 takes the likeliest of what top-n-sigma and typical-p keep, or
    what XTC leaves of the top choices, which need not be the argmax: the tokens are this test's loop
    over the model's logits through the chain (XTC's probability 1: its draw always falls within)."""
    prompt, eos = served_tokenizer.encode(PROMPTS[1]).ids, served_tokenizer.token_to_id(END_OF_TEXT)
    body = {"prompt": prompt, "n_predict": 10, "temperature": 0, "ignore_eos": True, "return_tokens": True}
    ids, cut_argmax = list(prompt), 0
    for _ in range(10):
        row = served_model.logits(np.array([ids]))[0, -1]
        row[eos] = LOWEST  # `ignore_eos`, as llama-server bans it
        ids.append(int(np.argmax(chain(row, steps, chance=0.0))))
        cut_argmax += ids[-1] != int(np.argmax(row))
    status, answer = post(served_lm, "/completion", {**body, **fields})
    assert status == 200 and answer["tokens"] == ids[len(prompt) :] and cut_argmax > 0, answer
    chat = {"messages": [{"role": "user", "content": PROMPTS[1]}], "max_tokens": 3, "temperature": 0}
    v1 = {"prompt": prompt, "max_tokens": 10, "temperature": 0, "logit_bias": [[eos, False]]}  # banned
    for path, each in (("/v1/completions", v1), ("/v1/chat/completions", chat)):  # llama-server's chain too
        status, answer = post(
            served_lm, path, {**each, **fields, **dict(LLAMA_DEFAULTS), "return_token_ids": True}
        )
        assert status == 200 and (
            path != "/v1/completions" or answer["choices"][0]["token_ids"] == ids[len(prompt) :]
        )
    drawn = post(served_lm, "/completion", {**body, **fields, "temperature": 0.7, "seed": 3, "n_cmpl": 8})
    row = served_model.logits(np.array([prompt]))[0, -1]
    row[eos] = LOWEST
    kept = set(np.flatnonzero(chain(row, steps, chance=0.0) > LOWEST).tolist())
    assert {answer["tokens"][0] for answer in drawn[1]} <= kept


def test_llama_servers_own_draws_come_from_the_chain_we_run(served_model, served_tokenizer, llama_server):
    """llama-server itself, sampling with `CHAIN` on the same weights, draws only tokens our chain keeps,
    and some that cutting after the temperature would not."""
    llama, theirs = chain_sets(served_model, served_tokenizer)
    drawn = set()
    for seed in range(48):
        body = {"prompt": PROMPTS[1], "n_predict": 1, **CHAIN, "seed": seed, "return_tokens": True}
        drawn |= set(post(llama_server, "/completion", body)[1]["tokens"][:1])
    assert drawn <= llama and drawn - theirs, drawn


def test_llama_servers_typical_p_and_top_n_sigma_draw_what_our_chain_keeps(
    served_model, served_tokenizer, llama_server
):
    """Each alone, as llama-server runs it (after its top-n-sigma, which leaves the tokens it cuts in its
    list at -inf, its typical-p's entropy is NaN, 0 * -inf, and what it keeps arbitrary): its first
    tokens drawn at temperature 0.7 are among those our chain keeps, its greedy one the likeliest of them.
    llama.cpp's float16 GELU moves its logits by about 1e-3, and this model's 40 likeliest tokens are near
    alike, so that typical-p's ranking by surprise can swap neighbours: ours is taken at p + 0.1 there."""
    prompt, eos = served_tokenizer.encode(PROMPTS[1]).ids, served_tokenizer.token_to_id(END_OF_TEXT)
    row = served_model.logits(np.array([prompt]))[0, -1]
    row[eos] = LOWEST  # `ignore_eos`, as llama-server bans it
    for name, value, margin in (
        ("typical_p", TYPICAL["typical_p"], 0.1),
        ("top_n_sigma", TYPICAL["top_n_sigma"], 0),
    ):
        ours = {"top_n_sigma": -1, "typ_p": 1, CHAIN_STEP[name]: value + margin}
        values = {**DEFAULTS, **ours}
        kept = np.flatnonzero(chain(row, [(step, values[step]) for step in STEPS if step in values]) > LOWEST)
        body = {"prompt": prompt, "n_predict": 1, name: value, "temperature": 0.7, "ignore_eos": True}
        body["return_tokens"] = True
        drawn = {
            post(llama_server, "/completion", {**body, "seed": seed})[1]["tokens"][0] for seed in range(24)
        }
        assert drawn <= set(kept.tolist()) and len(drawn) > 1 and len(kept) < 40, (name, drawn)
        greedy = post(llama_server, "/completion", {**body, "temperature": 0})[1]["tokens"][0]
        assert greedy in kept.tolist() and (margin or greedy == int(kept[np.argmax(row[kept])]))


def test_llama_servers_xtc_leaves_the_top_choice_ours_leaves(served_model, served_tokenizer, llama_server):
    """XTC drawing at every token (probability 1), its threshold midway in the widest gap between the ten
    likeliest probabilities (so that llama.cpp's logits, about 1e-3 from ours, put the same tokens above
    it): llama-server's greedy token is ours, the least likely of those above, not the argmax."""
    prompt, eos = served_tokenizer.encode(PROMPTS[1]).ids, served_tokenizer.token_to_id(END_OF_TEXT)
    row = served_model.logits(np.array([prompt]))[0, -1]
    row[eos] = LOWEST  # `ignore_eos`, as llama-server bans it
    cut = chain(row, LLAMA_DEFAULTS)  # what reaches XTC: its probabilities are over these
    likeliest = np.sort(cut[cut > LOWEST].astype(np.float64))[::-1]
    probabilities = np.exp(likeliest - likeliest[0]) / np.exp(likeliest - likeliest[0]).sum()
    widest = 1 + int(np.argmax(probabilities[1:10] - probabilities[2:11]))  # at least two reach it
    threshold = float(probabilities[widest] + probabilities[widest + 1]) / 2
    ours = int(np.argmax(chain(row, [*LLAMA_DEFAULTS, ("xtc", 1.0, threshold)], chance=0.0)))
    body = {"prompt": prompt, "n_predict": 1, "temperature": 0, "xtc_probability": 1.0, "ignore_eos": True}
    answer = post(llama_server, "/completion", {**body, "xtc_threshold": threshold, "return_tokens": True})[1]
    assert answer["tokens"][0] == ours != int(np.argmax(row))


def test_the_dynamic_temperature_is_the_entropys(served_lm, served_model, served_tokenizer):
    """Each seed's first token with `dynatemp_range` is the one drawn at the temperature this test works
    out from the entropy of what llama-server's default cuts keep, and not the one at the base one."""
    prompt, eos = served_tokenizer.encode(PROMPTS[1]).ids, served_tokenizer.token_to_id(END_OF_TEXT)
    row = served_model.logits(np.array([prompt]))[0, -1]
    row[eos] = LOWEST
    cut = chain(row, LLAMA_DEFAULTS)
    kept = cut[cut > LOWEST].astype(np.float64)
    probabilities = np.exp(kept - kept.max()) / np.exp(kept - kept.max()).sum()
    entropy = -(probabilities * np.log(probabilities)).sum() / np.log(kept.size)
    temperature = 0.1 + 1.8 * entropy**0.5  # from 1 - 0.9 to 1 + 0.9
    body = {
        "prompt": prompt,
        "n_predict": 1,
        "seed": 5,
        "n_cmpl": 16,
        "ignore_eos": True,
        "return_tokens": True,
    }
    first = {
        name: [answer["tokens"][0] for answer in post(served_lm, "/completion", {**body, **fields})[1]]
        for name, fields in (
            ("dynamic", {"temperature": 1.0, "dynatemp_range": 0.9, "dynatemp_exponent": 0.5}),
            ("worked out", {"temperature": temperature}),
            ("base", {"temperature": 1.0}),
        )
    }
    assert first["dynamic"] == first["worked out"] != first["base"], (temperature, first)


KEEP = {"min_p": 0.99, "min_keep": 6, "top_k": 0, "top_p": 1.0, "temperature": 1.5}  # min-p alone keeps 1


def test_min_keep_leaves_the_cuts_that_many_tokens(served_lm, served_model, served_tokenizer):
    """min-p at 0.99 keeps the likeliest token alone; with `min_keep` 6, the six likeliest, which the
    first tokens drawn over several seeds come from, more than one of them."""
    row = served_model.logits(np.array([served_tokenizer.encode(PROMPTS[1]).ids]))[0, -1]
    six = set(np.argsort(-row)[:6].tolist())
    body = {"prompt": PROMPTS[1], "n_predict": 1, **KEEP, "n_cmpl": 16, "return_tokens": True}
    drawn = {
        answer["tokens"][0]
        for seed in range(2)
        for answer in post(served_lm, "/completion", {**body, "seed": seed})[1]
    }
    assert drawn <= six and len(drawn) > 2, (drawn, six)
    alone = post(served_lm, "/completion", {**body, "min_keep": 0, "seed": 0})[1]
    assert {answer["tokens"][0] for answer in alone} == {int(np.argmax(row))}


def test_llama_servers_min_keep_draws_what_ours_keeps(served_model, served_tokenizer, llama_server):
    row = served_model.logits(np.array([served_tokenizer.encode(PROMPTS[1]).ids]))[0, -1]
    six = set(np.argsort(-row)[:6].tolist())
    body = {"prompt": PROMPTS[1], "n_predict": 1, **KEEP, "return_tokens": True}
    drawn = {post(llama_server, "/completion", {**body, "seed": seed})[1]["tokens"][0] for seed in range(24)}
    assert drawn <= six and len(drawn) > 2, (drawn, six)

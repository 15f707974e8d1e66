"""llama-server's repetition controls on its `POST /completion`, through the real server: its penalties
over the last `repeat_last_n` tokens of prompt and text, and DRY's over the runs that would repeat. The
greedy tokens each must give come from the tests' own loops over the served weights' logits (DRY's
through the plain search of `tests/test_dry.py`); where llama.cpp is built (`LLAMA_CPP`), llama-server's
own greedy tokens on the same weights are ours."""

from __future__ import annotations

import numpy as np

from max_gpt2.inference.tokenizer import END_OF_TEXT, token_bytes
from tests.support import requires_serving
from tests.test_dry import reference
from tests.test_serve import PROMPTS
from tests.test_serve_native import post

pytestmark = requires_serving()


def llama_penalised_greedy(
    lm, prompt: list[int], new_tokens: int, penalties: dict[str, float], eos: int | None
) -> list[int]:
    """Greedy ids after `prompt` with llama.cpp's penalties, by this test's own loop: each token among
    the last `repeat_last_n` of prompt and text divided (or, at 0 and below, multiplied) by
    `repeat_penalty`, then less its count times `frequency_penalty` and `presence_penalty` once; the
    end-of-text id `eos`, where given, never picked (llama-server's `ignore_eos`)."""
    ids = list(prompt)
    for _ in range(new_tokens):
        row = lm.logits(np.array([ids]))[0, -1].astype(np.float64)
        if eos is not None:
            row[eos] = -np.inf
        window = ids[-int(penalties["repeat_last_n"]) :]
        for token in set(window):
            row[token] = (
                row[token] * penalties["repeat_penalty"]
                if row[token] <= 0
                else row[token] / penalties["repeat_penalty"]
            )
            row[token] -= window.count(token) * penalties["frequency_penalty"] + penalties["presence_penalty"]
        ids.append(int(np.argmax(row)))
    return ids[len(prompt) :]


PENALTIES = {"repeat_penalty": 1.5, "repeat_last_n": 6, "frequency_penalty": 0.6, "presence_penalty": 0.4}


def test_penalties_count_the_last_repeat_last_n_tokens_of_prompt_and_text(
    served_lm, served_model, served_tokenizer
):
    prompt, eos = served_tokenizer.encode(PROMPTS[1]).ids, served_tokenizer.token_to_id(END_OF_TEXT)
    body = {"prompt": prompt, "n_predict": 12, "temperature": 0, "ignore_eos": True, "return_tokens": True}
    plain = post(served_lm, "/completion", body)[1]["tokens"]
    for penalties in (PENALTIES, {**PENALTIES, "repeat_last_n": 40}):
        status, answer = post(served_lm, "/completion", {**body, **penalties})
        assert status == 200, answer
        assert answer["tokens"] == llama_penalised_greedy(served_model, prompt, 12, penalties, eos) != plain
        assert {name: answer["generation_settings"][name] for name in penalties} == penalties
    # At /v1/completions llama-server's fields count as llama-server counts; without them, OpenAI's way.
    v1 = {"prompt": prompt, "max_tokens": 12, "temperature": 0, "ignore_eos": True}
    status, answer = post(served_lm, "/v1/completions", {**v1, **PENALTIES, "return_token_ids": True})
    assert answer["choices"][0]["token_ids"] == llama_penalised_greedy(
        served_model, prompt, 12, PENALTIES, None
    )


def test_llama_servers_penalised_greedy_tokens_are_ours(served_lm, llama_server):
    body = {"prompt": PROMPTS[1], "n_predict": 8, "temperature": 0, "return_tokens": True, "ignore_eos": True}
    ours, theirs = (post(side, "/completion", {**body, **PENALTIES})[1] for side in (served_lm, llama_server))
    assert ours["tokens"] == theirs["tokens"] and ours["content"] == theirs["content"]


DRY = {"dry_multiplier": 0.8, "dry_base": 1.75, "dry_allowed_length": 2, "dry_penalty_last_n": 40}


def test_dry_takes_from_the_tokens_that_would_repeat_a_run(served_lm, served_model, served_tokenizer):
    """Greedy, the chain's temperature 0 takes the likeliest token after DRY's penalties: the tokens are
    this test's loop through the plain search of `tests/test_dry.py`, llama-server's breakers (one byte
    each, so a breaker is the tokens holding one) read from the vocabulary here, and not the plain
    greedy ones."""
    prompt, eos = served_tokenizer.encode(PROMPTS[1]).ids, served_tokenizer.token_to_id(END_OF_TEXT)
    pieces = [token_bytes(served_tokenizer, token) for token in range(served_tokenizer.get_vocab_size())]
    heads = {
        token: ((),)
        for token, piece in enumerate(pieces)
        if any(b in piece for b in (b"\n", b":", b'"', b"*"))
    }
    ids = list(prompt)
    for _ in range(20):
        row = served_model.logits(np.array([ids]))[0, -1].astype(np.float64)
        row[eos] = -np.inf  # `ignore_eos`, as llama-server bans it
        for token, lost in reference(ids, 0.8, 1.75, 2, 40, heads).items():
            row[token] -= lost
        ids.append(int(np.argmax(row)))
    body = {"prompt": prompt, "n_predict": 20, "temperature": 0, "ignore_eos": True, "return_tokens": True}
    plain = post(served_lm, "/completion", body)[1]["tokens"]
    status, answer = post(served_lm, "/completion", {**body, **DRY})
    assert status == 200 and answer["tokens"] == ids[len(prompt) :] != plain, answer
    assert post(served_lm, "/completion", {**body, **DRY, "samplers": "kt"})[1]["tokens"] == plain  # no d
    # The OpenAI routes run llama-server's chain too where a request sets one of its samplers, as it does.
    v1 = {"prompt": prompt, "max_tokens": 20, "temperature": 0, "logit_bias": [[eos, False]], **DRY}
    status, answer = post(served_lm, "/v1/completions", {**v1, "return_token_ids": True})
    assert status == 200 and answer["choices"][0]["token_ids"] == ids[len(prompt) :], answer


def test_llama_servers_dry_greedy_tokens_are_ours(served_lm, llama_server):
    """llama-server's own DRY, with its breakers and one of several tokens, on the same weights."""
    body = {
        "prompt": PROMPTS[1],
        "n_predict": 20,
        "temperature": 0,
        "return_tokens": True,
        "ignore_eos": True,
    }
    body |= {**DRY, "dry_sequence_breakers": ["\n", ":", '"', "*", "tion is"]}
    ours, theirs = (post(side, "/completion", body)[1] for side in (served_lm, llama_server))
    plain = post(llama_server, "/completion", {**body, "dry_multiplier": 0})[1]
    assert ours["tokens"] == theirs["tokens"] != plain["tokens"] and ours["content"] == theirs["content"]

"""vLLM's log-probability fields through the real server and the `openai` client, against the float64
reference's log-softmax: `prompt_logprobs` (each prompt token after the first with its log-probability,
its rank, how many tokens are at least as likely there, itself counted, and the likeliest alternatives)
and `logprob_token_ids` (each new token's alternatives the ids listed). Their refusals need no model:
test_serve_guard.py."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from max_gpt2 import reference
from max_gpt2.inference.tokenizer import load_tokenizer
from max_gpt2.model.checkpoints.checkpoint import Checkpoint
from tests.support import LM, requires_serving
from tests.test_serve import PROMPTS, client

pytestmark = requires_serving()

TIES = 1e-4  # float32's rounding: tokens this close to a prompt token may rank either side of it


@pytest.fixture(scope="module")
def expected(served_lm):
    """`expected(ids)`: the float64 reference's log-probabilities [len(ids) - 1, V] after each prefix."""
    weights = Checkpoint(served_lm.checkpoint).model_weights()

    def of(ids: list[int]) -> np.ndarray:
        logits, _ = reference.lm_logits_and_largest_score(np.array([ids]), weights, LM)
        shifted = logits[0, :-1] - logits[0, :-1].max(axis=-1, keepdims=True)
        return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))

    return of


def assert_reported(report: list[Any], ids: list[int], expected: np.ndarray, count: int, tokenizer) -> None:
    """`report` is vLLM's `prompt_logprobs` of `ids`, `count` alternatives a token, by `expected` [P-1, V]."""
    assert len(report) == len(ids) and report[0] is None
    for position, (entries, token) in enumerate(zip(report[1:], ids[1:], strict=True)):
        row = expected[position]
        by_id = {int(key): value for key, value in entries.items()}
        assert next(iter(by_id)) == token  # the prompt's token first, as vLLM's
        own = by_id[token]
        assert own["logprob"] == pytest.approx(row[token], abs=1e-4)
        above, alike = np.sum(row > row[token] + TIES), np.sum(np.abs(row - row[token]) <= TIES)
        assert above + 1 <= own["rank"] <= above + alike
        likeliest = sorted((entry["rank"], key) for key, entry in by_id.items() if entry["rank"] <= count)
        assert [rank for rank, _ in likeliest] == list(range(1, count + 1))
        assert [key for _, key in likeliest] == np.argsort(-row, kind="stable")[:count].tolist()
        assert set(by_id) == {token, *(key for _, key in likeliest)}
        for key, entry in by_id.items():
            assert entry["logprob"] == pytest.approx(row[key], abs=1e-4)
            assert entry["decoded_token"] == tokenizer.decode([key], skip_special_tokens=False)


def test_a_completions_prompt_tokens_come_with_their_logprobs_ranks_and_likeliest(served_lm, expected):
    """On each choice, the text's own `logprobs` cut to their count, and absent where not asked."""
    tokenizer = load_tokenizer(served_lm.checkpoint)
    ids = tokenizer.encode(PROMPTS[3]).ids
    answer = client(served_lm).completions.create(
        model="gpt2", prompt=PROMPTS[3], max_tokens=3, temperature=0, n=2, logprobs=1,
        extra_body={"prompt_logprobs": 4, "ignore_eos": True},
    )  # fmt: skip
    for choice in answer.choices:
        assert_reported(choice.model_extra["prompt_logprobs"], ids, expected(ids), 4, tokenizer)
        assert all(len(top) <= 2 for top in choice.logprobs.top_logprobs)  # 1, and the token where apart
    assert answer.usage.prompt_tokens_details.cached_tokens == 0  # a kept page has no logits to report
    bare = client(served_lm).completions.create(
        model="gpt2", prompt=ids, max_tokens=1, temperature=0, extra_body={"prompt_logprobs": 0}
    )
    choice = bare.choices[0]
    assert choice.logprobs is None
    assert_reported(choice.model_extra["prompt_logprobs"], ids, expected(ids), 0, tokenizer)
    plain = client(served_lm).completions.create(model="gpt2", prompt=ids, max_tokens=1, temperature=0)
    assert "prompt_logprobs" not in plain.choices[0].model_extra


def test_a_chats_prompt_logprobs_come_beside_its_choices(served_lm, expected):
    """vLLM puts a chat's `prompt_logprobs` in the response, of the prompt its template rendered."""
    tokenizer = load_tokenizer(served_lm.checkpoint)
    answer = client(served_lm).chat.completions.create(
        model="gpt2", messages=[{"role": "user", "content": PROMPTS[0]}], max_tokens=2, temperature=0,
        extra_body={"prompt_logprobs": 2, "return_token_ids": True},
    )  # fmt: skip
    ids = answer.choices[0].model_extra["prompt_token_ids"]
    assert_reported(answer.model_extra["prompt_logprobs"], ids, expected(ids), 2, tokenizer)


LISTED = [5, 17, 200, 5]  # one listed twice: reported once


def assert_listed(
    tops: list[dict[str, float]], ids: list[int], start: int, expected: np.ndarray, names
) -> None:
    """Each new token's alternatives (`tops`, by text) are the listed ids and the token, with the
    reference's log-probabilities: the tokens of `ids` from `start` on, each after those before it."""
    assert len(tops) == len(ids) - start
    for top, position in zip(tops, range(start, len(ids)), strict=True):
        wanted = {names(token): expected[position - 1, token] for token in [*LISTED, ids[position]]}
        assert top.keys() == wanted.keys()
        assert [top[key] for key in wanted] == pytest.approx(list(wanted.values()), abs=1e-4)


def test_logprob_token_ids_make_the_listed_ids_each_new_tokens_alternatives(served_lm, expected):
    """On completions (with `echo`, the prompt's tokens keep their likeliest), streamed too, and chat."""
    tokenizer = load_tokenizer(served_lm.checkpoint)
    names = lambda token: tokenizer.decode([token], skip_special_tokens=False)  # noqa: E731
    ids = tokenizer.encode(PROMPTS[1]).ids
    body = {"logprob_token_ids": LISTED, "ignore_eos": True, "return_token_ids": True}
    answer = client(served_lm).completions.create(
        model="gpt2", prompt=ids, max_tokens=4, temperature=0, logprobs=1, echo=True, extra_body=body
    )
    choice = answer.choices[0]
    whole = ids + choice.model_extra["token_ids"]
    tops = choice.logprobs.top_logprobs
    assert tops[0] is None and all(len(top) <= 2 for top in tops[1 : len(ids)])  # the prompt's: 1 likeliest
    assert_listed(tops[len(ids) :], whole, len(ids), expected(whole), names)
    chunks = client(served_lm).completions.create(
        model="gpt2", prompt=ids, max_tokens=4, temperature=0, logprobs=0, stream=True, extra_body=body
    )
    streamed = [
        top for chunk in chunks for top in (chunk.choices[0].logprobs.top_logprobs if chunk.choices else [])
    ]
    assert_listed(streamed, whole, len(ids), expected(whole), names)
    chat = client(served_lm).chat.completions.create(
        model="gpt2", messages=[{"role": "user", "content": PROMPTS[1]}], max_tokens=3, temperature=0,
        logprobs=True, top_logprobs=1, extra_body=body,
    )  # fmt: skip
    made = chat.choices[0].model_extra["token_ids"]
    prompt = chat.choices[0].model_extra["prompt_token_ids"]
    entries = chat.choices[0].logprobs.content
    tops = [
        {alternative.token: alternative.logprob for alternative in entry.top_logprobs} for entry in entries
    ]
    assert_listed(tops, prompt + made, len(prompt), expected(prompt + made), names)

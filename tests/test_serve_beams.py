"""vLLM's beam search on the OpenAI routes, through the real server: a completion's `n` choices are the
`n` best beams of this test's own search over the served weights' log-probabilities (each step the 2n
likeliest of each beam, the n best by vLLM's score living on), best first; a chat's the same, streamed or
not; what a beam search takes nothing from is refused, naming the field."""

from __future__ import annotations

import numpy as np
import pytest

from max_gpt2.inference.tokenizer import END_OF_TEXT
from tests.support import requires_serving
from tests.test_serve import PROMPTS, client
from tests.test_serve_native import post

pytestmark = requires_serving()


def beams(model, prompt: list[int], width: int, most: int, eos: int, penalty: float) -> list[list[int]]:
    """vLLM's beam search, step by step over `model`'s log-probabilities in float64."""

    def score(tokens: list[int], total: float) -> float:
        return total / (len(prompt) + len(tokens) - (tokens[-1:] == [eos])) ** penalty

    live, done = [([], 0.0)], []
    for _ in range(most):
        grown = []
        for tokens, total in live:
            row = model.logits(np.array([prompt + tokens]))[0, -1].astype(np.float64)
            logs = row - row.max() - np.log(np.exp(row - row.max()).sum())
            for token in np.argsort(-logs, kind="stable")[: 2 * width].tolist():
                (done if token == eos else grown).append(
                    (tokens + ([] if token == eos else [token]), total + logs[token])
                )
        live = sorted(grown, key=lambda beam: -score(*beam))[:width]
    return [tokens for tokens, _ in sorted(done + live, key=lambda beam: -score(*beam))[:width]]


def test_a_completions_choices_are_its_best_beams_best_first(served_lm, served_model, served_tokenizer):
    prompt, eos = served_tokenizer.encode(PROMPTS[0]).ids, served_tokenizer.token_to_id(END_OF_TEXT)
    expected = beams(served_model, prompt, 3, 5, eos, 0.8)
    body = {"prompt": prompt, "max_tokens": 5, "n": 3, "use_beam_search": True, "length_penalty": 0.8}
    status, answer = post(served_lm, "/v1/completions", {**body, "return_token_ids": True, "logprobs": 2})
    assert status == 200, answer
    choices = answer["choices"]
    assert [choice["token_ids"] for choice in choices] == expected
    assert [choice["index"] for choice in choices] == [0, 1, 2] and len({*map(tuple, expected)}) == 3
    for choice in choices:
        assert choice["text"] == served_tokenizer.decode(choice["token_ids"])
        assert len(choice["logprobs"]["tokens"]) == len(choice["token_ids"])
    assert answer["usage"]["completion_tokens"] == sum(len(tokens) for tokens in expected)
    assert answer["usage"]["prompt_tokens"] == len(prompt)
    status, echoed = post(served_lm, "/v1/completions", {**body, "echo": True})
    assert [choice["text"] for choice in echoed["choices"]] == [PROMPTS[0] + c["text"] for c in choices]


def chat_fields(chat: dict) -> dict:
    """`chat` as the `openai` client takes it: vLLM's fields in `extra_body`."""
    theirs = {"use_beam_search": chat["use_beam_search"]}
    return {**{k: v for k, v in chat.items() if k not in theirs}, "extra_body": theirs}


def test_a_chats_beams_stream_and_answer_alike(served_lm):
    chat = {
        "messages": [{"role": "user", "content": PROMPTS[1]}],
        "max_tokens": 4,
        "n": 2,
        "use_beam_search": True,
    }
    status, whole = post(served_lm, "/v1/chat/completions", chat)
    assert status == 200, whole
    stream = client(served_lm).chat.completions.create(model="gpt2", stream=True, **chat_fields(chat))
    streamed = ["", ""]
    for event in stream:
        for choice in event.choices:
            streamed[choice.index] += choice.delta.content or ""
    assert streamed == [choice["message"]["content"] for choice in whole["choices"]]


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"stop": ["a"]}, "stop"),
        ({"n": 11}, "n"),
        ({"presence_penalty": 0.5}, "presence_penalty"),
        ({"echo": True, "logprobs": 1}, "echo"),
        ({"structured_outputs": {"regex": "a+"}}, "structured_outputs"),
        ({"dry_multiplier": 0.8}, "dry_multiplier"),
        ({"n_indent": 2}, "n_indent"),
    ],
)
def test_what_a_beam_search_takes_nothing_from_is_refused(served_lm, fields, field):
    body = {"prompt": PROMPTS[0], "max_tokens": 3, "n": 2, "use_beam_search": True, **fields}
    status, answer = post(served_lm, "/v1/completions", body)
    assert status == 400 and answer["error"]["param"] == field, answer

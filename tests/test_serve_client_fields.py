"""What OpenAI's clients send and read, at the edges the other serving tests leave: a message object
passed back whole, template variables, a character split by the prompt or by the length, `usage` on
every streamed chunk, and a long tokenization beside other requests.

The texts are checked against the `tokenizers` library's own `decode` of the ids the server lists,
and the chat prompts against the template rendered here (`test_serve_api.render`).
"""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from typing import Any

import pytest

from max_gpt2.inference.tokenizer import load_tokenizer
from tests.support import requires_serving
from tests.test_serve import client
from tests.test_serve_api import MESSAGES, post, render

pytestmark = requires_serving()


@pytest.fixture(scope="module")
def server(served_lm):
    return served_lm


@pytest.fixture(scope="module")
def tokenizer(server):
    return load_tokenizer(server.checkpoint)


def chat(server, messages: list[dict[str, Any]], **options: Any) -> Any:
    return client(server).chat.completions.create(
        model="gpt2", messages=messages, temperature=0, **{"max_tokens": 6, **options}
    )


def test_a_message_object_passed_back_whole_is_read_as_its_role_and_content(server):
    """The `openai` client's message, dumped with its empty fields (`refusal`, `tool_calls`, ...), is the
    same turn as its role and content; a field that asks for something is refused, and so is a name
    that is not a string."""
    asked = [{"role": "user", "content": "hi"}]  # the test model holds 48 positions
    first = chat(server, asked, max_tokens=3).choices[0].message
    plain = [*asked, {"role": "assistant", "content": first.content}, {"role": "user", "content": "ok"}]
    dumped = [*asked, first.model_dump(), {"role": "user", "content": "ok"}]
    assert {"refusal", "tool_calls", "annotations"} <= dumped[1].keys()  # what the client keeps
    assert chat(server, dumped).choices[0].message.content == chat(server, plain).choices[0].message.content
    for message, says in [
        ({"role": "assistant", "content": "x", "tool_calls": [{"id": "1"}]}, "messages[0].tool_calls"),
        ({"role": "user", "content": "x", "name": 123}, "messages[0].name: must be a string"),
    ]:
        status, answer = post(server, "/v1/chat/completions", {"model": "gpt2", "messages": [message]})
        assert status == 400 and answer["error"]["param"] == "messages", answer
        assert says in answer["error"]["message"]


def test_template_variables_may_set_the_generation_prompt_but_not_the_rendering(server, tokenizer):
    """vLLM's: `chat_template_kwargs` override `add_generation_prompt`; a parameter of the rendering
    itself (`tokenize`) is refused naming the field."""
    without = render(MESSAGES, add_generation_prompt=False)
    assert without != render(MESSAGES)
    answer = chat(server, MESSAGES, extra_body={"chat_template_kwargs": {"add_generation_prompt": False}})
    assert answer.usage.prompt_tokens == len(tokenizer.encode(without).ids)
    for kwargs, says in [
        ({"tokenize": True}, "chat_template_kwargs.tokenize"),
        ({"add_generation_prompt": "no"}, "add_generation_prompt: must be true or false"),
    ]:
        body = {"model": "gpt2", "messages": MESSAGES, "chat_template_kwargs": kwargs}
        status, refused = post(server, "/v1/chat/completions", body)
        assert (status, refused["error"]["param"]) == (400, "chat_template_kwargs"), refused
        assert says in refused["error"]["message"]


def test_a_character_split_by_the_prompt_or_the_length_is_written_as_decode_writes_it(server, tokenizer):
    """A prompt ending in the first byte of "é" and a completion made to begin with its second: the
    text is `decode` of the completion's ids (U+FFFD for the lone byte), never the prompt's text; with
    `echo`, `decode` of the prompt's then of the completion's. A length that cuts a character keeps its
    bytes as U+FFFD, as `decode` does. Streamed or not."""
    lead, tail = tokenizer.encode("é").ids  # two byte-level tokens in the test tokenizer
    prompt = [*tokenizer.encode("The cat").ids, lead]
    cases = [({tail: 100}, False, prompt), ({tail: 100}, True, prompt), ({lead: 100}, False, prompt[:-1])]
    for (bias, echo, ids_in), stream in [(case, stream) for case in cases for stream in (False, True)]:
        answer = client(server).completions.create(
            model="gpt2", prompt=ids_in, max_tokens=3, temperature=0, echo=echo, stream=stream,
            logit_bias={str(token): value for token, value in bias.items()},
            extra_body={"return_token_ids": True},
        )  # fmt: skip
        chunks = [chunk.choices[0] for chunk in answer if chunk.choices] if stream else answer.choices
        ids = [token for chunk in chunks for token in chunk.model_extra["token_ids"] or []]
        text = "".join(chunk.text for chunk in chunks)
        assert ids[0] == next(iter(bias)), "the bias picks the first token"
        wanted = tokenizer.decode(ids, skip_special_tokens=True)
        assert "\ufffd" in wanted  # the case this is about
        front = tokenizer.decode(ids_in, skip_special_tokens=True) if echo else ""
        assert text == front + wanted, (bias, echo, stream)


def streamed_events(server, options: dict[str, Any]) -> list[dict[str, Any]]:
    """The JSON events of a streamed greedy completion of 5 tokens after "The cat", read raw."""
    body = {"model": "gpt2", "prompt": "The cat", "max_tokens": 5, "temperature": 0, "stream": True}
    key = {"Authorization": f"Bearer {server.api_key}"} if server.api_key else {}
    request = urllib.request.Request(
        f"{server.url}/v1/completions",
        json.dumps({**body, **options}).encode(),
        {"Content-Type": "application/json", **key},
    )
    with urllib.request.urlopen(request, timeout=120) as answer:
        lines = [line.decode().strip() for line in answer]
    return [json.loads(line[len("data: ") :]) for line in lines if line.startswith("data: {")]


def test_every_streamed_chunk_carries_usage_null_before_the_last(server):
    """OpenAI's `include_usage`: `usage` is null on every chunk but the last, which has no choices."""
    events = streamed_events(server, {"stream_options": {"include_usage": True}})
    assert len(events) >= 2 and all(event["usage"] is None and event["choices"] for event in events[:-1])
    assert events[-1]["choices"] == [] and events[-1]["usage"]["completion_tokens"] == 5


def test_continuous_usage_counts_the_tokens_of_every_chunk_so_far(server):
    """vLLM's `continuous_usage_stats`: each chunk's `usage` counts the tokens sent so far, to the
    last's totals; asked without `include_usage` (which vLLM would ignore) it is refused by name."""
    events = streamed_events(
        server, {"stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    )
    sent, prompt = 0, events[-1]["usage"]["prompt_tokens"]
    for event in events[:-1]:
        sent += len(event["choices"][0]["token_ids"]) if "token_ids" in event["choices"][0] else 0
        assert event["usage"]["prompt_tokens"] == prompt
    counts = [event["usage"]["completion_tokens"] for event in events]
    assert counts == [1, 2, 3, 4, 5, 5] and events[-1]["choices"] == []  # a token an event, as vLLM's
    status, answer = post(
        server,
        "/v1/completions",
        {"prompt": "x", "stream": True, "stream_options": {"continuous_usage_stats": True}},
    )
    assert status == 400 and answer["error"]["param"] == "stream_options.continuous_usage_stats", answer


def test_openais_newer_client_fields_are_taken_or_refused_by_name(server):
    """`safety_identifier` (`user`'s successor) and `prompt_cache_key` change nothing here and are
    taken, as is a stream without OpenAI's padding (`include_obfuscation: false`); `verbosity` and
    padding ask for what this server does not do and are refused naming them."""
    taken = {"safety_identifier": "u-1", "prompt_cache_key": "k"}
    assert chat(server, [{"role": "user", "content": "hi"}], max_tokens=2, extra_body=taken).choices
    status, answer = post(server, "/v1/completions", {"prompt": "x", "max_tokens": 2, "verbosity": "low"})
    assert status == 400 and answer["error"]["param"] == "verbosity", answer
    unpadded = {"stream_options": {"include_usage": True, "include_obfuscation": False}}
    events = streamed_events(server, unpadded)
    assert events[-1]["usage"]["completion_tokens"] == 5 and all("obfuscation" not in e for e in events)
    padded = {"prompt": "x", "stream": True, "stream_options": {"include_obfuscation": True}}
    status, answer = post(server, "/v1/completions", padded)
    assert status == 400 and answer["error"]["param"] == "stream_options.include_obfuscation", answer


def test_a_long_tokenization_leaves_other_requests_answered_meanwhile(server):
    """A text of a million words to tokenize takes seconds; a `/health` sent while it runs is answered
    before it ends (the tokenizer runs beside the event loop, as MAX's own encoding does)."""
    ended: list[float] = []

    def tokenize() -> None:
        status, answer = post(server, "/tokenize", {"content": "a " * 1_000_000})
        assert status == 200 and answer["count"] >= 1_000_000
        ended.append(time.monotonic())

    worker = threading.Thread(target=tokenize)
    worker.start()
    time.sleep(0.3)  # the request is in: its body is read and parsed in well under this
    with urllib.request.urlopen(f"{server.url}/health", timeout=120) as health:
        assert health.status == 200
        answered = time.monotonic()
    worker.join()
    assert ended and answered < ended[0], "the tokenization ended first: the health check waited for it"

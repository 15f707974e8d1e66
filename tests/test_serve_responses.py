"""`POST /v1/responses` through the real server and the `openai` client's own Responses API: each answer
is the chat completion of the same messages (greedy, on the same server), in OpenAI's response shape
and its stream of events, and what the route cannot honour is a 400 naming the field."""

from __future__ import annotations

from typing import Any

import pytest

from tests.support import requires_serving
from tests.test_serve import client
from tests.test_serve_api import post as posted

pytestmark = requires_serving()

MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "The cat"}]
PET = {"type": "object", "properties": {"kind": {"enum": ["cat", "dog"]}}, "required": ["kind"]}


@pytest.fixture(scope="module")
def server(served_lm):
    return served_lm


def chat(server, **options: Any) -> Any:
    return client(server).chat.completions.create(model="gpt2", messages=MESSAGES, temperature=0, **options)


@pytest.mark.parametrize("length", [3, 40])
def test_a_response_is_the_chat_completion_of_its_messages(server, length):
    expected = chat(server, max_completion_tokens=length)
    parts = [{"type": "input_text", "text": "The cat"}]
    for given in (
        "The cat",
        [{"role": "user", "content": parts}],
        [{"type": "message", "role": "user", "content": "The cat"}],
    ):
        answer = client(server).responses.create(
            model="gpt2", instructions="Be brief.", input=given, max_output_tokens=length, temperature=0
        )
        assert answer.output_text == expected.choices[0].message.content
        cut = expected.choices[0].finish_reason == "length"
        assert answer.status == ("incomplete" if cut else "completed")
        assert (answer.incomplete_details.reason if cut else answer.incomplete_details) == (
            "max_output_tokens" if cut else None
        )
        usage = expected.usage
        assert (answer.usage.input_tokens, answer.usage.output_tokens) == (
            usage.prompt_tokens,
            usage.completion_tokens,
        )
        assert answer.output[0].role == "assistant" and answer.object == "response"


def test_openais_caching_and_stream_options_are_taken(server):
    """`prompt_cache_retention`, `prompt_cache_options` implicit and `stream_options` without obfuscation
    change nothing of the text, whole or streamed."""
    asked = {"model": "gpt2", "input": "The cat", "max_output_tokens": 4, "temperature": 0}
    plain = client(server).responses.create(**asked).output_text
    cached = {"prompt_cache_retention": "24h", "prompt_cache_options": {"mode": "implicit", "ttl": "30m"}}
    assert client(server).responses.create(**asked, **cached).output_text == plain
    events = client(server).responses.create(
        **asked, stream=True, stream_options={"include_obfuscation": False}
    )
    assert "".join(event.delta for event in events if event.type == "response.output_text.delta") == plain


def test_a_streamed_response_comes_as_openais_events_in_order(server):
    expected = chat(server, max_completion_tokens=8).choices[0].message.content
    events = list(
        client(server).responses.create(
            model="gpt2",
            instructions="Be brief.",
            input="The cat",
            max_output_tokens=8,
            temperature=0,
            stream=True,
        )
    )
    kinds = [event.type for event in events]
    opening = [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    closing = ["response.output_text.done", "response.content_part.done", "response.output_item.done"]
    assert kinds[:4] == opening and kinds[-4:-1] == closing
    assert kinds[-1] in ("response.completed", "response.incomplete")
    assert set(kinds[4:-4]) == {"response.output_text.delta"}
    assert [event.sequence_number for event in events] == list(range(len(events)))
    assert "".join(event.delta for event in events[4:-4]) == expected == events[-1].response.output_text


def test_a_text_format_holds_the_response_as_the_chat_holds_it(server):
    form = {"type": "json_schema", "name": "pet", "schema": PET}
    answer = client(server).responses.create(
        model="gpt2",
        instructions="Be brief.",
        input="The cat",
        max_output_tokens=24,
        temperature=0,
        text={"format": form},
    )
    schema = {"type": "json_schema", "json_schema": {"name": "pet", "schema": PET}}
    assert (
        answer.output_text
        == chat(server, max_completion_tokens=24, response_format=schema).choices[0].message.content
    )


LOGPROBS = ["message.output_text.logprobs"]


def test_included_logprobs_are_the_chats_whole_and_streamed(server):
    expected = chat(server, max_completion_tokens=6, logprobs=True, top_logprobs=2).choices[0]
    entries = [entry.model_dump() for entry in expected.logprobs.content]
    assert len(entries) == 6 and all(len(entry["top_logprobs"]) == 2 for entry in entries)
    request = {"model": "gpt2", "instructions": "Be brief.", "input": "The cat", "max_output_tokens": 6}
    asked = {**request, "temperature": 0, "include": LOGPROBS, "top_logprobs": 2}
    answer = client(server).responses.create(**asked)
    assert [entry.model_dump() for entry in answer.output[0].content[0].logprobs] == entries
    events = list(client(server).responses.create(**asked, stream=True))
    deltas = [
        entry for event in events if event.type == "response.output_text.delta" for entry in event.logprobs
    ]
    assert [entry.model_dump(exclude_none=True) for entry in deltas] == entries
    (done,) = [event for event in events if event.type == "response.output_text.done"]
    assert [entry.model_dump(exclude_none=True) for entry in done.logprobs] == entries
    plain = client(server).responses.create(**request, temperature=0)  # none unless included
    assert plain.output[0].content[0].logprobs == []


PET_TOOL = {"type": "function", "name": "pet", "parameters": PET}


def test_a_function_named_is_called_as_the_chat_calls_it_whole_and_streamed(server):
    tools = [{"type": "function", "function": {"name": "pet", "parameters": PET}}]
    named = {"type": "function", "function": {"name": "pet"}}
    expected = client(server).chat.completions.create(
        model="gpt2",
        messages=[{"role": "user", "content": "The cat"}],
        temperature=0,
        max_tokens=24,
        tools=tools,
        tool_choice=named,
    )
    arguments = expected.choices[0].message.tool_calls[0].function.arguments
    asked = {
        "model": "gpt2",
        "input": "The cat",
        "max_output_tokens": 24,
        "temperature": 0,
        "tools": [PET_TOOL],
    }
    asked["tool_choice"] = {"type": "function", "name": "pet"}
    answer = client(server).responses.create(**asked)
    (item,) = answer.output
    assert (item.type, item.name, item.arguments, item.status) == (
        "function_call",
        "pet",
        arguments,
        "completed",
    )
    assert item.call_id.startswith("call_") and answer.status == "completed"
    events = list(client(server).responses.create(**asked, stream=True))
    kinds = [event.type for event in events]
    assert kinds[:3] == ["response.created", "response.in_progress", "response.output_item.added"]
    assert kinds[-3:] == [
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert set(kinds[3:-3]) == {"response.function_call_arguments.delta"}
    assert "".join(event.delta for event in events[3:-3]) == arguments == events[-3].arguments
    assert events[-1].response.output[0].call_id == events[2].item.call_id == events[-2].item.call_id


def test_a_conversations_function_calls_and_outputs_count_as_the_chats_tool_calls(server):
    call = {"type": "function_call", "call_id": "call_1", "name": "pet", "arguments": '{"kind": "cat"}'}
    given = [
        {"role": "user", "content": "The cat"},
        call,
        {"type": "function_call_output", "call_id": "call_1", "output": "ok"},
    ]
    body = {"input": given, "tools": [PET_TOOL], "tool_choice": "none"}
    counted = posted(server, "/v1/responses/input_tokens", body)[1]
    made = {"id": "call_1", "type": "function", "function": {"name": "pet", "arguments": '{"kind": "cat"}'}}
    chat = [
        {"role": "user", "content": "The cat"},
        {"role": "assistant", "content": None, "tool_calls": [made]},
        {"role": "tool", "tool_call_id": "call_1", "content": "ok"},
    ]
    assert counted["input_tokens"] == posted(server, "/tokenize", {"messages": chat})[1]["count"], counted


@pytest.mark.parametrize(
    ("change", "field", "says"),
    [
        ({"store": True}, "store", "not stored here"),
        ({"previous_response_id": "resp_1"}, "previous_response_id", "send the conversation as input"),
        ({"tools": [{"type": "function", "name": "f"}]}, "tool_choice", "decides no tool call by itself"),
        (
            {"tools": [{"type": "web_search"}], "tool_choice": "required"},
            "tools",
            "tools[0]: GPT-2 runs no hosted",
        ),
        ({"input": [{"type": "function_call", "name": "f"}]}, "input", "input[0].call_id: required"),
        ({"reasoning": {"effort": "low"}}, "reasoning", "does not reason"),
        ({"truncation": "auto"}, "truncation", "only 'disabled'"),
        ({"text": {"verbosity": "low"}}, "text", "text.verbosity"),
        (
            {"input": [{"type": "image_generation_call", "result": "x"}]},
            "input",
            "input[0]: GPT-2 reads messages, function calls and their outputs only",
        ),
        ({"input": [{"role": "tool", "content": "x"}]}, "input", "input[0].role"),
        ({"temperature": 3}, "temperature", "between 0 and 2"),
        ({"max_output_tokens": -1}, "max_output_tokens", "at least 1"),
        ({"include": ["reasoning.encrypted_content"]}, "include", "include[0]: only"),
        ({"top_logprobs": 2}, "top_logprobs", "needs include"),
        ({"include": LOGPROBS, "top_logprobs": 21}, "top_logprobs", "0 to 20"),
        ({"moderation": {"model": "omni-moderation-latest"}}, "moderation", "no moderation model"),
        ({"context_management": [{"type": "compaction"}]}, "context_management", "not managed here"),
        (
            {"stream": True, "stream_options": {"include_obfuscation": True}},
            "stream_options",
            "no event is padded",
        ),
        ({"stream_options": {"include_obfuscation": False}}, "stream_options", "only with stream: true"),
        ({"prompt_cache_options": {"ttl": "1h"}}, "prompt_cache_options.ttl", "'30m'"),
    ],
)
def test_what_a_response_cannot_honour_is_refused_naming_the_field(server, change, field, says):
    import openai

    request = {"model": "gpt2", "input": "The cat", "max_output_tokens": 2, **change}
    with pytest.raises(openai.BadRequestError) as refused:
        client(server).responses.create(**request)
    assert refused.value.param == field and says in refused.value.message

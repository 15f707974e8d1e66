"""Anthropic's `POST /v1/messages` and the token-counting routes, through the real server: each message
is the chat completion of the same conversation (greedy, on the same server, through the `openai`
client) in Anthropic's documented shape and stream of events; what it cannot honour is Anthropic's
400 error naming the field; the counts are the chat's own `usage.prompt_tokens`."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from tests.support import requires_serving
from tests.test_serve import client

pytestmark = requires_serving()

SYSTEM = "Be brief."
TURNS = [{"role": "user", "content": "The cat"}]
CHAT = [{"role": "system", "content": SYSTEM}, *TURNS]
PET = {"type": "object", "properties": {"kind": {"enum": ["cat", "dog"]}}, "required": ["kind"]}


@pytest.fixture(scope="module")
def server(served_lm):
    return served_lm


def post(server, route: str, body: dict[str, Any], **headers: str) -> httpx.Response:
    return httpx.post(f"{server.url}{route}", json=body, headers=headers, timeout=120)


def message(server, **fields: Any) -> dict[str, Any]:
    body = {"model": "gpt2", "system": SYSTEM, "messages": TURNS, "temperature": 0, **fields}
    answer = post(server, "/v1/messages", body)
    assert answer.status_code == 200, answer.text
    return answer.json()


def chat(server, messages: list[dict[str, str]] = CHAT, **options: Any) -> Any:
    answer = client(server).chat.completions.create(model="gpt2", messages=messages, temperature=0, **options)
    return answer.choices[0], answer.usage


@pytest.mark.parametrize("length", [3, 40])
def test_a_message_is_the_chat_completion_of_its_conversation(server, length):
    expected, usage = chat(server, max_completion_tokens=length)
    blocks = [{"type": "text", "text": "Be "}, {"type": "text", "text": "brief.", "cache_control": {}}]
    for system, content in ((SYSTEM, "The cat"), (blocks, [{"type": "text", "text": "The cat"}])):
        answer = message(
            server, system=system, messages=[{"role": "user", "content": content}], max_tokens=length
        )
        assert answer["content"] == [{"type": "text", "text": expected.message.content}]
        assert (answer["type"], answer["role"], answer["model"]) == ("message", "assistant", "gpt2")
        assert answer["stop_reason"] == ("max_tokens" if expected.finish_reason == "length" else "end_turn")
        assert answer["stop_sequence"] is None and answer["id"].startswith("msg_")
        spent = answer["usage"]
        assert spent["input_tokens"] + spent["cache_read_input_tokens"] == usage.prompt_tokens
        assert spent["output_tokens"] == usage.completion_tokens


def test_a_stop_sequence_ends_the_text_and_is_named(server):
    whole = chat(server, max_completion_tokens=24)[0].message.content
    stop = whole[len(whole) // 2 : len(whole) // 2 + 2]
    expected = chat(server, max_completion_tokens=24, stop=[stop])[0]
    answer = message(server, max_tokens=24, stop_sequences=["\x00never", stop])
    assert answer["content"][0]["text"] == expected.message.content == whole[: whole.index(stop)]
    assert (answer["stop_reason"], answer["stop_sequence"]) == ("stop_sequence", stop)


def test_a_last_assistant_turn_is_continued_as_anthropics_prefill(server):
    turns = [*TURNS, {"role": "assistant", "content": "Well,"}]
    expected = chat(
        server,
        [*CHAT, turns[-1]],
        max_completion_tokens=6,
        extra_body={"add_generation_prompt": False, "continue_final_message": True},
    )[0]
    assert message(server, messages=turns, max_tokens=6)["content"][0]["text"] == expected.message.content


def test_an_output_format_holds_the_message_as_the_chat_holds_it(server):
    schema = {"type": "json_schema", "json_schema": {"name": "pet", "schema": PET}}
    expected = chat(server, max_completion_tokens=24, response_format=schema)[0].message.content
    form = {"format": {"type": "json_schema", "schema": PET}}
    assert message(server, max_tokens=24, output_config=form)["content"][0]["text"] == expected


TOOLS = [{"name": "pet", "description": "a pet", "input_schema": PET}]
PET_CALL = {"type": "function", "function": {"name": "pet"}}


def test_a_tool_named_is_used_as_the_chat_calls_it(server):
    """`tool_choice` naming a tool: a `tool_use` block whose input is the chat's named call's arguments."""
    openai_tools = [{"type": "function", "function": {"name": "pet", "parameters": PET}}]
    expected = chat(server, TURNS, tools=openai_tools, tool_choice=PET_CALL, max_completion_tokens=24)[0]
    arguments = json.loads(expected.message.tool_calls[0].function.arguments)
    named = {
        "tools": TOOLS,
        "tool_choice": {"type": "tool", "name": "pet"},
    }  # no system: the room 48 positions leave
    answer = message(server, system=None, max_tokens=24, **named)
    (block,) = answer["content"]
    assert (block["type"], block["name"], block["input"]) == ("tool_use", "pet", arguments)
    assert block["id"].startswith("toolu_") and answer["stop_reason"] == "tool_use"
    body = {"model": "gpt2", "messages": TURNS, "temperature": 0, "max_tokens": 24, **named}
    stream = events(post(server, "/v1/messages", {**body, "stream": True}))
    kinds = [kind for kind, _ in stream]
    assert kinds[:3] == ["message_start", "ping", "content_block_start"]
    assert kinds[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert stream[2][1]["content_block"] | {"id": ""} == {
        "type": "tool_use",
        "id": "",
        "name": "pet",
        "input": {},
    }
    partial = "".join(data["delta"]["partial_json"] for kind, data in stream if kind == "content_block_delta")
    assert json.loads(partial) == arguments and stream[-2][1]["delta"]["stop_reason"] == "tool_use"


def test_a_conversation_with_tool_use_and_results_is_the_chats_with_calls(server):
    """An assistant's `tool_use` and a user's `tool_result` count as the chat's tool call and result."""
    used = {"type": "tool_use", "id": "toolu_1", "name": "pet", "input": {"kind": "cat"}}
    result = {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "ok"}]}
    turns = [
        *TURNS,
        {"role": "assistant", "content": [used]},
        {"role": "user", "content": [result, {"type": "text", "text": "more"}]},
    ]
    call = {"id": "toolu_1", "type": "function", "function": {"name": "pet", "arguments": '{"kind": "cat"}'}}
    same = [
        *CHAT,
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "toolu_1", "content": "ok"},
        {"role": "user", "content": "more"},
    ]
    counted = post(
        server, "/v1/messages/count_tokens", {"model": "gpt2", "system": SYSTEM, "messages": turns}
    )
    tokens = post(
        server, "/tokenize", {"model": "gpt2", "messages": same}
    ).json()  # past the context: counted
    assert counted.json() == {"input_tokens": tokens["count"]}


def events(answer: httpx.Response) -> list[tuple[str, dict[str, Any]]]:
    """Server-sent events as (event, data) pairs, each data's `type` its event's name."""
    found = []
    for block in answer.text.strip().split("\n\n"):
        fields = dict(line.split(": ", 1) for line in block.splitlines() if ": " in line)
        data = json.loads(fields["data"])
        assert data["type"] == fields["event"]
        found.append((fields["event"], data))
    return found


def test_a_streamed_message_comes_as_anthropics_events_in_order(server):
    whole = message(server, max_tokens=8)
    body = {"model": "gpt2", "system": SYSTEM, "messages": TURNS, "temperature": 0, "max_tokens": 8}
    answer = post(server, "/v1/messages", {**body, "stream": True})
    assert answer.headers["content-type"].startswith("text/event-stream")
    stream = events(answer)
    kinds = [kind for kind, _ in stream]
    assert kinds[:3] == ["message_start", "content_block_start", "ping"]
    assert kinds[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert set(kinds[3:-3]) == {"content_block_delta"}
    begun = stream[0][1]["message"]
    assert begun["content"] == [] and begun["stop_reason"] is None and begun["usage"]["output_tokens"] == 0
    assert stream[1][1]["content_block"] == {"type": "text", "text": ""}
    deltas = [data["delta"] for _, data in stream[3:-3]]
    assert {delta["type"] for delta in deltas} == {"text_delta"}
    assert "".join(delta["text"] for delta in deltas) == whole["content"][0]["text"]
    ended = stream[-2][1]
    assert ended["delta"] == {"stop_reason": whole["stop_reason"], "stop_sequence": None}
    assert ended["usage"] == whole["usage"]


def test_the_counting_routes_give_the_chats_prompt_size(server):
    prompt = chat(server, max_completion_tokens=1)[1].prompt_tokens
    counted = post(
        server, "/v1/messages/count_tokens", {"model": "gpt2", "system": SYSTEM, "messages": TURNS}
    )
    assert counted.json() == {"input_tokens": prompt}
    for route, body in (
        ("/v1/chat/completions/input_tokens", {"messages": CHAT}),
        ("/v1/responses/input_tokens", {"instructions": SYSTEM, "input": "The cat"}),
    ):
        assert post(server, route, body).json() == {"object": "response.input_tokens", "input_tokens": prompt}


@pytest.mark.parametrize(
    ("change", "says"),
    [
        (
            {"tools": [{"name": "f", "input_schema": {"type": "object"}}]},
            "tool_choice: GPT-2 decides no tool",
        ),
        (
            {"tools": [{"type": "web_search_20250305", "name": "web_search"}]},
            "tools[0]: must be a client tool",
        ),
        ({"thinking": {"type": "enabled", "budget_tokens": 1024}}, "thinking: GPT-2 does not think"),
        ({"tool_choice": {"type": "any"}}, "tool_choice: give tools to choose from"),
        ({"output_config": {"effort": "low"}}, "output_config.effort"),
        ({"max_tokens": None}, "max_tokens: required"),
        ({"max_tokens": -1}, "max_tokens: must be at least 1"),
        ({"stop_sequences": "x"}, "stop_sequences"),
        ({"temperature": 3}, "temperature"),
        ({"temperature": 1.5}, "temperature: must be between 0 and 1; got 1.5"),  # Anthropic's range
        ({"output_config": {"format": {"type": "json_schema", "schema": 1}}}, "output_config.format"),
        ({"messages": []}, "messages: empty"),
        (
            {"messages": [{"role": "system", "content": "x"}]},
            "messages[0].role: must be 'user' or 'assistant'",
        ),
        ({"messages": [{"role": "user", "content": "x", "id": 1}]}, "messages[0].id"),
        ({"system": [{"type": "image", "source": {}}]}, "system[0]: GPT-2 reads text only"),
        (
            {"messages": [{"role": "user", "content": [{"type": "tool_result", "content": "4"}]}]},
            "messages[0].content[0].tool_use_id: required",
        ),
        ({"speed": "fast"}, "speed"),
        ({"top_logprobs": 2}, "top_logprobs: not a field this route takes"),
    ],
)
def test_what_a_message_cannot_honour_is_anthropics_error_naming_the_field(server, change, says):
    body = {"model": "gpt2", "messages": TURNS, "max_tokens": 2, **change}
    answer = post(server, "/v1/messages", {key: value for key, value in body.items() if value is not None})
    assert answer.status_code == 400
    refused = answer.json()
    assert refused["type"] == "error" and refused["error"]["type"] == "invalid_request_error"
    assert refused["error"]["message"].startswith(says.split(":")[0]) and says in refused["error"]["message"]


def test_an_unknown_model_and_a_missing_key_are_anthropics_errors(server, served_q4_0_lm):
    answer = post(server, "/v1/messages", {"model": "claude", "messages": TURNS, "max_tokens": 2})
    assert answer.status_code == 404 and answer.json()["error"]["type"] == "not_found_error"
    keyed, body = served_q4_0_lm, {"model": "gpt2", "messages": TURNS}
    refused = post(keyed, "/v1/messages/count_tokens", body)
    assert refused.status_code == 401 and refused.json()["error"]["type"] == "authentication_error"
    # Anthropic's header bears the key (this server has no chat template: its refusal is past the key)
    bare = post(keyed, "/v1/messages/count_tokens", body, **{"x-api-key": keyed.api_key})
    assert bare.status_code == 400 and "no chat template" in bare.json()["error"]["message"]


def test_the_peers_routes_not_served_say_why(server):
    for route, why in (
        ("/infill", "fill-in-the-middle"),
        ("/v1/embeddings", "started with --embeddings"),
        ("/v1/load_lora_adapter", "merged into the weights at start"),  # vLLM's, at run time
    ):
        answer = post(server, route, {"input": "x"})
        assert answer.status_code == 404 and why in answer.json()["error"]["message"]

"""Tools called by name or as required, through the real server and the `openai` client, as vLLM calls
them: a named call's arguments are the text the same chat gives held to the function's schema by
`response_format` (greedy, same server); required calls each validate against their tool's schema
(`jsonschema`); streamed calls add up to the whole ones; a conversation carrying calls and their
results renders as the template renders it here."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import max_gpt2
from tests.support import requires_serving
from tests.test_serve import client
from tests.test_serve_api import render

pytestmark = requires_serving()
jsonschema = pytest.importorskip("jsonschema", reason="jsonschema checks each call's arguments")

MESSAGES = [{"role": "user", "content": "The cat"}]
PET = {"type": "object", "properties": {"kind": {"enum": ["cat", "dog"]}}, "required": ["kind"]}
COUNT = {
    "type": "object",
    "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9}},
    "required": ["n"],
}
TOOLS = [
    {"type": "function", "function": {"name": "pet", "parameters": PET}},
    {"type": "function", "function": {"name": "count", "description": "a digit", "parameters": COUNT}},
]
SCHEMAS = {"pet": PET, "count": COUNT}


@pytest.fixture(scope="module")
def server(served_pages_lm):
    return served_pages_lm  # 512 positions: room for a call's JSON, a character a token or so; ChatML


def chat(server, **options: Any) -> Any:
    options = {"model": "gpt2", "messages": MESSAGES, "temperature": 0, "max_tokens": 120, **options}
    return client(server).chat.completions.create(**options)


def test_a_named_call_is_the_text_held_to_its_functions_schema(server):
    held = chat(
        server, response_format={"type": "json_schema", "json_schema": {"name": "pet", "schema": PET}}
    )
    answer = chat(server, tools=TOOLS, tool_choice={"type": "function", "function": {"name": "pet"}})
    choice = answer.choices[0]
    (call,) = choice.message.tool_calls
    assert (call.type, call.function.name, call.id[:5]) == ("function", "pet", "call_")
    assert call.function.arguments == held.choices[0].message.content
    jsonschema.validate(json.loads(call.function.arguments), PET)
    assert choice.message.content is None and choice.finish_reason == "stop"  # OpenAI's for a named call
    assert answer.usage.prompt_tokens == held.usage.prompt_tokens  # ChatML shows no tools


@pytest.mark.parametrize("parallel", [True, False])
def test_required_calls_each_hold_to_their_tools_schema(server, parallel):
    """Without `parallel_tool_calls: false` this model goes on calling until the length cuts it: the
    calls made whole by then come back."""
    answer = chat(server, tools=TOOLS, tool_choice="required", parallel_tool_calls=parallel, max_tokens=120)
    choice = answer.choices[0]
    assert choice.finish_reason == ("length" if parallel else "tool_calls") and choice.message.content is None
    calls = choice.message.tool_calls
    assert len(calls) > 1 if parallel else len(calls) == 1
    for call in calls:
        jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])
    assert len({call.id for call in calls}) == len(calls)


def test_streamed_calls_add_up_to_the_whole_ones(server):
    for choice in ({"type": "function", "function": {"name": "count"}}, "required"):
        whole = chat(server, tools=TOOLS, tool_choice=choice).choices[0]
        chunks = list(chat(server, tools=TOOLS, tool_choice=choice, stream=True))
        calls: dict[int, dict[str, str]] = {}
        for chunk in chunks:
            for delta in chunk.choices[0].delta.tool_calls or ():
                made = calls.setdefault(delta.index, {"name": "", "arguments": ""})
                if delta.id is not None:
                    assert delta.id.startswith("call_") and delta.type == "function"
                    made["name"] = delta.function.name
                made["arguments"] += delta.function.arguments or ""
            assert not chunk.choices[0].delta.content
        expected = [
            {"name": c.function.name, "arguments": c.function.arguments} for c in whole.message.tool_calls
        ]
        assert [calls[index] for index in sorted(calls)] == expected, choice
        assert chunks[-1].choices[0].finish_reason == whole.finish_reason


def test_none_answers_in_text_and_a_conversation_with_calls_renders_as_its_template(server):
    from max_gpt2.inference.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(server.checkpoint)
    plain = chat(server).choices[0].message.content
    assert chat(server, tools=TOOLS, tool_choice="none").choices[0].message.content == plain
    made = {"id": "call_1", "type": "function", "function": {"name": "count", "arguments": '{"n": 3}'}}
    history = [
        *MESSAGES,
        {"role": "assistant", "content": None, "tool_calls": [made]},
        {"role": "tool", "tool_call_id": "call_1", "content": "3 cats"},
    ]
    answer = chat(server, messages=history, tools=TOOLS, tool_choice="none", max_tokens=2)
    shown = [*MESSAGES, {"role": "assistant", "content": ""}, {"role": "tool", "content": "3 cats"}]
    template = (Path(max_gpt2.__file__).parent / "serving" / "templates" / "chatml.jinja").read_text()
    assert answer.usage.prompt_tokens == len(tokenizer.encode(render(shown, template)).ids)


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"tool_choice": {"type": "function", "function": {"name": "fly"}}}, "'fly' is none of the tools"),
        ({"tool_choice": "auto"}, "decides no tool call by itself"),
        (
            {"tools": [{"type": "function", "function": {"name": "x", "parameters": 3}}]},
            "parameters: must be",
        ),
    ],
)
def test_what_tools_cannot_do_is_refused_naming_the_field(server, change, says):
    import openai

    with pytest.raises(openai.BadRequestError) as refused:
        chat(server, **{"tools": TOOLS, "tool_choice": "required", **change})
    assert refused.value.param in ("tools", "tool_choice") and says in refused.value.message


LEAVES = st.one_of(st.text(alphabet='ab{}[]",:\\ é'), st.integers(), st.booleans(), st.none())
VALUES = st.recursive(
    LEAVES,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3),
)


@given(
    st.lists(st.dictionaries(st.text(alphabet='{}[]"\\x', max_size=4), VALUES, max_size=3), max_size=4),
    st.data(),
)
def test_a_streamed_arrays_items_come_each_once_whole(items, data):
    """`Items` (a required call's objects as their text comes) against `json.loads` of the whole array,
    the text cut anywhere: inside strings holding brackets, quotes and escapes."""
    from max_gpt2.serving.api.tools import Items

    text = json.dumps(items, ensure_ascii=False)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(text)), max_size=6)))
    pieces = [text[start:end] for start, end in zip([0, *cuts], [*cuts, len(text)], strict=True)]
    scanner, found = Items(), []
    for piece in pieces:
        found += scanner.add(piece)
    assert found == json.loads(text)

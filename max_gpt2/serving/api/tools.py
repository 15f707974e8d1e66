"""OpenAI's `tools`, called by name or as required, as vLLM calls them: the text held to a JSON schema.

GPT-2 decides no tool call by itself (vLLM's `auto` needs a model-specific parser), but a
request may make the call: `tool_choice: {"type": "function", "function": {"name": ...}}` holds
the text to that function's `parameters` schema, and the answer is one call with the text as its
`arguments`; `tool_choice: "required"` holds it to a JSON array of `{"name", "parameters"}`
objects, one of the tools each (at most one with `parallel_tool_calls: false`), and the answer
is a call an item. `none` answers in text. The tools go to the chat template as vLLM passes them.

The answer follows OpenAI's: `content` null, `tool_calls` with `call_` ids, `finish_reason`
"stop" for a named function and "tool_calls" for required ones ("length" where the length cut
the text: a named call's arguments then as far as they came, the required calls made whole so
far). Streamed, a named call's first delta carries its id, type and name, the next ones the
arguments as they come; a required call comes whole once its object is complete.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any

from max_gpt2.inference.constraints import Constraint
from max_gpt2.serving.api.protocol import ChatRequest, Refusal

NO_PARAMETERS = {"type": "object", "properties": {}}  # a function that takes none: `{}`


@dataclass(frozen=True)
class ToolCalls:
    """How a request calls its tools: the function `tool_choice` names, or None for "required"."""

    named: str | None

    def constraint(self, tools: dict[str, dict[str, Any]], parallel: bool) -> Constraint:
        """The schema the text is held to: the named function's parameters, or an array of calls."""
        if self.named is not None:
            return Constraint.json_schema(tools[self.named])
        definitions: dict[str, Any] = {}
        calls = []
        for name, schema in tools.items():
            schema = dict(schema)
            for key, value in schema.pop("$defs", {}).items():
                if definitions.setdefault(key, value) != value:
                    raise Refusal("tools", f"tools: two tools define '$defs.{key}' differently")
            properties = {"name": {"type": "string", "enum": [name]}, "parameters": schema}
            calls.append({"properties": properties, "required": ["name", "parameters"]})
        array = {"type": "array", "minItems": 1, "items": {"type": "object", "anyOf": calls}}
        return Constraint.json_schema(
            array | ({"maxItems": 1} if not parallel else {}) | {"$defs": definitions}
        )

    def calls(self, text: str) -> list[dict[str, Any]]:
        """The calls `text` makes, in OpenAI's shape: a named call's arguments as far as they came, the
        required calls whole so far (those the stream sent)."""
        if self.named is not None:
            return [call(self.named, text)]
        return [required(item) for item in Items().add(text)]

    def finish(self, reason: str) -> str:
        """OpenAI's `finish_reason`: a required call's "stop" is "tool_calls"."""
        return "tool_calls" if reason == "stop" and self.named is None else reason


def call(name: str, arguments: str) -> dict[str, Any]:
    return {
        "id": f"call_{uuid.uuid4().hex}",
        "type": "function",
        "function": {"name": name, "arguments": arguments},
    }


def required(item: dict[str, Any]) -> dict[str, Any]:
    """A required call's item (`{"name", "parameters"}`) as OpenAI's call, its parameters as JSON text."""
    return call(item["name"], json.dumps(item["parameters"], ensure_ascii=False))


def tool_calls_of(body: ChatRequest) -> tuple[ToolCalls, Constraint] | None:
    """How `body` calls its tools and the constraint that makes it; None where it calls none; a
    `Refusal` naming `tools` or `tool_choice` where they do not fit (vLLM's checks)."""
    choice = body.tool_choice
    if body.tools is None or choice == "none":
        if choice not in (None, "none"):
            raise Refusal("tool_choice", "tool_choice: give tools to choose from, or leave it out")
        return None
    tools = parameters_of(body.tools)
    if choice in (None, "auto"):
        raise Refusal(
            "tool_choice",
            'tool_choice: GPT-2 decides no tool call by itself; name a function ({"type": "function", '
            '"function": {"name": ...}}), give "required", or "none"',
        )
    if choice == "required":
        calls = ToolCalls(None)
    elif isinstance(choice, dict) and choice.get("type") == "function":
        name = (choice.get("function") or {}).get("name")
        if name not in tools:
            raise Refusal("tool_choice", f"tool_choice: {name!r} is none of the tools ({', '.join(tools)})")
        calls = ToolCalls(name)
    else:
        raise Refusal("tool_choice", f'tool_choice: "none", "required" or a named function; got {choice!r}')
    return calls, calls.constraint(tools, body.parallel_tool_calls is not False)


def parameters_of(tools: list[Any]) -> dict[str, dict[str, Any]]:
    """Each function tool's `parameters` schema by its name; a `Refusal` naming the first that is not one."""
    if not tools:
        raise Refusal("tools", "tools: empty; give at least one, or leave it out")
    found: dict[str, dict[str, Any]] = {}
    for index, tool in enumerate(tools):
        function = tool.get("function") if isinstance(tool, dict) and tool.get("type") == "function" else None
        name = function.get("name") if isinstance(function, dict) else None
        if not isinstance(name, str) or not name:
            raise Refusal(
                "tools", f'tools[{index}]: must be {{"type": "function", "function": {{"name": ...}}}}'
            )
        schema = function.get("parameters") or NO_PARAMETERS
        if not isinstance(schema, dict):
            raise Refusal("tools", f"tools[{index}].function.parameters: must be a JSON schema object")
        found[name] = schema
    return found


class ToolStream:
    """One streamed choice's tool calls, as deltas: a named call's arguments as they come, required
    calls each once its object is whole."""

    def __init__(self, calls: ToolCalls) -> None:
        self.calls, self.items, self.sent = calls, Items(), 0

    def delta(self, text: str) -> list[dict[str, Any]]:
        """The `tool_calls` entries of a delta that adds `text`."""
        if self.calls.named is not None:
            if self.sent == 0:
                self.sent = 1
                return [{"index": 0, **call(self.calls.named, text)}]
            return [{"index": 0, "function": {"arguments": text}}] if text else []
        made = [
            {"index": self.sent + index, **required(item)} for index, item in enumerate(self.items.add(text))
        ]
        self.sent += len(made)
        return made


class Items:
    """The items of a JSON array as its text comes, each once whole (strings may hold brackets)."""

    def __init__(self) -> None:
        self.text, self.depth, self.start, self.quoted, self.escaped = "", 0, -1, False, False

    def add(self, text: str) -> list[Any]:
        """The items `text` completes."""
        whole, offset = [], len(self.text)
        self.text += text
        for index, character in enumerate(text, offset):
            if self.quoted:
                self.escaped, self.quoted = (
                    (False, True) if self.escaped else (character == "\\", character != '"')
                )
            elif character == '"':
                self.quoted = True
            elif character in "[{":
                self.depth += 1
                self.start = index if self.depth == 2 and character == "{" else self.start
            elif character in "]}":
                self.depth -= 1
                if self.depth == 1 and self.start >= 0:
                    whole.append(json.loads(self.text[self.start : index + 1]))
                    self.start = -1
        return whole

"""Anthropic's Messages request (`POST /v1/messages`, `/v1/messages/count_tokens`) as the chat completion it
asks for: the system prompt and turns as chat messages, its fields as the chat's, its tools as the
chat's tools (`max_gpt2.serving.api.tools`).

`system` is a string or text blocks joined as llama-server and vLLM join them; each turn is `user`
or `assistant`, its content a string or blocks: text blocks joined by newlines, an assistant's
`tool_use` blocks its tool calls, a user's `tool_result` blocks tool results (before its text, as
vLLM orders them). A last `assistant` turn is continued (Anthropic's prefill). Tools (`name`,
`input_schema`) are called as `tool_choice` asks: `{"type": "tool", "name"}` by name, `any` as
required (one with `disable_parallel_tool_use`), `none` in text; `auto` is refused, as the chat
refuses it. Images, documents and thinking blocks, server tools, `thinking` and what else GPT-2
cannot do are refused by name.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from max_gpt2.serving.api.protocol import ChatRequest, Refusal, unset

# Fields taken only unset: what each would ask that this server does not do.
REFUSED = {
    "mcp_servers": "GPT-2 reaches no MCP server",
    "container": "GPT-2 runs no code",
    "context_management": "the conversation is sent whole here; nothing is cleared from it",
}
BLOCKS = {  # content blocks refused, and why
    "image": "GPT-2 reads text only",
    "document": "GPT-2 reads text only",
    "thinking": "GPT-2 does not think",
    "redacted_thinking": "GPT-2 does not think",
}
NO_PARAMETERS = {"type": "object", "properties": {}}
CHOICES = {"any": "required", "none": "none"}  # Anthropic's tool_choice types as the chat's


class CountRequest(BaseModel):
    """`POST /v1/messages/count_tokens`' body: the conversation, and what would shape its prompt."""

    model_config = ConfigDict(extra="forbid")
    model: str
    messages: list[Any]
    system: str | list[Any] | None = None
    tools: list[Any] | None = None
    tool_choice: dict[str, Any] | None = None
    thinking: dict[str, Any] | None = None
    output_config: dict[str, Any] | None = None
    mcp_servers: list[Any] | None = None
    container: Any = None
    context_management: Any = None
    cache_control: dict[str, Any] | None = None  # needs nothing: MAX's prefix cache holds every prompt
    speed: Literal["standard"] | None = None


class MessagesRequest(CountRequest):
    """`POST /v1/messages`' body."""

    max_tokens: int
    stop_sequences: list[str] | None = None
    stream: bool = False
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    metadata: dict[str, Any] | None = None  # a `user_id` for the provider's abuse checks: none are made here
    service_tier: str | None = None  # one tier here


def as_chat(body: CountRequest) -> ChatRequest:
    """The chat completion `body` asks for; a `Refusal` naming the field this server cannot honour."""
    for field, why in REFUSED.items():
        if not unset(getattr(body, field)):
            raise Refusal(field, f"{field}: {why}")
    if (thinking := (body.thinking or {}).get("type", "disabled")) != "disabled":
        raise Refusal("thinking", f"thinking: GPT-2 does not think; give disabled; got {thinking!r}")
    if unknown := sorted((body.output_config or {}).keys() - {"format"}):
        raise Refusal("output_config", f"output_config.{unknown[0]}: GPT-2 has no such setting")
    if (form := (body.output_config or {}).get("format")) is not None:
        if (
            not isinstance(form, dict)
            or form.get("type") != "json_schema"
            or form.keys() - {"type", "schema"}
        ):
            raise Refusal(
                "output_config", 'output_config.format: give {"type": "json_schema", "schema": {...}}'
            )
        form = {"type": "json_schema", "json_schema": {"name": "output", "schema": form.get("schema")}}
    messages = chat_messages(body)
    prefill = messages[-1]["role"] == "assistant" and "tool_calls" not in messages[-1]
    fields = {
        "model": body.model,
        "messages": messages,
        "response_format": form,
        "add_generation_prompt": not prefill,
        "continue_final_message": prefill,
        **chat_tools(body),
    }
    if isinstance(body, MessagesRequest):
        if body.max_tokens < 1:  # the chat's -1, llama-server's "no limit", is not Anthropic's
            raise Refusal("max_tokens", f"max_tokens: must be at least 1; got {body.max_tokens}")
        if body.temperature is not None and body.temperature > 1:  # the chat's range goes to 2, OpenAI's
            raise Refusal("temperature", f"temperature: must be between 0 and 1; got {body.temperature}")
        fields |= {
            "max_tokens": body.max_tokens,
            "stop": body.stop_sequences,
            "temperature": body.temperature,
            "top_p": body.top_p,
            "top_k": body.top_k,
            "stream": body.stream,
        }
    try:
        return ChatRequest.model_validate(fields)
    except ValidationError as error:
        first = error.errors()[0]  # only the schema, which the chat's format holds, can be wrong
        raise Refusal("output_config", f"output_config.format.schema: {first['msg']}") from None


def chat_tools(body: CountRequest) -> dict[str, Any]:
    """`body`'s tools and `tool_choice` as the chat's `tools`, `tool_choice` and `parallel_tool_calls`."""
    choice = body.tool_choice or {}
    kind = choice.get("type", "auto" if body.tools else "none")
    if not body.tools:
        return {"tool_choice": "none"} if kind in ("auto", "none") else {"tool_choice": kind}
    tools = []
    for index, tool in enumerate(body.tools):
        if not isinstance(tool, dict) or tool.get("type", "custom") != "custom" or "name" not in tool:
            got = tool.get("type") if isinstance(tool, dict) else tool
            why = 'a client tool ({"name", "input_schema"}): GPT-2 runs no server tools'
            raise Refusal("tools", f"tools[{index}]: must be {why}; got {got!r}")
        parameters = tool.get("input_schema") or NO_PARAMETERS
        tools.append({"type": "function", "function": {"name": tool["name"], "parameters": parameters}})
    if kind == "auto":
        raise Refusal(
            "tool_choice",
            'tool_choice: GPT-2 decides no tool use by itself; give {"type": "tool", "name": ...}, '
            '{"type": "any"} or {"type": "none"}',
        )
    named = {"type": "function", "function": {"name": choice.get("name")}} if kind == "tool" else None
    return {
        "tools": tools,
        "tool_choice": named or CHOICES.get(kind, kind),
        "parallel_tool_calls": not choice.get("disable_parallel_tool_use", False),
    }


def chat_messages(body: CountRequest) -> list[dict[str, str]]:
    """`body`'s system prompt and turns as chat messages; a `Refusal` naming the first that is not one."""
    messages = []
    if body.system is not None and (system := text(body.system, "system", "")):
        messages.append({"role": "system", "content": system})
    if not body.messages:
        raise Refusal("messages", "messages: empty; give at least one message")
    for index, message in enumerate(body.messages):
        where = f"messages[{index}]"
        if not isinstance(message, dict):
            raise Refusal("messages", f"{where}: must be an object with a role and content; got {message!r}")
        if extra := sorted(message.keys() - {"role", "content"}):
            raise Refusal("messages", f"{where}.{extra[0]}: not a field of a message")
        if (role := message.get("role")) not in ("user", "assistant"):
            raise Refusal(
                "messages",
                f"{where}.role: must be 'user' or 'assistant' (the system prompt is the top-level "
                f"system); got {role!r}",
            )
        messages += turn(role, message.get("content"), f"{where}.content")
    return messages


def turn(role: str, content: Any, where: str) -> list[dict[str, Any]]:
    """One turn as chat messages: a user's tool results (each a `tool` message), then its text; an
    assistant's text with its tool uses as tool calls."""
    if isinstance(content, str):
        return [{"role": role, "content": content}]
    if not isinstance(content, list):
        raise Refusal("messages", f"{where}: must be a string or a list of content blocks; got {content!r}")
    kind = {"user": "tool_result", "assistant": "tool_use"}[role]
    tools = [
        (index, block)
        for index, block in enumerate(content)
        if isinstance(block, dict) and block.get("type") == kind
    ]
    said = text(content, where, "\n", skip=kind)
    if role == "assistant":
        calls = [tool_call(block, f"{where}[{index}]") for index, block in tools]
        return [
            {"role": role, "content": said or None, "tool_calls": calls}
            if calls
            else {"role": role, "content": said}
        ]
    results = [tool_result(block, f"{where}[{index}]") for index, block in tools]
    return results + ([{"role": role, "content": said}] if said or not results else [])


def tool_call(block: dict[str, Any], where: str) -> dict[str, Any]:
    """A `tool_use` block as the chat's tool call."""
    if not isinstance(block.get("id"), str) or not isinstance(block.get("name"), str):
        raise Refusal("messages", f"{where}: a tool_use block needs its id and name")
    arguments = json.dumps(block.get("input") or {}, ensure_ascii=False)
    return {
        "id": block["id"],
        "type": "function",
        "function": {"name": block["name"], "arguments": arguments},
    }


def tool_result(block: dict[str, Any], where: str) -> dict[str, Any]:
    """A `tool_result` block as the chat's `tool` message, its content as text."""
    if not isinstance(block.get("tool_use_id"), str):
        raise Refusal("messages", f"{where}.tool_use_id: required, the id of the tool use it answers")
    given = block.get("content", "")
    said = text(given, f"{where}.content", "\n") if given else ""
    return {"role": "tool", "tool_call_id": block["tool_use_id"], "content": said}


def text(value: Any, where: str, joiner: str, skip: str | None = None) -> str:
    """A string, or text blocks' texts joined by `joiner` (blocks of type `skip` passed over: the caller
    reads them); a `Refusal` naming `where` for anything else."""
    field = where.split("[")[0].split(".")[0]
    if isinstance(value, str):
        return value
    if not isinstance(value, list):
        raise Refusal(field, f"{where}: must be a string or a list of text blocks; got {value!r}")
    texts = []
    for index, block in enumerate(value):
        kind = block.get("type") if isinstance(block, dict) else type(block).__name__
        if kind == skip:
            continue
        if kind in BLOCKS:
            raise Refusal(field, f"{where}[{index}]: {BLOCKS[kind]}; got a {kind!r} block")
        if kind != "text" or not isinstance(block.get("text"), str):
            raise Refusal(field, f'{where}[{index}]: must be a text block ({{"type": "text", "text": ...}})')
        texts.append(block["text"])  # `cache_control` needs nothing: MAX's prefix cache holds every prompt
    return joiner.join(texts)

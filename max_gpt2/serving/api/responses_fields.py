"""OpenAI's Responses request (`POST /v1/responses`, `/v1/responses/input_tokens`) as the chat completion it
asks for: `instructions` and `input` as chat messages, its fields as the chat's, its function tools
as the chat's tools (`max_gpt2.serving.api.tools`).

`input` is a string or items: messages (`role` and `content`, a string or `input_text` /
`output_text` parts), and a conversation's `function_call` and `function_call_output` items (the
chat's tool calls and results). Function tools (`name`, `parameters`) are called as `tool_choice`
asks: `{"type": "function", "name"}` by name, `required` as required, `none` in text; `auto` is
refused, as the chat refuses it. OpenAI's prompt-caching fields are the chat's. Storage, hosted tools,
reasoning and the rest GPT-2 cannot do are refused by name.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import ConfigDict, ValidationError, create_model

from max_gpt2.serving.api.chat_prompt import checked_messages, reads_kept_pages
from max_gpt2.serving.api.protocol import ChatRequest, PromptCacheOptions, Refusal, unset

# Fields taken only unset (or as given here): what each would ask that this server does not do.
REFUSED = {
    "store": "responses are not stored here; give false",
    "previous_response_id": "responses are not stored here: send the conversation as input",
    "conversation": "conversations are not stored here: send them as input",
    "background": "responses run while the client waits here",
    "reasoning": "GPT-2 does not reason",
    "prompt": "stored prompts are not kept here",
    "max_tool_calls": "calls are not counted here: give parallel_tool_calls: false for one",
    "background_options": "responses run while the client waits here",
    "context_management": "the context is not managed here: send what the model should read",
    "moderation": "no moderation model runs here",
    "image": "GPT-2 reads and writes text only",
    "access_programs": "no access program runs here",
}
LOGPROBS = "message.output_text.logprobs"  # what `include` may ask: each token's log-probability
TAKEN = {"truncation": ("disabled",)}


# Every field of `REFUSED` and `TAKEN`, of any JSON type: checked by `as_chat`.
_Checked: Any = create_model(
    "_Checked", __config__=ConfigDict(extra="forbid"), **dict.fromkeys((*REFUSED, *TAKEN), (Any, None))
)


class ResponsesRequest(_Checked):
    """`POST /v1/responses`' body."""

    model: str | None = None
    input: str | list[Any]
    instructions: str | None = None
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None  # vLLM's
    stream: bool | None = False
    text: dict[str, Any] | None = None
    metadata: dict[str, Any] | None = None  # kept with stored responses: none are
    user: str | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None
    prompt_cache_retention: Literal["in_memory", "24h"] | None = None  # pages stay while there is room
    prompt_cache_options: PromptCacheOptions | None = None  # the chat's (`chat_prompt.reads_kept_pages`)
    stream_options: dict[str, Any] | None = None  # `include_obfuscation` alone, the chat's to check
    service_tier: str | None = None
    include: list[str] | None = None  # LOGPROBS alone
    tools: list[Any] | None = None
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None
    top_logprobs: int | None = None


def as_chat(body: ResponsesRequest) -> ChatRequest:
    """The chat completion `body` asks for; a `Refusal` naming the field this server cannot honour."""
    for field, why in REFUSED.items():
        if not unset(getattr(body, field)):
            raise Refusal(field, f"{field}: {why}")
    for field, values in TAKEN.items():
        if (value := getattr(body, field)) is not None and value not in values:
            raise Refusal(field, f"{field}: only {' or '.join(map(repr, values))} here; got {value!r}")
    if body.max_output_tokens is not None and body.max_output_tokens < 1:  # not the chat's -1, no limit
        raise Refusal(
            "max_output_tokens", f"max_output_tokens: must be at least 1; got {body.max_output_tokens}"
        )
    for index, item in enumerate(body.include or ()):
        if item != LOGPROBS:
            why = "GPT-2 runs no hosted tools, reads no images and does not reason"
            raise Refusal("include", f"include[{index}]: only {LOGPROBS!r} here ({why}); got {item!r}")
    logprobs = LOGPROBS in (body.include or ())
    if body.top_logprobs and not logprobs:  # OpenAI would answer none: never a setting taken unused
        raise Refusal("top_logprobs", f"top_logprobs: needs include: [{LOGPROBS!r}]")
    if unknown := sorted((body.text or {}).keys() - {"format"}):
        raise Refusal("text", f"text.{unknown[0]}: GPT-2 has no such setting; give text.format alone")
    form = (body.text or {}).get("format")
    items = body.input if isinstance(body.input, list) else []  # where a part may mark a breakpoint
    caching = None if reads_kept_pages(body.prompt_cache_options, items) else body.prompt_cache_options
    if isinstance(form, dict) and form.get("type") == "json_schema":  # the chat's response_format's shape
        form = {"type": "json_schema", "json_schema": {k: v for k, v in form.items() if k != "type"}}
    fields = {
        "model": body.model,
        "messages": [
            *([{"role": "system", "content": body.instructions}] if body.instructions else []),
            *input_messages(body.input),
        ],
        "max_completion_tokens": body.max_output_tokens,
        "temperature": body.temperature,
        "top_p": body.top_p,
        "top_k": body.top_k,
        "stream": body.stream,
        "stream_options": _obfuscation(body.stream_options),
        "prompt_cache_options": caching,  # explicit, none marked: the chat (no breakpoints kept) reads none
        "response_format": form,
        "logprobs": logprobs,
        "top_logprobs": body.top_logprobs,
        **chat_tools(body),
    }
    try:
        return ChatRequest.model_validate(fields)
    except ValidationError as error:
        first = error.errors()[0]
        raise Refusal(
            "text", f"text.format: {first['msg']} at {'.'.join(map(str, first['loc'][1:]))}"
        ) from None


def _obfuscation(options: dict[str, Any] | None) -> dict[str, Any] | None:
    """A streamed response's `stream_options` as the chat's: `include_obfuscation` alone, and false."""
    if unknown := sorted((options or {}).keys() - {"include_obfuscation"}):
        raise Refusal("stream_options", f"stream_options.{unknown[0]}: not a Responses stream option")
    if (options or {}).get("include_obfuscation"):
        raise Refusal(
            "stream_options", "stream_options.include_obfuscation: no event is padded here; give false"
        )
    return options


def input_messages(given: str | list[Any]) -> list[dict[str, str]]:
    """A request's `input` as chat messages, each checked as a chat's are, a refusal naming `input`."""
    items = [{"role": "user", "content": given}] if isinstance(given, str) else given
    messages = []
    for index, item in enumerate(items):
        kind = item.get("type", "message") if isinstance(item, dict) else type(item).__name__
        if kind in ("function_call", "function_call_output"):
            messages = with_call(messages, item, f"input[{index}]")
            continue
        if kind != "message":
            why = "messages, function calls and their outputs only"
            raise Refusal("input", f"input[{index}]: GPT-2 reads {why}; got {kind!r}")
        if found := sorted(item.keys() & TOOL_FIELDS) or (["role"] if item.get("role") == "tool" else []):
            why = "a chat's, not a Responses message's: give function_call and function_call_output items"
            raise Refusal("input", f"input[{index}].{found[0]}: {why}")
        text = text_parts(item.get("content"))
        messages.append(
            {key: value for key, value in item.items() if key not in ("type", "id", "status")}
            | {"content": text}
        )
    try:
        return checked_messages(messages)
    except Refusal as refusal:
        raise Refusal("input", refusal.message.replace("messages", "input", 1)) from None


PARTS = ("input_text", "output_text")


def text_parts(value: Any) -> Any:
    """Responses' `input_text` and `output_text` parts as the chat's text parts (anything else as it is)."""
    if not isinstance(value, list):
        return value
    return [
        {**part, "type": "text"} if isinstance(part, dict) and part.get("type") in PARTS else part
        for part in value
    ]


TOOL_FIELDS = {"tool_calls", "tool_call_id"}


def with_call(messages: list[dict[str, Any]], item: dict[str, Any], where: str) -> list[dict[str, Any]]:
    """`messages` and a `function_call` item (a call of the assistant's, with those just before it) or a
    `function_call_output` item (a tool's result), as the chat's."""
    if not isinstance(item.get("call_id"), str):
        raise Refusal("input", f"{where}.call_id: required, a string")
    if item["type"] == "function_call_output":
        output = text_parts(item.get("output"))
        return [*messages, {"role": "tool", "tool_call_id": item["call_id"], "content": output}]
    call = {
        "id": item["call_id"],
        "type": "function",
        "function": {k: item.get(k) for k in ("name", "arguments")},
    }
    if messages and messages[-1]["role"] == "assistant" and messages[-1].get("content") is None:
        return [*messages[:-1], {**messages[-1], "tool_calls": [*messages[-1]["tool_calls"], call]}]
    return [*messages, {"role": "assistant", "content": None, "tool_calls": [call]}]


def chat_tools(body: ResponsesRequest) -> dict[str, Any]:
    """`body`'s function tools and `tool_choice` as the chat's (and its `parallel_tool_calls`)."""
    choice = body.tool_choice
    if not body.tools:
        return {"tool_choice": None if choice in (None, "auto", "none") else chat_choice(choice)}
    tools = []
    for index, tool in enumerate(body.tools):
        if (
            not isinstance(tool, dict)
            or tool.get("type") != "function"
            or not isinstance(tool.get("name"), str)
        ):
            got = tool.get("type") if isinstance(tool, dict) else tool
            raise Refusal(
                "tools", f"tools[{index}]: GPT-2 runs no hosted tools; give function tools; got {got!r}"
            )
        function = {"name": tool["name"], "parameters": tool.get("parameters")}
        tools.append({"type": "function", "function": function})
    if choice in (None, "auto"):
        raise Refusal(
            "tool_choice",
            'tool_choice: GPT-2 decides no tool call by itself; give {"type": "function", "name": ...}, '
            '"required" or "none"',
        )
    return {
        "tools": tools,
        "tool_choice": chat_choice(choice),
        "parallel_tool_calls": body.parallel_tool_calls,
    }


def chat_choice(choice: Any) -> Any:
    """A Responses `tool_choice` as the chat's (a named function's name moves into `function`)."""
    if isinstance(choice, dict) and choice.get("type") == "function":
        return {"type": "function", "function": {"name": choice.get("name")}}
    return choice

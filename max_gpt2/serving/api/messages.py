"""`POST /v1/messages`: Anthropic's Messages API over the chat template, as llama-server and vLLM answer it.

A request's `system` (a string, or text blocks joined as both peers join them) and `messages`
(`user` and `assistant` turns, content a string or text blocks joined by newlines, as a chat's
text parts) become chat messages, rendered by the chat template and run as one chat completion
(`max_gpt2.serving.api.chat.start_chat`): `max_tokens` (required, as Anthropic's) its length,
`stop_sequences` its stop strings, `temperature`, `top_p` and `top_k` as there,
`output_config.format` (a JSON schema) its constraint. A last `assistant` turn is continued, not
answered (Anthropic's prefill). The answer is a `message` of one `text` block; `stop_reason` says
why it ended as Anthropic documents it (`end_turn`, `stop_sequence` naming the one matched,
`max_tokens`), and `usage` counts apart the prompt tokens MAX's prefix cache held
(`cache_read_input_tokens`), as Anthropic does. Streamed, Anthropic's events in order:
`message_start`, `content_block_start`, `ping`, a `content_block_delta` as text comes,
`content_block_stop`, `message_delta` (why, and the usage), `message_stop`. Refusals come in
Anthropic's error shape. GPT-2 calls no tools, does not think and reads no images: what asks for
those is refused by name. `POST /v1/messages/count_tokens` answers the prompt's size.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from max_gpt2.serving.api.answer import Gathered, compact, record_end
from max_gpt2.serving.api.chat import answer_one, prompt_size, start_chat
from max_gpt2.serving.api.choices import Choice, Finish
from max_gpt2.serving.api.protocol import ChatRequest, Refusal, parse, unset
from max_gpt2.serving.api.requests import Asked
from max_gpt2.serving.api.served import Served

logger = logging.getLogger("max.serve")
# Anthropic's error `type` for each status this server answers with.
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
}
# Fields taken only unset: what each would ask that this server does not do.
REFUSED = {
    "tools": "GPT-2 calls no tools",
    "mcp_servers": "GPT-2 calls no tools",
    "container": "GPT-2 runs no code",
    "context_management": "the conversation is sent whole here; nothing is cleared from it",
}
# A chat field a refusal named, as this API calls it.
NAMES = {"stop": "stop_sequences", "response_format": "output_config.format"}
BLOCKS = {
    "image": "GPT-2 reads text only",
    "document": "GPT-2 reads text only",
    "tool_use": "GPT-2 calls no tools",
    "tool_result": "GPT-2 calls no tools",
    "thinking": "GPT-2 does not think",
    "redacted_thinking": "GPT-2 does not think",
}


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


async def create_message(request: Request) -> Response:
    served = Served.of(request)
    try:
        body = parse(MessagesRequest, await request.body())
        model, asked, choice = await start_chat(request, served, as_chat(body), "messages")
    except Refusal as refusal:
        return error_response(refusal)
    return await answer_one(request, Answer(model, asked, choice, request.state.request_id), asked, choice)


async def count_tokens(request: Request) -> Response:
    """`POST /v1/messages/count_tokens`: the size of the prompt a request's conversation makes."""
    try:
        chat = as_chat(parse(CountRequest, await request.body()))
        return JSONResponse({"input_tokens": await prompt_size(Served.of(request), chat)})
    except Refusal as refusal:
        return error_response(refusal)


def error_response(refusal: Refusal) -> JSONResponse:
    """Anthropic's error body for `refusal`, the field it names leading its message."""
    kind = ERROR_TYPES.get(refusal.status, "api_error")
    name = NAMES.get(refusal.param or "")
    said = refusal.message if name is None else refusal.message.replace(refusal.param or "", name, 1)
    body = {"type": "error", "error": {"type": kind, "message": said}}
    return JSONResponse(body, refusal.status, refusal.headers)


def as_chat(body: CountRequest) -> ChatRequest:
    """The chat completion `body` asks for; a `Refusal` naming the field this server cannot honour."""
    for field, why in REFUSED.items():
        if not unset(getattr(body, field)):
            raise Refusal(field, f"{field}: {why}")
    if (choice := (body.tool_choice or {}).get("type", "none")) not in ("none", "auto"):
        raise Refusal("tool_choice", f"tool_choice: GPT-2 calls no tools; give none or auto; got {choice!r}")
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
    prefill = messages[-1]["role"] == "assistant"
    fields = {
        "model": body.model,
        "messages": messages,
        "response_format": form,
        "add_generation_prompt": not prefill,
        "continue_final_message": prefill,
    }
    if isinstance(body, MessagesRequest):
        if body.max_tokens < 1:  # the chat's -1, llama-server's "no limit", is not Anthropic's
            raise Refusal("max_tokens", f"max_tokens: must be at least 1; got {body.max_tokens}")
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
        messages.append({"role": role, "content": text(message.get("content"), f"{where}.content", "\n")})
    return messages


def text(value: Any, where: str, joiner: str) -> str:
    """A string, or text blocks' texts joined by `joiner`; a `Refusal` naming `where` for anything else."""
    field = where.split("[")[0].split(".")[0]
    if isinstance(value, str):
        return value
    if not isinstance(value, list):
        raise Refusal(field, f"{where}: must be a string or a list of text blocks; got {value!r}")
    texts = []
    for index, block in enumerate(value):
        kind = block.get("type") if isinstance(block, dict) else type(block).__name__
        if kind in BLOCKS:
            raise Refusal(field, f"{where}[{index}]: {BLOCKS[kind]}; got a {kind!r} block")
        if kind != "text" or not isinstance(block.get("text"), str):
            raise Refusal(field, f'{where}[{index}]: must be a text block ({{"type": "text", "text": ...}})')
        texts.append(block["text"])  # `cache_control` needs nothing: MAX's prefix cache holds every prompt
    return joiner.join(texts)


class Answer:
    """A `message`, whole or as Anthropic's stream of events (module docstring)."""

    def __init__(self, model: str, asked: Asked, choice: Choice, ident: str) -> None:
        self.model, self.asked, self.choice, self.id = model, asked, choice, f"msg_{ident}"
        self.started = time.perf_counter()

    def answered(self, gathered: Gathered) -> dict[str, Any]:
        return self.message(gathered.text, gathered.finish)

    def message(self, text: str, finish: Finish | None) -> dict[str, Any]:
        """The `message`: begun (`finish` None: no content, no reason yet) or ended as `finish` says."""
        return {
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "content": [] if finish is None else [{"type": "text", "text": text}],
            "model": self.model,
            **self.reason(finish),
            "usage": self.usage(finish is not None),
        }

    def reason(self, finish: Finish | None) -> dict[str, Any]:
        """Anthropic's `stop_reason` and `stop_sequence` for `finish`."""
        matched = finish.stop_reason if finish is not None and isinstance(finish.stop_reason, str) else None
        if finish is None:
            return {"stop_reason": None, "stop_sequence": None}
        why = "max_tokens" if finish.reason == "length" else "stop_sequence" if matched else "end_turn"
        return {"stop_reason": why, "stop_sequence": matched}

    def usage(self, ended: bool) -> dict[str, int]:
        prompt, cached = len(self.choice.prompt), self.choice.cached
        return {
            "input_tokens": prompt - cached,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": cached,
            "output_tokens": self.choice.made if ended else 0,
        }

    async def events(self, path: str) -> AsyncIterator[dict[str, str]]:
        """Anthropic's events of a streamed message, the first once the prompt has been read."""
        finish, begun = None, False
        try:
            async for chunk in self.choice.chunks():
                if not begun:  # the prompt has been read: its usage is known
                    begun = True
                    yield event("message_start", message=self.message("", None))
                    yield event("content_block_start", index=0, content_block={"type": "text", "text": ""})
                    yield event("ping")
                if chunk.text:
                    yield event(
                        "content_block_delta", index=0, delta={"type": "text_delta", "text": chunk.text}
                    )
                finish = chunk.finish or finish
            yield event("content_block_stop", index=0)
            yield event("message_delta", delta=self.reason(finish), usage=self.usage(True))
            yield event("message_stop")
        except Exception as error:  # the stream has begun: the error goes in it, as Anthropic's `error` event
            logger.exception("a streamed answer failed")
            yield event("error", error={"type": "api_error", "message": f"the answer failed: {error}"})
        finally:
            self.record(path)

    def record(self, path: str) -> None:
        record_end(path, self.started, [self.choice], self.asked)


def event(kind: str, **fields: Any) -> dict[str, str]:
    return {"event": kind, "data": compact({"type": kind, **fields})}

"""`POST /v1/messages`: Anthropic's Messages API over the chat template, as llama-server and vLLM answer it.

The request runs as one chat completion (`max_gpt2.serving.api.anthropic_fields` makes it,
`max_gpt2.serving.api.chat.start_chat` starts it). The answer is a `message` of one `text` block,
or where the request called its tools (`tool_choice` by name or `any`), a `tool_use` block a call
whose input came whole; `stop_reason` says why it ended as Anthropic documents it (`end_turn`,
`stop_sequence` naming the one matched, `max_tokens`, `tool_use`), and `usage` counts apart the
prompt tokens MAX's prefix cache held (`cache_read_input_tokens`), as Anthropic does. Streamed,
Anthropic's events in order: `message_start`, `ping`, for each block `content_block_start`, a
`content_block_delta` as text (`text_delta`) or input (`input_json_delta`) comes and
`content_block_stop`, then `message_delta` (why, and the usage) and `message_stop`. Refusals
come in Anthropic's error shape. `POST /v1/messages/count_tokens` answers the prompt's size.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from max_gpt2.serving.api.answer import compact, record_end
from max_gpt2.serving.api.anthropic_fields import CountRequest, MessagesRequest, as_chat
from max_gpt2.serving.api.chat import answer_one, prompt_size, start_chat
from max_gpt2.serving.api.choices import Choice, Finish, Gathered
from max_gpt2.serving.api.protocol import Refusal, parse
from max_gpt2.serving.api.requests import Asked
from max_gpt2.serving.api.served import Served
from max_gpt2.serving.api.tools import ToolCalls, ToolStream

logger = logging.getLogger("max.serve")
# Anthropic's error `type` for each status this server answers with.
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
}
# A chat field a refusal named, as this API calls it.
NAMES = {"stop": "stop_sequences", "response_format": "output_config.format"}


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


class Answer:
    """A `message`, whole or as Anthropic's stream of events (module docstring)."""

    def __init__(self, model: str, asked: Asked, choice: Choice, ident: str) -> None:
        self.model, self.asked, self.choice, self.id = model, asked, choice, f"msg_{ident}"
        self.started = time.perf_counter()

    def answered(self, gathered: Gathered) -> dict[str, Any]:
        return self.message(gathered.text, gathered.finish)

    def message(self, text: str, finish: Finish | None) -> dict[str, Any]:
        """The `message`: begun (`finish` None: no content, no reason yet) or ended as `finish` says."""
        if finish is None:
            content = []
        elif self.asked.tools is not None:  # the calls whose input came whole
            content = uses(self.asked.tools.calls(text))
        else:
            content = [{"type": "text", "text": text}]
        return {
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "content": content,
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
        why = "tool_use" if why == "end_turn" and self.asked.tools is not None else why
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
        finish, begun, blocks = None, False, Blocks(self.asked.tools)
        try:
            async for chunk in self.choice.chunks():
                if not begun:  # the prompt has been read: its usage is known
                    begun = True
                    yield event("message_start", message=self.message("", None))
                    for each in blocks.begin():
                        yield each
                    yield event("ping")
                for each in blocks.add(chunk.text):
                    yield each
                finish = chunk.finish or finish
            for each in blocks.end():
                yield each
            yield event("message_delta", delta=self.reason(finish), usage=self.usage(True))
            yield event("message_stop")
        except Exception as error:  # the stream has begun: the error goes in it, as Anthropic's `error` event
            logger.exception("a streamed answer failed")
            yield event("error", error={"type": "api_error", "message": f"the answer failed: {error}"})
        finally:
            self.record(path)

    def record(self, path: str) -> None:
        record_end(path, self.started, [self.choice], self.asked)


class Blocks:
    """A streamed message's content blocks as events: one text block, or a tool use a call (a named
    call's input as it comes, a required call's whole)."""

    def __init__(self, tools: ToolCalls | None) -> None:
        self.calls, self.opened = (ToolStream(tools) if tools is not None else None), 0

    def begin(self) -> list[dict[str, str]]:
        """The text block's start (a tool use's block starts with its call)."""
        if self.calls is not None:
            return []
        self.opened = 1
        return [event("content_block_start", index=0, content_block={"type": "text", "text": ""})]

    def add(self, text: str) -> list[dict[str, str]]:
        if self.calls is None:
            delta = {"type": "text_delta", "text": text}
            return [event("content_block_delta", index=0, delta=delta)] if text else []
        events = []
        for delta in self.calls.delta(text):
            arguments = delta["function"]["arguments"]
            if "id" in delta:  # a call begins: a block of its own
                if self.opened:
                    events.append(event("content_block_stop", index=self.opened - 1))
                self.opened += 1
                block = use(delta, {})  # its input comes in the deltas
                events.append(event("content_block_start", index=self.opened - 1, content_block=block))
            if arguments:
                partial = {"type": "input_json_delta", "partial_json": arguments}
                events.append(event("content_block_delta", index=self.opened - 1, delta=partial))
        return events

    def end(self) -> list[dict[str, str]]:
        return [event("content_block_stop", index=self.opened - 1)] if self.opened else []


def use(made: dict[str, Any], given: Any) -> dict[str, Any]:
    """The chat's tool call `made` as Anthropic's `tool_use` block, with `given` as its input."""
    ident = "toolu_" + made["id"].removeprefix("call_")
    return {"type": "tool_use", "id": ident, "name": made["function"]["name"], "input": given}


def uses(calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`calls` as `tool_use` blocks, each whose arguments came whole (the length may cut a named call's)."""
    blocks = []
    for made in calls:
        try:
            blocks.append(use(made, json.loads(made["function"]["arguments"])))
        except json.JSONDecodeError:
            continue
    return blocks


def event(kind: str, **fields: Any) -> dict[str, str]:
    return {"event": kind, "data": compact({"type": kind, **fields})}

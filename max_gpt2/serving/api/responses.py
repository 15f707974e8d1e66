"""`POST /v1/responses`: OpenAI's Responses API over the chat template, as vLLM and llama-server answer it.

The request runs as one chat completion (`max_gpt2.serving.api.responses_fields` makes it,
`max_gpt2.serving.api.chat.start_chat` starts it). The answer is a `response` with one `message`
output item of one `output_text` part, or where the request called its function tools, a
`function_call` item a call; `status` "incomplete" (`max_output_tokens`) where the length cut
it. Streamed, OpenAI's events in order (`response.created`, `.in_progress`, then for the message
`.output_item.added`, `.content_part.added`, `.output_text.delta` as the text comes and the
`.done`s, or for each call `.output_item.added`, `.function_call_arguments.delta` as its arguments
come and the `.done`s; then `response.completed`), each with its `sequence_number`. With
`include: ["message.output_text.logprobs"]` the text's tokens come with their log-probabilities and
`top_logprobs` alternatives, in the chat's entries (the `output_text` part's `logprobs`, and each
delta's for its tokens).
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from max_gpt2.serving.api.answer import compact, record_end
from max_gpt2.serving.api.chat import ChatShape, answer_one, input_tokens, prompt_size, start_chat
from max_gpt2.serving.api.choices import Choice, Finish, Gathered, Token
from max_gpt2.serving.api.protocol import Refusal, parse, refusal_response
from max_gpt2.serving.api.requests import Asked
from max_gpt2.serving.api.responses_fields import ResponsesRequest, as_chat
from max_gpt2.serving.api.served import Served
from max_gpt2.serving.api.token_names import TokenNames
from max_gpt2.serving.api.tools import ToolStream

logger = logging.getLogger("max.serve")


async def create_response(request: Request) -> Response:
    served = Served.of(request)
    try:
        body = parse(ResponsesRequest, await request.body())
        model, asked, choice = await start_chat(request, served, as_chat(body), "input")
    except Refusal as refusal:
        return refusal_response(refusal)
    answer = Answer(body, asked, model, choice, request.state.request_id, TokenNames(served.engine))
    return await answer_one(request, answer, asked, choice)


async def count_input_tokens(request: Request) -> Response:
    """OpenAI's `POST /v1/responses/input_tokens`: the size of the prompt a response's request makes."""
    try:
        chat = as_chat(parse(ResponsesRequest, await request.body()))
        return input_tokens(await prompt_size(Served.of(request), chat))
    except Refusal as refusal:
        return refusal_response(refusal)


class Answer:
    """A response object, whole or as OpenAI's stream of events (module docstring)."""

    def __init__(
        self, body: ResponsesRequest, asked: Asked, model: str, choice: Choice, ident: str, names: TokenNames
    ) -> None:
        self.body, self.asked, self.model, self.choice = body, asked, model, choice
        self.id, self.item, self.created = f"resp_{ident}", f"msg_{ident}", int(time.time())
        self.started, self.sequence = time.perf_counter(), 0
        self.shape, self.tokens = ChatShape(asked, names), list[Token]()  # the tokens the text holds so far
        self.calls: list[dict[str, Any]] = []  # the chat's tool calls made, where tools are called
        self.closed = 0  # calls streamed whole
        self.text, self.finish = "", None  # what the streamed choice made, once it ends

    def response(self, text: str | None, finish: Finish | None) -> dict[str, Any]:
        """The `response` object: in progress (`text` None), or ended as `finish` says."""
        cut = finish is not None and finish.reason == "length"
        status = "in_progress" if text is None else "incomplete" if cut else "completed"
        prompt, cached, made = len(self.choice.prompt), self.choice.cached, self.choice.made
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created,
            "status": status,
            "error": None,
            "incomplete_details": {"reason": "max_output_tokens"} if cut else None,
            "instructions": self.body.instructions,
            "max_output_tokens": self.body.max_output_tokens,
            "model": self.model,
            "output": [] if text is None else self.output(text, status),
            "parallel_tool_calls": self.body.parallel_tool_calls is not False,
            "temperature": self.body.temperature,
            "top_p": self.body.top_p,
            "tool_choice": self.body.tool_choice or "auto",
            "tools": self.body.tools or [],
            "text": {"format": (self.body.text or {}).get("format") or {"type": "text"}},
            "truncation": "disabled",
            "metadata": self.body.metadata or {},
            "store": False,
            "usage": None
            if text is None
            else {
                "input_tokens": prompt,
                "input_tokens_details": {"cached_tokens": cached},
                "output_tokens": made,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": prompt + made,
            },
        }

    def answered(self, gathered: Gathered) -> dict[str, Any]:
        self.tokens = gathered.tokens
        self.calls = self.asked.tools.calls(gathered.text) if self.asked.tools is not None else []
        return self.response(gathered.text, gathered.finish)

    def output(self, text: str, status: str) -> list[dict[str, Any]]:
        """The output items: the message, or where tools are called, a `function_call` item a call."""
        if self.asked.tools is None:
            return [self.message(text, status)]
        return [function_call(made, "completed") for made in self.calls]

    def message(self, text: str, status: str) -> dict[str, Any]:
        content = [self.part(text)] if status != "in_progress" else []
        return {"type": "message", "id": self.item, "status": status, "role": "assistant", "content": content}

    def part(self, text: str) -> dict[str, Any]:
        return {
            "type": "output_text",
            "text": text,
            "annotations": [],
            "logprobs": self.logprobs(self.tokens),
        }

    def logprobs(self, tokens: Sequence[Token]) -> list[dict[str, Any]]:
        """The chat's entries of `tokens` where `include` asked for them, else none."""
        return self.shape.entries(tokens) if self.asked.logprobs is not None else []

    async def events(self, path: str) -> AsyncIterator[dict[str, str]]:
        """OpenAI's events of a streamed response, each named and numbered."""
        try:
            yield self.event("response.created", response=self.response(None, None))
            yield self.event("response.in_progress", response=self.response(None, None))
            said = self.call_events() if self.asked.tools is not None else self.text_events()
            async for each in said:
                yield each
            ended = self.response(self.text, self.finish)
            done = "response.incomplete" if ended["status"] == "incomplete" else "response.completed"
            yield self.event(done, response=ended)
        except Exception as error:  # the stream has begun: the error goes in it, as OpenAI's `error` event
            logger.exception("a streamed answer failed")
            yield self.event("error", code="server_error", message=f"the answer failed: {error}", param=None)
        finally:
            self.record(path)

    async def text_events(self) -> AsyncIterator[dict[str, str]]:
        """The message's events: the item and its part added, the text as it comes, the `.done`s."""
        where = {"item_id": self.item, "output_index": 0, "content_index": 0}
        yield self.event("response.output_item.added", output_index=0, item=self.message("", "in_progress"))
        yield self.event("response.content_part.added", **where, part=self.part(""))
        text, finish, waiting = [], None, list[Token]()  # tokens of text not yet sent
        async for chunk in self.choice.chunks():
            self.tokens.extend(chunk.tokens)
            waiting.extend(chunk.tokens)
            if chunk.text:
                text.append(chunk.text)
                logprobs = self.logprobs(waiting)
                yield self.event("response.output_text.delta", **where, delta=chunk.text, logprobs=logprobs)
                waiting = []
            finish = chunk.finish or finish
        self.text, self.finish = "".join(text), finish
        every = self.logprobs(self.tokens)
        yield self.event("response.output_text.done", **where, text=self.text, logprobs=every)
        yield self.event("response.content_part.done", **where, part=self.part(self.text))
        ended = self.message(self.text, self.response(self.text, finish)["status"])
        yield self.event("response.output_item.done", output_index=0, item=ended)

    async def call_events(self) -> AsyncIterator[dict[str, str]]:
        """The calls' events: each `function_call` item added, its arguments as they come, the `.done`s."""
        assert self.asked.tools is not None
        stream, text, finish = ToolStream(self.asked.tools), [], None
        async for chunk in self.choice.chunks():
            text.append(chunk.text)
            finish = chunk.finish or finish
            for delta in stream.delta(chunk.text):
                if "id" in delta:  # a call begins: the last one's ends
                    for each in self.call_done():
                        yield each
                    self.calls.append({**delta, "function": {**delta["function"], "arguments": ""}})
                    item = function_call(self.calls[-1], "in_progress")
                    yield self.event(
                        "response.output_item.added", output_index=len(self.calls) - 1, item=item
                    )
                if arguments := delta["function"]["arguments"]:
                    self.calls[-1]["function"]["arguments"] += arguments
                    where = {"item_id": "fc_" + self.calls[-1]["id"], "output_index": len(self.calls) - 1}
                    yield self.event("response.function_call_arguments.delta", **where, delta=arguments)
        self.text, self.finish = "".join(text), finish
        for each in self.call_done():
            yield each

    def call_done(self) -> list[dict[str, str]]:
        """The last call's `.done` events, where one is still open."""
        if self.closed == len(self.calls):
            return []
        self.closed, index = len(self.calls), len(self.calls) - 1
        made = self.calls[index]
        where = {"item_id": "fc_" + made["id"], "output_index": index}
        arguments, done = made["function"]["arguments"], function_call(made, "completed")
        return [
            self.event("response.function_call_arguments.done", **where, arguments=arguments),
            self.event("response.output_item.done", output_index=index, item=done),
        ]

    def event(self, kind: str, **fields: Any) -> dict[str, str]:
        self.sequence += 1
        return {
            "event": kind,
            "data": compact({"type": kind, "sequence_number": self.sequence - 1, **fields}),
        }

    def record(self, path: str) -> None:
        record_end(path, self.started, [self.choice], self.asked)


def function_call(made: dict[str, Any], status: str) -> dict[str, Any]:
    """The chat's tool call `made` as a Responses `function_call` output item."""
    function = made["function"]
    return {
        "type": "function_call",
        "id": "fc_" + made["id"],
        "call_id": made["id"],
        "name": function["name"],
        "arguments": function["arguments"],
        "status": status,
    }

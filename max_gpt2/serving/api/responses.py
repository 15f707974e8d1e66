"""`POST /v1/responses`: OpenAI's Responses API over the chat template, as vLLM and llama-server answer it.

A request's `instructions` and `input` (a string, or messages: `role` and `content`, a string or
`input_text` / `output_text` parts) become chat messages (`as_chat`), rendered by the chat template
and run as a chat completion of that prompt: `max_output_tokens` its length, `temperature`, `top_p`
and vLLM's `top_k` as there, `text.format` its constraint (`json_schema` or `json_object`). The
answer is a `response` with one `message` output item of one `output_text` part, `status`
"incomplete" (`max_output_tokens`) where the length cut it; streamed, OpenAI's events in order
(`response.created`, `.in_progress`, `.output_item.added`, `.content_part.added`, `.output_text.delta`
as the text comes, the `.done`s, `response.completed`), each with its `sequence_number`. With
`include: ["message.output_text.logprobs"]` the text's tokens come with their log-probabilities and
`top_logprobs` alternatives, in the chat's entries (the `output_text` part's `logprobs`, and each
delta's for its tokens). Nothing is stored, no tool is called and GPT-2 does not reason: what asks
for those (`store: true`, `previous_response_id`, `background`, `tools`, `reasoning`, any other
`include`, `truncation: "auto"`, ...) is refused by name.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

from pydantic import ConfigDict, ValidationError, create_model
from starlette.requests import Request
from starlette.responses import Response

from max_gpt2.serving.api.answer import Gathered, compact, record_end
from max_gpt2.serving.api.chat import ChatShape, answer_one, input_tokens, prompt_size, start_chat
from max_gpt2.serving.api.chat_prompt import checked_messages
from max_gpt2.serving.api.choices import Choice, Finish, Token, TokenNames
from max_gpt2.serving.api.protocol import ChatRequest, Refusal, parse, refusal_response, unset
from max_gpt2.serving.api.requests import Asked
from max_gpt2.serving.api.served import Served

logger = logging.getLogger("max.serve")
# Fields taken only unset (or as given here): what each would ask that this server does not do.
REFUSED = {
    "store": "responses are not stored here; give false",
    "previous_response_id": "responses are not stored here: send the conversation as input",
    "conversation": "conversations are not stored here: send them as input",
    "background": "responses run while the client waits here",
    "tools": "GPT-2 calls no tools",
    "reasoning": "GPT-2 does not reason",
    "prompt": "stored prompts are not kept here",
    "max_tool_calls": "GPT-2 calls no tools",
}
LOGPROBS = "message.output_text.logprobs"  # what `include` may ask: each token's log-probability
TAKEN = {"tool_choice": ("none", "auto"), "truncation": ("disabled",), "parallel_tool_calls": (True, False)}


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
    service_tier: str | None = None
    include: list[str] | None = None  # LOGPROBS alone
    top_logprobs: int | None = None


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
            why = "GPT-2 calls no tools, reads no images and does not reason"
            raise Refusal("include", f"include[{index}]: only {LOGPROBS!r} here ({why}); got {item!r}")
    logprobs = LOGPROBS in (body.include or ())
    if body.top_logprobs and not logprobs:  # OpenAI would answer none: never a setting taken unused
        raise Refusal("top_logprobs", f"top_logprobs: needs include: [{LOGPROBS!r}]")
    if unknown := sorted((body.text or {}).keys() - {"format"}):
        raise Refusal("text", f"text.{unknown[0]}: GPT-2 has no such setting; give text.format alone")
    form = (body.text or {}).get("format")
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
        "response_format": form,
        "logprobs": logprobs,
        "top_logprobs": body.top_logprobs,
    }
    try:
        return ChatRequest.model_validate(fields)
    except ValidationError as error:
        first = error.errors()[0]
        raise Refusal(
            "text", f"text.format: {first['msg']} at {'.'.join(map(str, first['loc'][1:]))}"
        ) from None


def input_messages(given: str | list[Any]) -> list[dict[str, str]]:
    """A request's `input` as chat messages, each checked as a chat's are, a refusal naming `input`."""
    items = [{"role": "user", "content": given}] if isinstance(given, str) else given
    messages = []
    for index, item in enumerate(items):
        if not isinstance(item, dict) or item.get("type", "message") != "message":
            kind = item.get("type") if isinstance(item, dict) else type(item).__name__
            raise Refusal("input", f"input[{index}]: GPT-2 reads messages only; got {kind!r}")
        if found := sorted(item.keys() & TOOL_FIELDS) or (["role"] if item.get("role") == "tool" else []):
            why = "a chat's, not a Responses message's (GPT-2 calls no tools here)"
            raise Refusal("input", f"input[{index}].{found[0]}: {why}")
        text = item.get("content")
        if isinstance(text, list):  # input_text and output_text parts: the chat's text parts
            text = [
                {**part, "type": "text"} if isinstance(part, dict) and part.get("type") in PARTS else part
                for part in text
            ]
        messages.append(
            {key: value for key, value in item.items() if key not in ("type", "id", "status")}
            | {"content": text}
        )
    try:
        return checked_messages(messages)
    except Refusal as refusal:
        raise Refusal("input", refusal.message.replace("messages", "input", 1)) from None


PARTS = ("input_text", "output_text")
TOOL_FIELDS = {"tool_calls", "tool_call_id"}


class Answer:
    """A response object, whole or as OpenAI's stream of events (module docstring)."""

    def __init__(
        self, body: ResponsesRequest, asked: Asked, model: str, choice: Choice, ident: str, names: TokenNames
    ) -> None:
        self.body, self.asked, self.model, self.choice = body, asked, model, choice
        self.id, self.item, self.created = f"resp_{ident}", f"msg_{ident}", int(time.time())
        self.started, self.sequence = time.perf_counter(), 0
        self.shape, self.tokens = ChatShape(asked, names), list[Token]()  # the tokens the text holds so far

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
            "output": [] if text is None else [self.message(text, status)],
            "parallel_tool_calls": False,
            "temperature": self.body.temperature,
            "top_p": self.body.top_p,
            "tool_choice": "none",
            "tools": [],
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
        return self.response(gathered.text, gathered.finish)

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
        where = {"item_id": self.item, "output_index": 0, "content_index": 0}
        try:
            yield self.event("response.created", response=self.response(None, None))
            yield self.event("response.in_progress", response=self.response(None, None))
            yield self.event(
                "response.output_item.added", output_index=0, item=self.message("", "in_progress")
            )
            yield self.event("response.content_part.added", **where, part=self.part(""))
            text, finish, waiting = [], None, list[Token]()  # tokens of text not yet sent
            async for chunk in self.choice.chunks():
                self.tokens.extend(chunk.tokens)
                waiting.extend(chunk.tokens)
                if chunk.text:
                    text.append(chunk.text)
                    logprobs = self.logprobs(waiting)
                    yield self.event(
                        "response.output_text.delta", **where, delta=chunk.text, logprobs=logprobs
                    )
                    waiting = []
                finish = chunk.finish or finish
            whole, ended = "".join(text), self.response("".join(text), finish)
            every = self.logprobs(self.tokens)
            yield self.event("response.output_text.done", **where, text=whole, logprobs=every)
            yield self.event("response.content_part.done", **where, part=self.part(whole))
            yield self.event("response.output_item.done", output_index=0, item=ended["output"][0])
            done = "response.incomplete" if ended["status"] == "incomplete" else "response.completed"
            yield self.event(done, response=ended)
        except Exception as error:  # the stream has begun: the error goes in it, as OpenAI's `error` event
            logger.exception("a streamed answer failed")
            yield self.event("error", code="server_error", message=f"the answer failed: {error}", param=None)
        finally:
            self.record(path)

    def event(self, kind: str, **fields: Any) -> dict[str, str]:
        self.sequence += 1
        return {
            "event": kind,
            "data": compact({"type": kind, "sequence_number": self.sequence - 1, **fields}),
        }

    def record(self, path: str) -> None:
        record_end(path, self.started, [self.choice], self.asked)

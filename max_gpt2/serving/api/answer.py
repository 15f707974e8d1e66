"""How completions and chat completions answer: every choice started, then streamed or gathered.

Both routes ask the same of MAX's engine (`n` choices of each prompt, `Choice`, or its `n` best beams,
`beams.BeamChoice`) and differ only in the JSON around each choice, which a `Shape` says. `answer`
starts every choice first, so a prompt the tokenizer refuses is a 400 before any response begins, then
streams the choices' chunks as server-sent events, side by side, or waits for all and answers once. A
client that leaves stops its choices; one that fails mid-stream ends it with OpenAI's error object."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any, ClassVar, TypeVar

from max.pipelines.context.exceptions import InputError
from max.serve.router.openai_routes import record_request_end, record_request_start
from sse_starlette.sse import EventSourceResponse
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from max_gpt2.max_internals import error_body
from max_gpt2.serving.api.beams import beam_choices
from max_gpt2.serving.api.choices import Choice, Chunk, Gathered, Token, gather
from max_gpt2.serving.api.protocol import ChatRequest, CompletionRequest, Refusal, parse, refusal_response
from max_gpt2.serving.api.requests import Asked, check
from max_gpt2.serving.api.served import Served
from max_gpt2.serving.api.token_names import TokenNames
from max_gpt2.serving.api.vllm_fields import cut, in_groups
from max_gpt2.serving.api.waiting import side_by_side, unless_client_leaves
from max_gpt2.serving.tokenizer import ContextExceeded

logger = logging.getLogger("max.serve")


class Shape:
    """The JSON a route writes around each choice: a subclass a route (`completions.py`, `chat.py`)."""

    object: ClassVar[str]  # the response's `object`
    chunk_object: ClassVar[str]  # a streamed event's `object`
    id_prefix: ClassVar[str]
    prompt_field: ClassVar[str] = "prompt"  # the request field a refused prompt came from

    def __init__(self, asked: Asked, names: TokenNames) -> None:
        self.asked, self.names = asked, names

    @property
    def shown(self) -> int | None:
        """How many of a new token's alternatives show: `logprobs`, or all where the ids are listed."""
        return None if self.asked.logprob_ids else self.asked.logprobs

    def choice(self, index: int, choice: Choice, gathered: Gathered) -> dict[str, Any]:
        """A whole choice of a response."""
        raise NotImplementedError

    def delta(self, index: int, choice: Choice, chunk: Chunk, first: bool) -> dict[str, Any]:
        """A streamed event's choice: what `chunk` adds (`first`: the choice's first chunk)."""
        raise NotImplementedError

    def opening(self, index: int) -> dict[str, Any] | None:
        """A streamed choice's event before any of its chunks, if the route sends one."""
        return None

    def whole(self, choices: Sequence[Choice]) -> dict[str, Any]:
        """What a whole response carries besides its choices and `usage`, if anything."""
        return {}

    def heading(self, prompts: Sequence[Any]) -> dict[str, Any]:
        """What a response carries of its `prompts` (ids), whole or in a stream's first event, if anything."""
        return {}


Body = TypeVar("Body", CompletionRequest, ChatRequest)


async def respond(
    request: Request,
    kind: type[Body],
    shape: type[Shape],
    prompts_of: Callable[[Served, Body], Sequence[Any]],
) -> Response:
    """A route's answer: its body parsed as `kind` and checked, its prompts (`prompts_of`) answered in
    `shape`; a refusal's error body where anything is refused."""
    served = Served.of(request)
    try:
        _, model, asked, prompts = await checked(request, served, kind, prompts_of)
        shaped = shape(asked, TokenNames(served.engine, asked.ids_as_names))
        return await answer(request, served, shaped, asked, model, prompts)
    except Refusal as refusal:
        return refusal_response(refusal)


async def checked(
    request: Request, served: Served, kind: type[Body], prompts_of: Callable[[Served, Body], Sequence[Any]]
) -> tuple[Body, str, Asked, list[Any]]:
    """The request's body parsed as `kind` and checked, the served model's name it asks for, what it
    asks, and its prompts (`prompts_of`) cut as it asks; a `Refusal` for the first thing refused."""
    body = parse(kind, await request.body())
    model = served.model_name(body.model)
    asked = check(body, served.vocab_size, served.context_length, served.lora_scales)
    # A grammar's first compile and a chat template's rendering take a while: off the event loop.
    if asked.constraint is not None:
        await asyncio.to_thread(served.check_constraint, asked)
    prompts = await asyncio.to_thread(lambda: cut(prompts_of(served, body), asked.prompt_cut, served))
    return body, model, asked, prompts


async def answer(
    request: Request, served: Served, shape: Shape, asked: Asked, model: str, prompts: Sequence[Any]
) -> Response:
    """Starts every choice of `prompts` (`asked.n` each), then streams or gathers them."""
    choices = await start(request, served, asked, model, prompts, shape.prompt_field)
    ident, created = f"{shape.id_prefix}-{asked.answer_id or request.state.request_id}", int(time.time())
    head = {"id": ident, "created": created, "model": model}
    record_request_start()  # MAX's running-requests gauge, and its request counts at the end
    top = shape.heading(prompts)
    if asked.stream:
        return streamed(events(choices, shape, asked, head, request.url.path, top), asked)
    started = time.perf_counter()
    try:
        gathered = await unless_client_leaves(request, asyncio.gather(*map(gather, choices)))
    finally:
        await withdraw(choices)  # where one failed, the others stop too
        record_end(request.url.path, started, choices, asked)
    body = {
        **head,
        "object": shape.object,
        "choices": [
            shape.choice(i, choice, whole)
            for i, (choice, whole) in enumerate(zip(choices, gathered, strict=True))
        ],
        **shape.whole(choices),
        **top,
        "usage": usage(choices, asked),
    }
    return JSONResponse(body)


async def start(
    request: Request, served: Served, asked: Asked, model: str, prompts: Sequence[Any], prompt_field: str
) -> list[Choice]:
    """Every choice submitted, in OpenAI's order (each prompt's `n` together); a `Refusal` naming
    `prompt_field` for a prompt the tokenizer refuses, with those already submitted withdrawn."""
    if asked.beam_penalty is not None:
        return await beam_choices(request, served, asked, model, prompts, prompt_field)
    defaults = served.config.model.sampling_params_defaults
    timestamp, path, ident = request.state.request_timer.start_ns, request.url.path, request.state.request_id
    choices: list[Choice] = []
    try:
        for p, prompt in enumerate(prompts):
            for i in range(asked.n):
                made = asked.request(
                    f"{ident}-{p * asked.n + i}", model, prompt, i, defaults, timestamp, path
                )
                choices.append(await served.start(made, asked))
    except InputError as error:
        await withdraw(choices)
        raise refused_prompt(error, prompt_field, len(choices) // asked.n, len(prompts)) from None
    except BaseException:
        await withdraw(choices)
        raise
    return choices


def refused_prompt(error: InputError, field: str, index: int, count: int) -> Refusal:
    """The 400 for prompt `index` of `count` that the tokenizer refused (`error`), naming `field`, with the
    prompt's place where there are several."""
    where = field if count == 1 else f"{field}[{index}]"
    extra = error.fields if isinstance(error, ContextExceeded) else None
    return Refusal(field, str(error).replace("prompt:", f"{where}:", 1), extra=extra)


async def withdraw(choices: Sequence[Choice]) -> None:
    """Stops choices no one will read (the worker is told)."""
    for choice in choices:
        await choice.close()


async def events(
    choices: list[Choice], shape: Shape, asked: Asked, head: dict[str, Any], path: str, top: dict[str, Any]
) -> AsyncIterator[str]:
    """The server-sent events of a streamed answer: each choice's chunks as they come (the first event
    with `top`), then `usage` where asked, then `[DONE]`; a choice that fails ends the stream with
    OpenAI's error object."""
    started, first = time.perf_counter(), set(range(len(choices)))
    usage_none = {"usage": None} if asked.include_usage else {}  # OpenAI's: null on every other chunk
    once = [top]

    def event(delta: dict[str, Any]) -> str:
        so_far = {"usage": usage(choices, asked)} if asked.usage_every_chunk else usage_none
        extra = once.pop() if once else {}
        return compact({**head, "object": shape.chunk_object, "choices": [delta], **so_far, **extra})

    try:
        for index in range(len(choices)):
            if (opening := shape.opening(index)) is not None:
                yield event(opening)
        streams = [in_groups(choice.chunks(), asked.stream_interval) for choice in choices]
        async for index, chunk in side_by_side(streams):
            if not (chunk.text or chunk.tokens or chunk.finish or index in first):
                continue
            yield event(shape.delta(index, choices[index], chunk, index in first))
            first.discard(index)
        if asked.include_usage:
            yield compact(
                {**head, "object": shape.chunk_object, "choices": [], "usage": usage(choices, asked)}
            )
        yield "[DONE]"
    except Exception as error:  # the stream has begun: the error goes in it
        logger.exception("a streamed answer failed")
        yield compact(error_body(500, f"the answer failed while streaming: {error}", None))
    finally:
        record_end(path, started, choices, asked)


def streamed(stream: AsyncIterator[Any], asked: Asked) -> EventSourceResponse:
    return EventSourceResponse(stream, ping=asked.ping_s or 100000, sep="\n")  # pinged as asked


def record_end(path: str, started: float, choices: Sequence[Choice], asked: Asked) -> None:
    """MAX's metrics of a request's end (`started` by `time.perf_counter`), as its own routes record them."""
    record_request_end(path, (time.perf_counter() - started) * 1000, *counts(choices, asked))


def compact(event: dict[str, Any]) -> str:
    """An event as JSON, as a response body is written (no spaces, UTF-8 as it is)."""
    return json.dumps(event, separators=(",", ":"), ensure_ascii=False)


def counts(choices: Sequence[Choice], asked: Asked) -> tuple[int, int]:
    """Tokens made by all choices, and prompt tokens (each prompt once), for MAX's metrics."""
    found = usage(choices, asked)
    return found["completion_tokens"], found["prompt_tokens"]


def usage(choices: Sequence[Choice], asked: Asked) -> dict[str, Any]:
    """OpenAI's `usage`: each prompt's tokens once, however many choices it has, and every choice's; of
    the prompt tokens, those read from MAX's prefix cache (its first choice's)."""
    prompt = sum(len(choice.prompt) for choice in choices[:: asked.n])
    cached = sum(choice.cached for choice in choices[:: asked.n])
    made = sum(choice.made for choice in choices)
    totals = {"prompt_tokens": prompt, "completion_tokens": made, "total_tokens": prompt + made}
    return {**totals, "prompt_tokens_details": {"cached_tokens": cached}}


def token_ids(asked: Asked, choice: Choice, tokens: Sequence[Token], first: bool) -> dict[str, Any]:
    """The ids of `tokens` (and on a choice's first, its prompt's) where `return_token_ids` asked."""
    if not asked.return_token_ids:
        return {}
    ids = {"token_ids": [token.id for token in tokens]}
    return {**ids, "prompt_token_ids": [token.id for token in choice.prompt]} if first else ids

"""`POST /v1/chat/completions`: messages rendered by a chat template, answered as OpenAI's chat.

The messages become the prompt (`max_gpt2.serving.api.chat_prompt`), and every completions option
applies from there (`max_gpt2.serving.api.answer`); tools are called as a request names them
(`max_gpt2.serving.api.tools`). Log-probabilities come in the chat shape (`logprobs.content[]`,
with `bytes` and `top_logprobs`). llama-server's `POST /apply-template` answers the rendered text
alone, and its `POST /v1/chat/completions/input_tokens` the prompt's size. Routes of other APIs
that run as one chat completion (the Responses and Messages APIs) start it with `start_chat`.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from typing import Any, Protocol

from max.serve.router.openai_routes import record_request_start
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from max_gpt2.serving.api.answer import (
    Shape,
    respond,
    start,
    streamed,
    token_ids,
)
from max_gpt2.serving.api.chat_prompt import prompt_ids, rendered
from max_gpt2.serving.api.choices import Choice, Chunk, Gathered, Token, gather
from max_gpt2.serving.api.protocol import ChatRequest, Refusal, parse, refusal_response
from max_gpt2.serving.api.requests import Asked, check
from max_gpt2.serving.api.served import Served
from max_gpt2.serving.api.token_names import TokenNames
from max_gpt2.serving.api.tools import ToolStream
from max_gpt2.serving.api.vllm_fields import prompt_report
from max_gpt2.serving.api.waiting import unless_client_leaves


async def create_chat_completion(request: Request) -> Response:
    return await respond(request, ChatRequest, ChatShape, lambda served, body: [prompt_ids(served, body)])


async def apply_template(request: Request) -> Response:
    """llama-server's `POST /apply-template`: a chat request's messages as the template renders them."""
    served = Served.of(request)
    try:
        body = parse(ChatRequest, await request.body())
        return JSONResponse({"prompt": await asyncio.to_thread(rendered, served, body)})
    except Refusal as refusal:
        return refusal_response(refusal)


async def count_chat_tokens(request: Request) -> Response:
    """llama-server's `POST /v1/chat/completions/input_tokens`: the size of a chat request's prompt."""
    try:
        return input_tokens(await prompt_size(Served.of(request), parse(ChatRequest, await request.body())))
    except Refusal as refusal:
        return refusal_response(refusal)


async def prompt_size(served: Served, chat: ChatRequest) -> int:
    """How many tokens `chat`'s prompt is, for the counting routes; a `Refusal` for a model not served."""
    served.model_name(chat.model)
    return len(await asyncio.to_thread(prompt_ids, served, chat))


def input_tokens(count: int) -> JSONResponse:
    """OpenAI's answer to `POST /v1/responses/input_tokens`, which llama-server gives for chats too."""
    return JSONResponse({"object": "response.input_tokens", "input_tokens": count})


async def start_chat(
    request: Request, served: Served, chat: ChatRequest, prompt_field: str
) -> tuple[str, Asked, Choice]:
    """`chat` checked and its one choice started, for a route that runs as a chat completion: the model's
    served name, what the request asks, the choice; a `Refusal` naming `prompt_field` for a prompt
    past the context."""
    model = served.model_name(chat.model)
    asked = check(chat, served.vocab_size, served.context_length, served.lora_scales)
    if asked.constraint is not None:  # a grammar's first compile takes a while: off the event loop
        await asyncio.to_thread(served.check_constraint, asked)
    prompt = await asyncio.to_thread(prompt_ids, served, chat)
    return model, asked, (await start(request, served, asked, model, [prompt], prompt_field))[0]


class OneChoice(Protocol):
    """A route's answer of one chat choice: its events, streamed, or its body (`answered`) once the
    choice is whole; and MAX's metrics of the request's end (`record`)."""

    def events(self, path: str) -> AsyncIterator[dict[str, str]]: ...
    def answered(self, gathered: Gathered) -> dict[str, Any]: ...
    def record(self, path: str) -> None: ...


async def answer_one(request: Request, answer: OneChoice, asked: Asked, choice: Choice) -> Response:
    """`answer`'s stream, or its body once `choice` is read to its end (stopped if the client leaves)."""
    record_request_start()  # MAX's running-requests gauge, and its request counts at the end
    if asked.stream:
        return streamed(answer.events(request.url.path), asked)
    try:
        gathered = await unless_client_leaves(request, gather(choice))
    finally:
        await choice.close()
        answer.record(request.url.path)
    return JSONResponse(answer.answered(gathered))


class ChatShape(Shape):
    """A chat completion's JSON around each choice."""

    object = "chat.completion"
    chunk_object = "chat.completion.chunk"
    id_prefix = "chatcmpl"
    prompt_field = "messages"

    def __init__(self, asked: Asked, names: TokenNames) -> None:
        super().__init__(asked, names)
        self.calls: dict[int, ToolStream] = {}  # each streamed choice's tool calls, where it makes them

    def choice(self, index: int, choice: Choice, gathered: Gathered) -> dict[str, Any]:
        message: dict[str, Any] = {
            "role": "assistant",
            "content": (self.asked.echo_text or "") + gathered.text,
        }
        finish = gathered.finish.reason
        if (tools := self.asked.tools) is not None:
            message |= {"content": None, "tool_calls": tools.calls(gathered.text)}
            finish = tools.finish(finish)
        return {
            "index": index,
            "message": message,
            "logprobs": self._logprobs(gathered.tokens),
            "finish_reason": finish,
            "stop_reason": gathered.finish.stop_reason,
            **token_ids(self.asked, choice, gathered.tokens, True),
        }

    def whole(self, choices: Sequence[Choice]) -> dict[str, Any]:
        """vLLM's `prompt_logprobs` of the prompt the choices share, where asked."""
        return prompt_report(choices[0].prompt, self.asked.prompt_logprobs, self.names)

    def heading(self, prompts: Sequence[Any]) -> dict[str, Any]:
        """vLLM's `prompt_text`: the prompt's ids as text (the rendered messages), where asked."""
        if not self.asked.prompt_text:
            return {}
        return {"prompt_text": self.names.tokenizer.decode(prompts[0], skip_special_tokens=False)}

    def opening(self, index: int) -> dict[str, Any]:
        """The role alone, before any text, as OpenAI and vLLM send it."""
        return {
            "index": index,
            "delta": {"role": "assistant", "content": ""},
            "logprobs": None,
            "finish_reason": None,
        }

    def delta(self, index: int, choice: Choice, chunk: Chunk, first: bool) -> dict[str, Any]:
        text = (self.asked.echo_text or "") + chunk.text if first else chunk.text  # vLLM's echo: first
        delta = {} if chunk.finish and not text else {"content": text}  # as OpenAI's
        finish = chunk.finish.reason if chunk.finish else None
        if (tools := self.asked.tools) is not None:
            calls = self.calls.setdefault(index, ToolStream(tools)).delta(chunk.text)
            delta, finish = ({"tool_calls": calls} if calls else {}), finish and tools.finish(finish)
        return {
            "index": index,
            "delta": delta,
            "logprobs": self._logprobs(chunk.tokens),
            "finish_reason": finish,
            "stop_reason": chunk.finish.stop_reason if chunk.finish else None,
            **token_ids(self.asked, choice, chunk.tokens, first),
        }

    def _logprobs(self, tokens: Sequence[Token]) -> dict[str, Any] | None:
        if self.asked.logprobs is None:
            return None
        if self.asked.post_sampling:  # llama-server's entries, of what each token was drawn from
            return {"content": self.names.llama_entries(tokens, self.asked.logprobs, True)}
        return {"content": self.entries(tokens)}

    def entries(self, tokens: Sequence[Token]) -> list[dict[str, Any]]:
        """OpenAI's logprobs of `tokens` (the chat's and the Responses API's): each token with its bytes
        and its `top_logprobs` likeliest alternatives."""
        return [self._entry(token.id, token.logprob, token) for token in tokens]

    def _entry(self, token: int, value: float | None, of: Token | None = None) -> dict[str, Any]:
        entry: dict[str, Any] = {
            "token": self.names(token),
            "logprob": value,
            "bytes": self.names.bytes(token),
        }
        if of is not None:
            ranked = list(of.top.items())[: self.shown]
            entry["top_logprobs"] = [self._entry(alternative, logprob) for alternative, logprob in ranked]
        return entry

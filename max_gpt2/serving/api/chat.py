"""`POST /v1/chat/completions`: messages rendered by a chat template, answered as OpenAI's chat.

The template is the checkpoint's own (`chat_template` in its `tokenizer_config.json`, or a
GGUF file's `tokenizer.chat_template`), or the one `max-gpt2 serve --chat-template` gives
(a Jinja file, or a built-in name: `max_gpt2.serving.chat_templates`); a server with neither
answers 400 naming the flag, as vLLM does. Hugging Face's tokenizer renders it (Jinja in a
sandbox, with its helpers), and the rendered text's ids are the prompt: every completions
option applies from there (`max_gpt2.serving.api.answer`). Messages are checked first: a role
of `system`, `developer`, `user` or `assistant`, and content as a string or text parts, each
refusal naming the message and field. Log-probabilities come in the chat shape
(`logprobs.content[]`, with `bytes` and `top_logprobs`). llama-server's `POST /apply-template`
answers the rendered text alone, and its `POST /v1/chat/completions/input_tokens` the prompt's
size. Routes of other APIs that run as one chat completion (the Responses and Messages APIs)
start it with `start_chat`.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import AsyncIterator, Sequence
from typing import Any, Protocol

from jinja2 import TemplateError
from max.serve.router.openai_routes import record_request_start
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from max_gpt2.serving.api.answer import (
    Gathered,
    Shape,
    gather,
    respond,
    start,
    streamed,
    token_ids,
    unless_client_leaves,
)
from max_gpt2.serving.api.choices import Choice, Chunk, Token
from max_gpt2.serving.api.protocol import ChatRequest, Refusal, parse, refusal_response, unset
from max_gpt2.serving.api.requests import Asked, check
from max_gpt2.serving.api.served import Served

ROLES = ("system", "developer", "user", "assistant")
MESSAGE_FIELDS = {"role", "content", "name"}


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
    asked = check(chat, served.vocab_size, served.context_length)
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


def rendered(served: Served, body: ChatRequest) -> str:
    """A chat request's messages, checked and rendered by the chat template, as text."""
    messages = checked_messages(body.messages)
    return render(
        served, messages, body.add_generation_prompt, body.continue_final_message, body.chat_template_kwargs
    )


def prompt_ids(served: Served, body: ChatRequest) -> list[int]:
    """A chat request's prompt, `rendered`, as token ids (the template writes any special tokens itself)."""
    return served.tokenizer.delegate.encode(rendered(served, body), add_special_tokens=False)


def checked_messages(messages: Sequence[Any]) -> list[dict[str, str]]:
    """`messages` as the template reads them (role, content as one string, name where given); a
    `Refusal` naming the first message and field that is not one."""
    if not messages:
        raise Refusal("messages", "messages: empty; give at least one message")
    checked = []
    for index, message in enumerate(messages):
        where = f"messages[{index}]"
        if not isinstance(message, dict):
            raise Refusal("messages", f"{where}: must be an object with a role and content; got {message!r}")
        for field in message.keys() - MESSAGE_FIELDS:
            if unset(message[field]):
                continue  # OpenAI's message objects carry `refusal: null`, `tool_calls: []` and the like
            why = (
                "GPT-2 calls no tools"
                if field.startswith(("tool", "function"))
                else "not a field of a message"
            )
            raise Refusal("messages", f"{where}.{field}: {why}")
        role = message.get("role")
        if role not in ROLES:
            known = ", ".join(ROLES)
            if role is None:
                raise Refusal("messages", f"{where}.role: required, one of {known}")
            why = "GPT-2 calls no tools" if role in ("tool", "function") else f"must be one of {known}"
            raise Refusal("messages", f"{where}.role: {why}; got {role!r}")
        checked.append({"role": role, "content": content(message.get("content"), where)})
        if (name := message.get("name")) is not None:
            if not isinstance(name, str):
                raise Refusal("messages", f"{where}.name: must be a string; got {name!r}")
            checked[-1]["name"] = name
    return checked


def content(value: Any, where: str) -> str:
    """A message's content as one string: a string, or OpenAI's text parts joined."""
    if isinstance(value, str):
        return value
    if value is None:
        raise Refusal("messages", f"{where}.content: required (a string, or a list of text parts)")
    if isinstance(value, list):
        texts = []
        for index, part in enumerate(value):
            if not (
                isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)
            ):
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise Refusal(
                    "messages",
                    f"{where}.content[{index}]: GPT-2 reads text parts only "
                    f'({{"type": "text", "text": ...}}); got {kind!r}',
                )
            texts.append(part["text"])
        return "\n".join(texts)  # as vLLM and llama-server join a message's text parts
    raise Refusal("messages", f"{where}.content: must be a string or a list of text parts; got {value!r}")


def render(
    served: Served,
    messages: list[dict[str, str]],
    add_generation_prompt: bool,
    continue_final_message: bool,
    options: dict[str, Any] | None,
) -> str:
    """`messages` rendered by the served chat template: the prompt's text. `options` are the template's
    variables (`chat_template_kwargs`), where `add_generation_prompt` and `continue_final_message` given
    override the request's own, as vLLM lets them."""
    tokenizer = served.tokenizer.delegate  # Hugging Face's, holding the template
    if tokenizer.chat_template is None:
        raise Refusal(
            None,
            "this model has no chat template (its tokenizer_config.json has no chat_template): start the "
            "server with --chat-template FILE, or a built-in one (--chat-template chatml), or use "
            "/v1/completions",
        )
    flags = {"add_generation_prompt": add_generation_prompt, "continue_final_message": continue_final_message}
    variables = dict(options or {})
    rendering = inspect.signature(tokenizer.apply_chat_template).parameters.keys() - {"kwargs"}
    for key in variables.keys() & rendering:
        value = variables.pop(key)
        if key not in flags:
            raise Refusal(
                "chat_template_kwargs", f"chat_template_kwargs.{key}: the rendering's own, not a template's"
            )
        if not isinstance(value, bool):
            raise Refusal("chat_template_kwargs", f"chat_template_kwargs.{key}: must be true or false")
        flags[key] = value
    if flags["add_generation_prompt"] and flags["continue_final_message"]:
        raise Refusal(
            "continue_final_message",
            "continue_final_message: cannot be true with add_generation_prompt (the default): set "
            "add_generation_prompt to false to continue the last message",
        )
    if flags["continue_final_message"] and messages[-1]["role"] != "assistant":
        raise Refusal(
            "continue_final_message", "continue_final_message: the last message is not the assistant's"
        )
    try:
        return tokenizer.apply_chat_template(messages, tokenize=False, **flags, **variables)
    except (TemplateError, TypeError, ValueError) as error:  # the template's raise_exception
        raise Refusal("messages", f"messages: the chat template could not render them: {error}") from None


class ChatShape(Shape):
    """A chat completion's JSON around each choice."""

    object = "chat.completion"
    chunk_object = "chat.completion.chunk"
    id_prefix = "chatcmpl"
    prompt_field = "messages"

    def choice(self, index: int, choice: Choice, gathered: Gathered) -> dict[str, Any]:
        return {
            "index": index,
            "message": {"role": "assistant", "content": gathered.text},
            "logprobs": self._logprobs(gathered.tokens),
            "finish_reason": gathered.finish.reason,
            "stop_reason": gathered.finish.stop_reason,
            **token_ids(self.asked, choice, gathered.tokens, True),
        }

    def opening(self, index: int) -> dict[str, Any]:
        """The role alone, before any text, as OpenAI and vLLM send it."""
        return {
            "index": index,
            "delta": {"role": "assistant", "content": ""},
            "logprobs": None,
            "finish_reason": None,
        }

    def delta(self, index: int, choice: Choice, chunk: Chunk, first: bool) -> dict[str, Any]:
        return {
            "index": index,
            "delta": {} if chunk.finish and not chunk.text else {"content": chunk.text},  # as OpenAI's
            "logprobs": self._logprobs(chunk.tokens),
            "finish_reason": chunk.finish.reason if chunk.finish else None,
            "stop_reason": chunk.finish.stop_reason if chunk.finish else None,
            **token_ids(self.asked, choice, chunk.tokens, first),
        }

    def _logprobs(self, tokens: Sequence[Token]) -> dict[str, Any] | None:
        if self.asked.logprobs is None:
            return None
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
            ranked = list(of.top.items())[: self.asked.logprobs]
            entry["top_logprobs"] = [self._entry(alternative, logprob) for alternative, logprob in ranked]
        return entry

"""`POST /tokenize` and `POST /detokenize`, in llama-server's request shape and vLLM's alike.

    POST /tokenize   {"content": "Hello", "with_pieces": true}     llama-server's
    POST /tokenize   {"prompt": "Hello", "return_token_strs": true}  vLLM's (or "messages": [...])
    -> {"tokens": [...], "count": 1, "max_model_len": 1024}          (and "token_strs" where asked)
    POST /detokenize {"tokens": [15496]}  -> {"content": "Hello", "prompt": "Hello"}

The ids are the served tokenizer's, the ones `lm.tokenizer` gives. `with_pieces` makes each
token `{"id", "piece"}`, the piece its text, or its bytes where they are not whole UTF-8
(llama-server's); `return_token_strs` adds each token's vocabulary entry (vLLM's). Messages
are rendered by the chat template as a chat request's are. Special tokens are added where
asked (`add_special`, `add_special_tokens`; GPT-2's tokenizer has none to add) and written
out when decoding, as both servers do.
"""

from __future__ import annotations

import asyncio
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from max_gpt2.inference.tokenizer import token_bytes
from max_gpt2.serving.api.chat_prompt import prompt_ids
from max_gpt2.serving.api.choices import tokenizer_of
from max_gpt2.serving.api.protocol import DetokenizeRequest, Refusal, TokenizeRequest, parse, refusal_response
from max_gpt2.serving.api.served import Served


async def tokenize(request: Request) -> Response:
    served = Served.of(request)
    try:
        body = parse(TokenizeRequest, await request.body())
        served.model_name(body.model)
        # A long text's ids and their JSON: off the event loop, which other requests share.
        return await asyncio.to_thread(lambda: JSONResponse(tokenize_answer(served, body)))
    except Refusal as refusal:
        return refusal_response(refusal)


def tokenize_answer(served: Served, body: TokenizeRequest) -> dict[str, Any]:
    """The answer to a tokenize request: its ids, with their pieces and vocabulary entries where asked."""
    ids = tokenized(served, body)
    tokenizer = tokenizer_of(served.engine)
    tokens: list[Any] = ids
    if body.with_pieces:
        tokens = [{"id": token, "piece": piece(token_bytes(tokenizer, token))} for token in ids]
    answer: dict[str, Any] = {"tokens": tokens, "count": len(ids), "max_model_len": served.context_length}
    if body.return_token_strs:
        answer["token_strs"] = [tokenizer.id_to_token(token) for token in ids]
    return answer


async def detokenize(request: Request) -> Response:
    served = Served.of(request)
    try:
        body = parse(DetokenizeRequest, await request.body())
        served.model_name(body.model)
        known = tokenizer_of(served.engine).get_vocab_size(with_added_tokens=True)
        for index, token in enumerate(body.tokens):
            if not 0 <= token < known:
                raise Refusal("tokens", f"tokens[{index}]: {token} is not a token id (0 to {known - 1})")
    except Refusal as refusal:
        return refusal_response(refusal)
    text = served.tokenizer.delegate.decode(body.tokens, skip_special_tokens=False)
    return JSONResponse({"content": text, "prompt": text})  # llama-server's key, and vLLM's


def tokenized(served: Served, body: TokenizeRequest) -> list[int]:
    """The ids of the one thing `body` gives to tokenize: `content`, `prompt` or `messages`."""
    given = [name for name in ("content", "prompt", "messages") if getattr(body, name) is not None]
    if len(given) != 1:
        raise Refusal(
            given[-1] if given else None,
            f"give one of content (llama-server's), prompt or messages (vLLM's); got {given or 'none'}",
        )
    add = [value for value in (body.add_special, body.add_special_tokens) if value is not None]
    if len(set(add)) > 1:
        raise Refusal("add_special_tokens", "add_special_tokens: says the opposite of add_special; give one")
    if body.messages is not None:  # the template writes its own special tokens (vLLM's default: none)
        return prompt_ids(served, body, add[0] if add else False)
    text = body.content if body.content is not None else body.prompt
    assert text is not None
    special = add[0] if add else body.prompt is not None  # llama-server adds none by default, vLLM does
    return served.tokenizer.delegate.encode(text, add_special_tokens=special)


def piece(data: bytes) -> str | list[int]:
    """A token's piece as llama-server gives it: its text, or its bytes where they are not UTF-8."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return list(data)

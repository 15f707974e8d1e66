"""`POST /v1/embeddings`: OpenAI's embeddings, with vLLM's and llama-server's fields, on a server started
with `--embeddings` (MAX's embeddings pipeline: `max_gpt2.serving.embeddings_model`).

    POST /v1/embeddings {"input": ["a text", "another"], "encoding_format": "base64"}
    -> {"object": "list", "data": [{"object": "embedding", "index": 0, "embedding": ...}, ...],
        "model": "gpt2", "usage": {"prompt_tokens": 5, "total_tokens": 5}}

Each input (a text, or token ids) is one vector of `n_embd` floats: its final hidden states pooled
as the server pools (`--pooling`), then divided by its Euclidean length, as vLLM and llama-server
return them (`normalize: false`, vLLM's, or llama-server's `embd_normalize` say otherwise).
`encoding_format` "base64" sends each vector's float32 bytes, little-endian here, as OpenAI's and the
`openai` client's default; vLLM's `embed_dtype` and `endianness` change them, and its "bytes" sends
them all as the body, where they lie in a `metadata` header (`max_gpt2.serving.api.embedding_bytes`).
An input longer than the context is refused, as OpenAI refuses it, unless vLLM's
`truncate_prompt_tokens` keeps its last tokens. vLLM's chat embeddings give `messages` for `input`:
the chat, rendered by the served chat template as `/v1/chat/completions` renders it (without the
generation prompt unless asked), is one vector. The worker pools; the norm is applied
here, per request. Each request counts in MAX's request metrics, its tokens as input tokens.

llama-server's own routes, `POST /embedding` and `/embeddings`, answer in its shape, a list of
`{"index", "embedding": [vector]}` (one pooled vector a text, as its pooled models give), and so does
`/v1/embeddings` given llama-server's `content` for `input`, as llama-server answers it.
"""

from __future__ import annotations

import asyncio
import base64
import json
import time
import uuid
from typing import Any, Literal

import numpy as np
from max.pipelines.context.exceptions import InputError
from max.pipelines.modeling.types import RequestID, TextGenerationRequest
from max.serve.router.openai_routes import record_request_end, record_request_start
from pydantic import BaseModel, ConfigDict
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from max_gpt2.inference.embeddings import normalized
from max_gpt2.serving.api.chat_prompt import prompt_ids
from max_gpt2.serving.api.embedding_bytes import EMBED_DTYPES, raw
from max_gpt2.serving.api.protocol import Refusal, parse, refusal_response
from max_gpt2.serving.api.served import Served
from max_gpt2.serving.api.token_fields import prompts
from max_gpt2.serving.api.vllm_fields import prompt_cut
from max_gpt2.serving.tokenizer import ContextExceeded

MOST_INPUTS = 2048  # inputs one request may give, as OpenAI allows
LLAMA_PATHS = ("/embedding", "/embeddings")  # llama-server's own routes, answered in its shape


class EmbeddingRequest(BaseModel):
    """OpenAI's embeddings request, with vLLM's `normalize`, `truncate_prompt_tokens`,
    `add_special_tokens` and chat embeddings (`messages` for `input`, with its template's fields) and
    llama-server's `embd_normalize` and `content` (for `input`, asking for its shape of answer)."""

    model_config = ConfigDict(extra="forbid")

    model: str | None = None
    input: str | list[str] | list[int] | list[list[int]] | None = None
    content: str | list[str] | list[int] | list[list[int]] | None = None  # llama-server's, for input
    messages: list[Any] | None = None  # one vector for the chat, as the chat template renders it
    encoding_format: Literal["float", "base64", "bytes", "bytes_only"] = "float"
    embed_dtype: Literal[EMBED_DTYPES] = "float32"  # vLLM's, for base64 and bytes
    endianness: Literal["native", "big", "little"] = "native"
    dimensions: int | None = None
    user: str | None = None  # an end-user id OpenAI keeps for abuse monitoring; nothing here reads it
    normalize: bool | None = None
    embd_normalize: int | None = None
    truncate_prompt_tokens: int | None = None
    add_special_tokens: bool | None = None  # default: true for input, false for messages, as vLLM's
    add_generation_prompt: bool = False  # vLLM's defaults for a chat's embedding
    continue_final_message: bool = False
    chat_template_kwargs: dict[str, Any] | None = None


CHAT_FIELDS = {"add_generation_prompt", "continue_final_message", "chat_template_kwargs"}
FOR_BYTES = {"embed_dtype", "endianness"}


async def create_embedding(request: Request) -> Response:
    served = Served.of(request)
    try:
        body = parse(EmbeddingRequest, await request.body())
        name = served.model_name(body.model)
        norm = norm_of(body)
        if body.dimensions is not None and body.dimensions != (width := served.tokenizer.n_embd):
            raise Refusal(
                "dimensions",
                f"dimensions: GPT-2's embeddings have {width}; it was not trained to shorten them "
                f"(vLLM refuses the same for models without Matryoshka training); got {body.dimensions}",
            )
        if body.encoding_format == "float" and (unused := FOR_BYTES & body.model_fields_set):
            field = sorted(unused)[0]
            raise Refusal(field, f"{field}: for encoding_format base64 or bytes; floats are JSON's numbers")
        llama_shape = request.url.path in LLAMA_PATHS or body.content is not None
        if llama_shape and body.encoding_format != "float":
            raise Refusal(
                "encoding_format",
                "encoding_format: llama-server's shape of answer (its /embedding, or content) holds floats; "
                "/v1/embeddings with input gives base64 and bytes",
            )
        ids = await asyncio.to_thread(token_ids, served, body)
        vectors = await embedded(served, name, ids, request.url.path)
    except Refusal as refusal:
        return refusal_response(refusal)
    unit = normalized(np.stack(vectors), norm)
    if llama_shape:  # llama-server's list, one pooled vector a text
        return JSONResponse(
            [{"index": index, "embedding": [vector.tolist()]} for index, vector in enumerate(unit)]
        )
    # Thousands of vectors' JSON: off the event loop, which other requests share.
    return await asyncio.to_thread(answer, name, unit, ids, body)


def answer(name: str, vectors: np.ndarray, prompts: list[list[int]], body: EmbeddingRequest) -> Response:
    """OpenAI's list of embeddings, with vLLM's `id` and `created`; or, for "bytes", vLLM's body of every
    vector's bytes, their places and the rest in its `metadata` header ("bytes_only": none)."""
    tokens = sum(len(prompt) for prompt in prompts)
    head = {"id": f"embd-{uuid.uuid4().hex}", "object": "list", "created": int(time.time()), "model": name}
    usage = {"prompt_tokens": tokens, "total_tokens": tokens}
    if body.encoding_format in ("float", "base64"):
        data = [
            {"object": "embedding", "index": index, "embedding": encoded(vector, body)}
            for index, vector in enumerate(vectors)
        ]
        return JSONResponse({**head, "data": data, "usage": usage})
    each = [raw(vector, body.embed_dtype, body.endianness) for vector in vectors]
    ends = np.cumsum([len(part) for part in each]).tolist()
    items = [
        {"index": index, "embed_dtype": body.embed_dtype, "endianness": body.endianness}
        | {"start": end - len(part), "end": end, "shape": [len(vector)]}
        for index, (part, end, vector) in enumerate(zip(each, ends, vectors, strict=True))
    ]
    metadata = {"metadata": json.dumps({**head, "data": items, "usage": usage})}
    headers = None if body.encoding_format == "bytes_only" else metadata
    return Response(b"".join(each), media_type="application/octet-stream", headers=headers)


def norm_of(body: EmbeddingRequest) -> int:
    """The norm each vector is divided by (`max_gpt2.inference.embeddings.normalized`): llama-server's
    `embd_normalize`, or vLLM's `normalize` (true: Euclidean, false: none); Euclidean by default."""
    from_normalize = None if body.normalize is None else 2 if body.normalize else -1
    if body.embd_normalize is None:
        return 2 if from_normalize is None else from_normalize
    if body.embd_normalize < -1:
        raise Refusal(
            "embd_normalize",
            f"embd_normalize: -1 (none), 0 (largest value to 32760), 1 (taxicab), 2 (Euclidean) or a "
            f"p-norm's p; got {body.embd_normalize}",
        )
    if from_normalize is not None and from_normalize != body.embd_normalize:
        raise Refusal(
            "embd_normalize",
            f"embd_normalize: {body.embd_normalize} says otherwise than normalize: {body.normalize}; "
            "give one",
        )
    return body.embd_normalize


def token_ids(served: Served, body: EmbeddingRequest) -> list[list[int]]:
    """Each input's token ids, checked as the tokenizer checks a prompt, or cut to
    `truncate_prompt_tokens`' last tokens."""
    field, given = inputs(served, body)
    return checked(served, given, field, prompt_cut(body.truncate_prompt_tokens, served.context_length))


def checked(served: Served, given: list[list[int]], field: str, keep: int | None) -> list[list[int]]:
    """The token ids `given` in `field`, each cut to its last `keep` (None: whole) and checked as the
    tokenizer checks a prompt: a refusal naming the field (and its index, among several) otherwise."""
    ids_checked = []
    for index, ids in enumerate(given):
        if keep is not None:
            ids = ids[-keep:]
        try:
            served.tokenizer.check_ids(ids, field if len(given) == 1 else f"{field}[{index}]")
        except ContextExceeded as error:
            raise Refusal(field, f"{error} Or give truncate_prompt_tokens.", extra=error.fields) from None
        except InputError as error:
            raise Refusal(field, str(error)) from None
        ids_checked.append(list(ids))
    return ids_checked


def inputs(served: Served, body: EmbeddingRequest) -> tuple[str, list[list[int]]]:
    """The field the inputs came in, and their token ids: `input`'s (or llama-server's `content`'s) texts
    tokenized and id lists as given, or `messages` rendered by the chat template into one text, as
    vLLM's chat embeddings."""
    given_in = [name for name in ("input", "content", "messages") if getattr(body, name) is not None]
    if len(given_in) != 1:
        said = (
            f"{given_in[1]}: give {given_in[0]} or {given_in[1]}, not both" if given_in else "input: required"
        )
        raise Refusal(
            given_in[1] if given_in else "input",
            f"{said} (input: texts or token ids; messages: a chat, as vLLM embeds one; content: "
            "llama-server's input)",
        )
    if body.messages is not None:
        return "messages", [prompt_ids(served, body, bool(body.add_special_tokens))]
    if chat := sorted(CHAT_FIELDS & body.model_fields_set):
        raise Refusal(chat[0], f"{chat[0]}: for a chat (messages); this request gives {given_in[0]}")
    given = prompts(getattr(body, given_in[0]), given_in[0])
    if len(given) > MOST_INPUTS:
        raise Refusal(
            given_in[0], f"{given_in[0]}: at most {MOST_INPUTS} inputs a request, as OpenAI; got {len(given)}"
        )
    special = body.add_special_tokens is not False  # vLLM's default for input; GPT-2 has none to add
    return given_in[0], [
        served.tokenizer.delegate.encode(x, add_special_tokens=special) if isinstance(x, str) else x
        for x in given
    ]


async def embedded(served: Served, name: str, prompts: list[list[int]], path: str) -> list[np.ndarray]:
    """Each prompt's pooled vector from the worker, the prompts sent together (the worker batches them);
    counted in MAX's request metrics, their tokens as its input tokens."""
    requests = [
        TextGenerationRequest(request_id=RequestID(), model_name=name, prompt=prompt) for prompt in prompts
    ]
    record_request_start()
    started = time.perf_counter()
    try:
        outputs = await asyncio.gather(*(served.engine.encode(each) for each in requests))
    except InputError as error:  # the tokenizer's own checks, as the route's (`token_ids`)
        raise Refusal("input", str(error)) from None
    finally:
        tokens = sum(len(prompt) for prompt in prompts)
        record_request_end(path, (time.perf_counter() - started) * 1000, None, tokens)
    return [np.asarray(output.embeddings, np.float32) for output in outputs]


def encoded(vector: np.ndarray, body: EmbeddingRequest) -> list[float] | str:
    """A vector as JSON carries it: floats, or base64 of its bytes in `embed_dtype` and `endianness`."""
    if body.encoding_format == "base64":
        return base64.b64encode(raw(vector, body.embed_dtype, body.endianness)).decode("ascii")
    return vector.tolist()

"""`POST /v1/embeddings`: OpenAI's embeddings, with vLLM's and llama-server's fields, on a server started
with `--embeddings` (MAX's embeddings pipeline: `max_gpt2.serving.embeddings_model`).

    POST /v1/embeddings {"input": ["a text", "another"], "encoding_format": "base64"}
    -> {"object": "list", "data": [{"object": "embedding", "index": 0, "embedding": ...}, ...],
        "model": "gpt2", "usage": {"prompt_tokens": 5, "total_tokens": 5}}

Each input (a text, or token ids) is one vector of `n_embd` floats: its final hidden states pooled
as the server pools (`--pooling`), then divided by its Euclidean length, as vLLM and llama-server
return them (`normalize: false`, vLLM's, or llama-server's `embd_normalize` say otherwise).
`encoding_format` "base64" sends each vector's little-endian float32 bytes, as OpenAI's and the
`openai` client's default. An input longer than the context is refused, as OpenAI refuses it,
unless vLLM's `truncate_prompt_tokens` keeps its last tokens. The worker pools; the norm is
applied here, per request.
"""

from __future__ import annotations

import asyncio
import base64
import time
import uuid
from typing import Any, Literal

import numpy as np
from max.pipelines.context.exceptions import InputError
from max.pipelines.modeling.types import RequestID, TextGenerationRequest
from pydantic import BaseModel, ConfigDict
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from max_gpt2.inference.embeddings import normalized
from max_gpt2.serving.api.protocol import Refusal, parse, refusal_response
from max_gpt2.serving.api.served import Served

MOST_INPUTS = 2048  # inputs one request may give, as OpenAI allows


class EmbeddingRequest(BaseModel):
    """OpenAI's embeddings request, with vLLM's `normalize`, `truncate_prompt_tokens` and
    `add_special_tokens` and llama-server's `embd_normalize`."""

    model_config = ConfigDict(extra="forbid")

    model: str | None = None
    input: str | list[str] | list[int] | list[list[int]]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = None
    user: str | None = None  # an end-user id OpenAI keeps for abuse monitoring; nothing here reads it
    normalize: bool | None = None
    embd_normalize: int | None = None
    truncate_prompt_tokens: int | None = None
    add_special_tokens: bool = True  # GPT-2's tokenizer has none to add


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
        prompts = await asyncio.to_thread(token_ids, served, body)
        vectors = await embedded(served, name, prompts)
    except Refusal as refusal:
        return refusal_response(refusal)
    # Thousands of vectors' JSON: off the event loop, which other requests share.
    return await asyncio.to_thread(answer, name, normalized(np.stack(vectors), norm), prompts, body)


def answer(name: str, vectors: np.ndarray, prompts: list[list[int]], body: EmbeddingRequest) -> Response:
    """OpenAI's list of embeddings, with vLLM's `id` and `created`."""
    tokens = sum(len(prompt) for prompt in prompts)
    return JSONResponse(
        {
            "id": f"embd-{uuid.uuid4().hex}",
            "object": "list",
            "created": int(time.time()),
            "model": name,
            "data": [
                {"object": "embedding", "index": index, "embedding": encoded(vector, body.encoding_format)}
                for index, vector in enumerate(vectors)
            ],
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        }
    )


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
    """Each input's token ids (texts tokenized), checked: some, within the vocabulary, within the context
    or cut to `truncate_prompt_tokens`' last tokens."""
    given = body.input
    inputs: list[Any] = [given] if isinstance(given, str) or (given and isinstance(given[0], int)) else given
    if not inputs:
        raise Refusal("input", "input: empty; give a text, token ids, or a list of either")
    if len(inputs) > MOST_INPUTS:
        raise Refusal("input", f"input: at most {MOST_INPUTS} inputs a request, as OpenAI; got {len(inputs)}")
    context, keep = served.context_length, body.truncate_prompt_tokens
    if keep is not None and not (keep == -1 or 1 <= keep <= context):
        raise Refusal(
            "truncate_prompt_tokens",
            f"truncate_prompt_tokens: -1 (the context's {context}) or 1 to {context}; got {keep}",
        )
    prompts = []
    for index, item in enumerate(inputs):
        where = "input" if len(inputs) == 1 else f"input[{index}]"
        ids = item
        if isinstance(item, str):
            ids = served.tokenizer.delegate.encode(item, add_special_tokens=body.add_special_tokens)
        if not ids:
            raise Refusal("input", f"{where}: empty; an embedding needs at least one token")
        if outside := [token for token in ids if not 0 <= token < served.vocab_size]:
            raise Refusal(
                "input",
                f"{where}: token id {outside[0]} is outside the vocabulary (0 to {served.vocab_size - 1})",
            )
        if keep is not None:
            ids = ids[-(context if keep == -1 else keep) :]
        elif len(ids) > context:
            raise Refusal(
                "input",
                f"{where}: This model's maximum context length is {context} tokens, however you requested "
                f"{len(ids)} tokens in the input for embedding generation. Please reduce the length of the "
                "input, or give truncate_prompt_tokens.",
                extra={"code": "context_length_exceeded"},
            )
        prompts.append(list(ids))
    return prompts


async def embedded(served: Served, name: str, prompts: list[list[int]]) -> list[np.ndarray]:
    """Each prompt's pooled vector from the worker, the prompts sent together (the worker batches them)."""
    requests = [
        TextGenerationRequest(request_id=RequestID(), model_name=name, prompt=prompt) for prompt in prompts
    ]
    try:
        outputs = await asyncio.gather(*(served.engine.encode(each) for each in requests))
    except InputError as error:  # the tokenizer's own checks (the route's above run first)
        raise Refusal("input", str(error)) from None
    return [np.asarray(output.embeddings, np.float32) for output in outputs]


def encoded(vector: np.ndarray, encoding_format: str) -> list[float] | str:
    """A vector as JSON carries it: floats, or base64 of its little-endian float32 bytes."""
    if encoding_format == "base64":
        return base64.b64encode(vector.astype("<f4").tobytes()).decode("ascii")
    return vector.tolist()

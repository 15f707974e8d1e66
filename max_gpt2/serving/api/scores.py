"""vLLM's Score and Rerank APIs on a server of embeddings: how alike two texts are, as vLLM scores them
with an embedding model (a bi-encoder): the cosine of the two texts' vectors (`/v1/embeddings`' own).

    POST /score {"text_1": "a query", "text_2": ["a text", "another"]}
    -> {"id": "score-...", "object": "list", "created": ..., "model": "gpt2",
        "data": [{"index": 0, "object": "score", "score": 0.73}, ...], "usage": {...}}
    POST /rerank {"query": "a query", "documents": ["a text", "another"], "top_n": 1}
    -> {"id": "rerank-...", "model": "gpt2", "usage": {...},
        "results": [{"index": 1, "document": {"text": "another"}, "relevance_score": 0.81}]}

`/score` (and `/v1/score`) pairs its two sides 1:1, 1:N or N:N (`text_1`/`text_2`, or vLLM's other
names for them: `data_1`/`data_2`, `queries` with `documents` or `items`); `/rerank` (and `/v1/rerank`,
`/v2/rerank`, Jina's and Cohere's shapes) ranks the documents by their score against the query, the
best first, `top_n` of them (0 or none: all), each with its text unless `return_documents` is false.
A pair's tokens are the query's and the document's (GPT-2 has no padding token to join them), as vLLM
counts them. Each distinct text is embedded once.
"""

from __future__ import annotations

import time
import uuid

import numpy as np
from pydantic import BaseModel, ConfigDict
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from max_gpt2.inference.embeddings import normalized
from max_gpt2.serving.api.embeddings import checked, embedded
from max_gpt2.serving.api.protocol import Refusal, parse, refusal_response
from max_gpt2.serving.api.served import Served
from max_gpt2.serving.api.vllm_fields import prompt_cut

Texts = str | list[str]
SIDES = (("text_1", "text_2"), ("data_1", "data_2"), ("queries", "documents"), ("queries", "items"))


class Scoring(BaseModel):
    """What both routes read besides their texts: vLLM's fields that apply to an embedding model."""

    model_config = ConfigDict(extra="forbid")

    model: str | None = None
    user: str | None = None
    truncate_prompt_tokens: int | None = None


class ScoreRequest(Scoring):
    """vLLM's score request: one of `SIDES`' pairs of fields."""

    text_1: Texts | None = None
    text_2: Texts | None = None
    data_1: Texts | None = None
    data_2: Texts | None = None
    queries: Texts | None = None
    documents: Texts | None = None
    items: Texts | None = None


class RerankRequest(Scoring):
    """vLLM's (Jina's, Cohere's) rerank request."""

    query: str
    documents: list[str]
    top_n: int = 0
    return_documents: bool = True


async def create_score(request: Request) -> Response:
    served = Served.of(request)
    try:
        body = parse(ScoreRequest, await request.body())
        name = served.model_name(body.model)
        (first, second), (queries, documents) = sides(body)
        scores, tokens = await scored(
            served, name, body, queries, documents, (first, second), request.url.path
        )
    except Refusal as refusal:
        return refusal_response(refusal)
    data = [{"index": index, "object": "score", "score": score} for index, score in enumerate(scores)]
    usage = {
        "prompt_tokens": tokens,
        "total_tokens": tokens,
        "completion_tokens": 0,
        "prompt_tokens_details": None,
    }
    head = {"id": f"score-{uuid.uuid4().hex}", "object": "list", "created": int(time.time()), "model": name}
    return JSONResponse({**head, "data": data, "usage": usage})


async def create_rerank(request: Request) -> Response:
    served = Served.of(request)
    try:
        body = parse(RerankRequest, await request.body())
        name = served.model_name(body.model)
        if body.top_n < 0:
            raise Refusal("top_n", f"top_n: 0 (every document) or more; got {body.top_n}")
        documents = texts(body.documents, "documents")
        scores, tokens = await scored(
            served, name, body, [body.query], documents, ("query", "documents"), request.url.path
        )
    except Refusal as refusal:
        return refusal_response(refusal)
    ranked = sorted(range(len(scores)), key=lambda index: -scores[index])[: body.top_n or None]
    results = [
        {"index": index, **({"document": {"text": documents[index]}} if body.return_documents else {})}
        | {"relevance_score": scores[index]}
        for index in ranked
    ]
    usage = {"prompt_tokens": tokens, "total_tokens": tokens}
    return JSONResponse(
        {"id": f"rerank-{uuid.uuid4().hex}", "model": name, "usage": usage, "results": results}
    )


def sides(body: ScoreRequest) -> tuple[tuple[str, str], tuple[list[str], list[str]]]:
    """The pair of fields `body` gives its texts in, and their texts; one pair exactly, else refused."""
    given = [
        pair for pair in SIDES if getattr(body, pair[0]) is not None and getattr(body, pair[1]) is not None
    ]
    named = [field for pair in SIDES for field in pair if getattr(body, field) is not None]
    if len(given) != 1 or len(set(named)) != 2:
        field = next((field for field in named if not any(field in pair for pair in given)), "text_1")
        raise Refusal(
            field,
            f"{field}: give one pair of sides to score, text_1 and text_2 (or vLLM's data_1 and data_2, "
            f"queries and documents, queries and items); got {', '.join(dict.fromkeys(named)) or 'none'}",
        )
    [(first, second)] = given
    queries, documents = texts(getattr(body, first), first), texts(getattr(body, second), second)
    if len(queries) > 1 and len(queries) != len(documents):
        raise Refusal(
            second,
            f"{second}: {len(documents)} texts against {len(queries)} in {first}; the sides pair 1:1, 1:N "
            "or N:N, as vLLM pairs them",
        )
    return (first, second), (queries, documents)


def texts(given: Texts, field: str) -> list[str]:
    """`given`'s texts (one, or a list of at least one), refused naming `field` where there are none."""
    each = [given] if isinstance(given, str) else list(given)
    if not each:
        raise Refusal(field, f"{field}: the list holds nothing; give at least one text")
    return each


async def scored(
    served: Served,
    name: str,
    body: Scoring,
    queries: list[str],
    documents: list[str],
    fields: tuple[str, str],
    path: str,
) -> tuple[list[float], int]:
    """The cosine of each query's vector and its document's (a single query against each document), and
    the pairs' tokens; each distinct text embedded once, the texts checked as `/v1/embeddings` checks
    them."""
    keep = prompt_cut(body.truncate_prompt_tokens, served.context_length)
    encode = served.tokenizer.delegate.encode
    ids = {
        text: each
        for side, field in zip((queries, documents), fields, strict=True)
        for text, each in zip(
            side, checked(served, [encode(text) for text in side], field, keep), strict=True
        )
    }
    units = normalized(np.stack(await embedded(served, name, list(ids.values()), path)))  # unit length
    vectors = dict(zip(ids, units.astype(np.float64), strict=True))
    pairs = list(zip(queries * len(documents) if len(queries) == 1 else queries, documents, strict=True))
    scores = [float(vectors[query] @ vectors[document]) for query, document in pairs]  # their cosines
    return scores, sum(len(ids[query]) + len(ids[document]) for query, document in pairs)

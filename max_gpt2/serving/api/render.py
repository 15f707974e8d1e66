"""vLLM's render routes, `POST /v1/completions/render` and `POST /v1/chat/completions/render`: what a
request would run, without running it, in the shape of vLLM's `GenerateRequest` (what its routers and
its disaggregated serving read).

Each prompt becomes the token ids it would run (a chat's rendered by the served template, each cut by
`truncate_prompt_tokens` as asked), checked as the route checks it: a field out of range, an id outside
the vocabulary or a prompt past the context is the same 400. Beside them, what the request samples with
in vLLM's `SamplingParams` names, vLLM's defaults where it leaves one unset (`max_tokens`: what it
would make here, the room the context leaves where unset). A completion answers a list, one a prompt;
a chat one object. A beam search is refused, as vLLM's render refuses it.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from typing import Any

from max.pipelines.context.exceptions import InputError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from max_gpt2.serving.api.answer import Body, checked, refused_prompt
from max_gpt2.serving.api.chat_prompt import prompt_ids
from max_gpt2.serving.api.protocol import ChatRequest, CompletionRequest, Refusal, refusal_response
from max_gpt2.serving.api.requests import Asked
from max_gpt2.serving.api.served import Served
from max_gpt2.serving.api.token_fields import prompts
from max_gpt2.serving.api.vllm_fields import as_ids

# vLLM's `SamplingParams` defaults, for what a request leaves unset.
UNSET = {
    "temperature": 1.0,
    "top_p": 1.0,
    "top_k": 0,
    "min_p": 0.0,
    "repetition_penalty": 1.0,
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
}


async def render_completion(request: Request) -> Response:
    return await rendered(request, CompletionRequest, lambda _, body: prompts(body.prompt), "cmpl")


async def render_chat(request: Request) -> Response:
    return await rendered(request, ChatRequest, lambda served, body: [prompt_ids(served, body)], "chatcmpl")


async def rendered(
    request: Request, kind: type[Body], prompts_of: Callable[[Served, Body], Sequence[Any]], prefix: str
) -> Response:
    """`kind`'s body checked and its prompts (`prompts_of`) as vLLM's render answers them; a refusal's
    error body where anything is refused."""
    served = Served.of(request)
    try:
        body, _, asked, given = await checked(request, served, kind, prompts_of)
        if asked.beam_penalty is not None:
            raise Refusal("use_beam_search", "use_beam_search: a beam search is not rendered, as vLLM's")
        made = [generate_request(served, asked, body, ids, prefix) for ids in token_ids(served, given, kind)]
    except Refusal as refusal:
        return refusal_response(refusal)
    return JSONResponse(made if kind is CompletionRequest else made[0])


def token_ids(served: Served, given: Sequence[Any], kind: type) -> list[list[int]]:
    """Each prompt (a text or ids) as ids, checked as the tokenizer checks a prompt it runs."""
    field = "prompt" if kind is CompletionRequest else "messages"
    each = [as_ids(prompt, served) for prompt in given]
    for index, ids in enumerate(each):
        try:
            served.tokenizer.check_ids(ids)
        except InputError as error:
            raise refused_prompt(error, field, index, len(each)) from None
    return each


def generate_request(
    served: Served, asked: Asked, body: CompletionRequest | ChatRequest, ids: list[int], prefix: str
) -> dict[str, Any]:
    """vLLM's `GenerateRequest` of one prompt's `ids`."""
    return {
        "request_id": f"{prefix}-{asked.answer_id or uuid.uuid4().hex}",
        "token_ids": ids,
        "features": None,  # no image or audio: GPT-2 reads text
        "sampling_params": sampling_params(asked, served.context_length - len(ids)),
        "model": body.model,
        "stream": asked.stream,
        "stream_options": body.stream_options.model_dump() if asked.stream and body.stream_options else None,
        "cache_salt": asked.cache_salt,
        "priority": 0,
    }


def sampling_params(asked: Asked, room: int) -> dict[str, Any]:
    """What `asked` samples with, in vLLM's `SamplingParams` names and defaults; `room`: the tokens the
    context leaves after the prompt."""
    sampling, rules = asked.sampling, asked.rules
    given = {name: getattr(sampling, name) for name in UNSET}
    limit = sampling.max_new_tokens
    return {
        "n": asked.n,
        **{name: UNSET[name] if value is None else value for name, value in given.items()},
        "seed": sampling.seed,
        "stop": list(rules.stop),
        "stop_token_ids": sorted(rules.stop_token_ids),
        "ignore_eos": bool(sampling.ignore_eos),
        "max_tokens": room if limit is None else min(limit, room),
        "min_tokens": rules.min_tokens,
        "logprobs": asked.logprobs,
        "prompt_logprobs": asked.prompt_logprobs,
        "skip_special_tokens": rules.skip_special,
        "include_stop_str_in_output": rules.keep,
        "logit_bias": asked.logit_bias or None,
        "allowed_token_ids": None if asked.allowed_ids is None else list(asked.allowed_ids),
        "bad_words": list(asked.bad_words or ()),
    }

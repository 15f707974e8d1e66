"""The fields of llama-server's `POST /completion`, read as llama-server reads them, and turned into the
request `/v1/completions` takes (`as_completion`).

`NativeCompletion` holds every field llama-server's completion schema reads (its
`tools/server/server-schema.cpp`) with its defaults: temperature 0.8, top_k 40, top_p 0.95, min_p 0.05,
`n_predict` -1 (to the context's end), `seed` -1 (a random one). A field llama-server does not read
is ignored, as llama-server ignores it: its clients send payloads written for several backends.
Those it reads are honoured, or refused, naming them, where set to what this server cannot do:

- the samplers and settings this server has not (`max_gpt2.serving.api.llama_samplers`), taken
  while they leave them off, their own parameters then with any value;
- the penalties (`repeat_penalty`, `frequency_penalty`, `presence_penalty`) count the last
  `repeat_last_n` tokens, prompt and text alike, as llama-server's (`llama_fields.llama_penalties`);
- `samplers`: a sampler it leaves out is off, as in llama-server (its field's value unused), and
  llama-server's chain runs in its order where it keeps other tokens than MAX's sampler would
  (`max_gpt2.serving.api.llama_chain`); the penalties always come first;
- `ignore_eos` bans the end-of-text token, as llama-server does (`eos_banned`);
- `n_indent` and `t_max_predict_ms` end a text as there (`llama_chain.text_limits`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

from pydantic import ConfigDict, Field

from max_gpt2.inference.logit_controls import LOWEST
from max_gpt2.serving.api.llama_chain import ChainFields
from max_gpt2.serving.api.llama_fields import refuse_acting
from max_gpt2.serving.api.llama_samplers import INERT, OFF, SAMPLERS, TEXT_LIMITS, LlamaServerFields, left_out
from max_gpt2.serving.api.protocol import CompletionRequest, Refusal
from max_gpt2.serving.api.requests import Asked

PENALTIES = ("repeat_last_n", "repeat_penalty", "presence_penalty", "frequency_penalty")  # shown in results
# Shown too: the settings of the chain's samplers MAX's has not (its limits on a text are not).
HOST_SAMPLERS = tuple(name for name in ChainFields.model_fields if name not in ("samplers", *TEXT_LIMITS))
RENAMED = {"max_tokens": "n_predict", "logprobs": "n_probs", "repetition_penalty": "repeat_penalty"}


class NativeCompletion(ChainFields, LlamaServerFields):
    """`POST /completion`'s body: the fields llama-server reads, with its defaults (its chain's samplers
    MAX's has not: `ChainFields`); others ignored."""

    model_config = ConfigDict(extra="ignore")

    prompt: str | list[int] | list[str | list[int]]
    n_predict: int | None = None  # llama-server's; `max_tokens` and `max_completion_tokens` its aliases
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    temperature: float = 0.8
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    seed: int = -1
    stop: str | list[str] = Field(default_factory=list)
    stream: bool = False
    cache_prompt: bool = True
    return_tokens: bool = False
    n_probs: int | None = None  # `logprobs` its alias
    logprobs: int | None = None
    post_sampling_probs: bool = False
    n_cmpl: int | None = None  # `n` its alias
    n: int | None = None
    logit_bias: dict[str, float | bool] | list[tuple[int | str, float | bool]] | None = None
    ignore_eos: bool = False
    grammar: str | None = None
    json_schema: dict[str, Any] | None = None
    repeat_penalty: float = 1.0
    repeat_last_n: int = 64
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    timings_per_token: bool = False
    response_fields: list[str] = Field(default_factory=list)  # INERT at the OpenAI routes, as there
    echo: bool = False
    model: str | None = None

    @property
    def length(self) -> int:
        """`n_predict`, or the first of its aliases given (-1: to the context's end)."""
        given = [self.n_predict, self.max_tokens, self.max_completion_tokens]
        return next((value for value in given if value is not None), -1)


def defaults() -> dict[str, Any]:
    """The fields `/completion` honours, with their defaults: `/props` shows them, as llama-server shows its
    `default_generation_settings.params`."""
    shown = {"n_predict": -1, "n_probs": 0, "n_cmpl": 1}
    unset = {
        "prompt",
        "model",
        "samplers",
        "echo",
        *OFF,
        *INERT,
        "max_tokens",
        "max_completion_tokens",
        "logprobs",
        "n",
    }
    return shown | NativeCompletion(prompt="").model_dump(exclude=unset, exclude_none=True)


def as_completion(native: NativeCompletion, lora: tuple[float, ...] = ()) -> CompletionRequest:
    """The `/v1/completions` request that asks what `native` asks; a `Refusal` naming the native field
    for what this server cannot honour (`lora`: the scales the served adapters were merged at)."""
    refuse_acting(native, lora)
    if native.echo:
        raise Refusal(
            "echo", "echo: /v1/completions echoes the prompt (with its log-probabilities); not here"
        )
    native = native.model_copy(update=left_out(native.samplers))
    if native.length == 0 or native.length < -1:
        raise Refusal("n_predict", f"n_predict: -1 (to the context's end) or at least 1; got {native.length}")
    probabilities = next((value for value in (native.n_probs, native.logprobs) if value is not None), 0)
    return CompletionRequest(
        prompt=native.prompt,
        model=native.model,
        max_tokens=None if native.length == -1 else native.length,
        temperature=native.temperature,
        top_k=native.top_k,
        top_p=native.top_p,
        min_p=native.min_p,
        seed=native.seed,
        stop=native.stop or None,
        stream=native.stream,
        cache_prompt=native.cache_prompt,
        return_token_ids=native.return_tokens,
        logprobs=probabilities or None,
        post_sampling_probs=native.post_sampling_probs,
        n=native.n_cmpl if native.n_cmpl is not None else native.n,
        logit_bias=native.logit_bias,
        ignore_eos=native.ignore_eos,
        grammar=native.grammar or None,  # an empty one is none, as llama-server reads it
        json_schema=native.json_schema or None,
        repeat_penalty=native.repeat_penalty,
        repeat_last_n=native.repeat_last_n,  # given or not: llama-server's penalties
        frequency_penalty=native.frequency_penalty,
        presence_penalty=native.presence_penalty,
        sse_ping_interval=native.sse_ping_interval,
    )


def generation_settings(
    native: NativeCompletion, body: CompletionRequest, context_length: int
) -> dict[str, Any]:
    """What a result ran with, as llama-server's `generation_settings` shows it (samplers left out: off)."""
    off = left_out(native.samplers)
    return {
        "n_ctx": context_length,
        "n_predict": native.length,
        **{name: getattr(body, name) for name in ("temperature", "top_k", "top_p", "min_p", "ignore_eos")},
        "seed": native.seed,
        "stop": [body.stop] if isinstance(body.stop, str) else list(body.stop or ()),
        "n_probs": body.logprobs or 0,
        **{name: getattr(body, name) for name in PENALTIES},
        **{name: getattr(native, name) for name in HOST_SAMPLERS},
        "stream": native.stream,
        "samplers": [name for name, (_, neutral) in SAMPLERS.items() if not neutral.keys() <= off.keys()],
    }


def eos_banned(asked: Asked, native: NativeCompletion, eos_ids: Iterable[int]) -> Asked:
    """`asked` with the end-of-text ids banned where `ignore_eos` asks, as llama-server bans them (a -inf
    bias: none is generated); vLLM's `ignore_eos`, on the OpenAI routes, only goes on past one."""
    if not native.ignore_eos:
        return asked
    banned = dict.fromkeys(eos_ids, float(LOWEST))  # a plain float, which crosses to the worker
    return dataclasses.replace(asked, logit_bias={**asked.logit_bias, **banned})

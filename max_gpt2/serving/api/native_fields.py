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
  the chain's steps (`max_gpt2.inference.sampler_chain`) run in its order (llama-server's default
  order where not given), on the host where that keeps other tokens than MAX's sampler would, or
  where a step MAX's sampler has not acts (`in_llama_order`); the penalties always come first;
- DRY and the dynamic temperature take their parameters as llama-server does (`dry_step`);
- `mirostat` (1 or 2) is the temperature, then Mirostat alone, as in llama-server (`with_mirostat`);
  adaptive-p, where `samplers` names it, picks each token from what the chain keeps (`adaptive_picker`);
- `ignore_eos` bans the end-of-text token, as llama-server does (`eos_banned`);
- `n_indent` and `t_max_predict_ms` end a text as there (`native.text_limits`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

from max.pipelines.context.sampling_params import SamplingParamsInput
from pydantic import ConfigDict, Field

from max_gpt2.inference.logit_controls import LOWEST
from max_gpt2.inference.sampler_chain import Step
from max_gpt2.inference.token_pickers import Picker
from max_gpt2.serving.api.llama_fields import refuse_acting
from max_gpt2.serving.api.llama_samplers import (
    CHAIN_ONLY,
    INERT,
    OFF,
    SAMPLERS,
    LlamaServerFields,
    chain_order,
    first_acting,
    left_out,
)
from max_gpt2.serving.api.protocol import CompletionRequest, Refusal
from max_gpt2.serving.api.requests import Asked
from max_gpt2.serving.drawn_from import ONLY_DRAWS

PENALTIES = ("repeat_last_n", "repeat_penalty", "presence_penalty", "frequency_penalty")  # shown in results
HOST_SAMPLERS = (  # shown too: the chain's samplers MAX's has not
    "dynatemp_range", "dynatemp_exponent", "dry_multiplier", "dry_base", "dry_allowed_length",
    "dry_penalty_last_n", "dry_sequence_breakers", "top_n_sigma", "typical_p", "xtc_probability",
    "xtc_threshold", "mirostat", "mirostat_tau", "mirostat_eta", "adaptive_target", "adaptive_decay",
    "min_keep",
)  # fmt: skip
DRY_BREAKERS = ["\n", ":", '"', "*"]  # llama-server's
DRY_BASE = 1.75  # llama-server's, which a base below 1 is read as
RENAMED = {"max_tokens": "n_predict", "logprobs": "n_probs", "repetition_penalty": "repeat_penalty"}


class NativeCompletion(LlamaServerFields):
    """`POST /completion`'s body: the fields llama-server reads, with its defaults; others ignored."""

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
    dynatemp_range: float = 0.0  # the chain's samplers MAX's has not (`HOST_SAMPLERS`), off as by default
    dynatemp_exponent: float = 1.0
    dry_multiplier: float = 0.0
    dry_base: float = DRY_BASE
    dry_allowed_length: int = 2
    dry_penalty_last_n: int = 64
    dry_sequence_breakers: list[str] = Field(default_factory=lambda: list(DRY_BREAKERS))
    top_n_sigma: float = -1.0
    typical_p: float = 1.0
    xtc_probability: float = 0.0
    xtc_threshold: float = 0.1
    mirostat: int = 0
    mirostat_tau: float = 5.0
    mirostat_eta: float = 0.1
    adaptive_target: float = -1.0
    adaptive_decay: float = 0.9
    min_keep: int = 0
    n_indent: int = 0  # what ends a text besides its length (`native.text_limits`)
    t_max_predict_ms: int = -1
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


def as_completion(native: NativeCompletion) -> CompletionRequest:
    """The `/v1/completions` request that asks what `native` asks; a `Refusal` naming the native field
    for what this server cannot honour."""
    refuse_acting(native)
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


def in_llama_order(asked: Asked, native: NativeCompletion, context_length: int) -> Asked:
    """`asked` with llama-server's sampler chain (`max_gpt2.inference.sampler_chain`, in `native`'s
    `samplers` order) run on the host where it keeps other tokens than MAX's sampler, which applies the
    temperature first and has none of the steps of `CHAIN_ONLY`: with one of those, or with a cut and a
    temperature other than 0 and 1; or where what each token is drawn from is reported
    (`post_sampling_probs`). MAX then draws at temperature 1."""
    native = native.model_copy(update=left_out(native.samplers))
    dry, picker = dry_step(native, context_length), adaptive_picker(native)
    if native.min_keep < 0:
        raise Refusal("min_keep", f"min_keep: 0 or more; got {native.min_keep}")
    if native.mirostat:
        return with_mirostat(asked, native)
    sampled = {name: getattr(asked.sampling, name) for name in ("top_k", "top_p", "min_p", "temperature")}
    top_k, top_p, min_p, temperature = sampled.values()
    cuts = (top_k or 0) > 0 or (top_p is not None and top_p < 1) or (min_p or 0) > 0
    mixed = cuts and temperature not in (None, 0, 1)  # the orders keep other tokens
    if not (mixed or first_acting(native, CHAIN_ONLY) or asked.post_sampling):
        return asked
    least = (float(native.min_keep),) if native.min_keep > 1 else ()  # what the cuts keep at least
    steps: dict[str, Step] = {
        name: (name, float(value), *(least if name in ("top_p", "min_p") else ()))
        for name, value in sampled.items()
        if value is not None
    }
    if native.dynatemp_range > 0 and "temperature" in steps:
        steps["temperature"] += (native.dynatemp_range, native.dynatemp_exponent)
    if dry:
        steps["dry"] = dry
    steps |= {
        "top_n_sigma": ("top_n_sigma", native.top_n_sigma),
        "typ_p": ("typ_p", native.typical_p, *least),
        "xtc": ("xtc", native.xtc_probability, native.xtc_threshold, *least),
    }
    chain = tuple(steps[name] for name in chain_order(native.samplers) if name in steps)
    sampling = SamplingParamsInput(**{**vars(asked.sampling), **ONLY_DRAWS})
    breakers = tuple(native.dry_sequence_breakers) if dry else None
    return dataclasses.replace(asked, sampling=sampling, chain=chain, dry_breakers=breakers, picker=picker)


def adaptive_picker(native: NativeCompletion) -> Picker | None:
    """Adaptive-p's picker (`max_gpt2.inference.token_pickers`) where it acts (a target of 0 or more, and
    `samplers` naming it: `left_out`), None where not; a decay outside 0 to 0.99 refused, as there."""
    if not 0 <= native.adaptive_decay <= 0.99:
        raise Refusal("adaptive_decay", f"adaptive_decay: 0 to 0.99; got {native.adaptive_decay}")
    return (
        None if native.adaptive_target < 0 else ("adaptive_p", native.adaptive_target, native.adaptive_decay)
    )


def dry_step(native: NativeCompletion, context_length: int) -> Step | None:
    """DRY's step of the chain (multiplier, base, allowed length, window), None where it is off; a
    `Refusal` for a parameter llama-server refuses too. A base below 1 is llama-server's 1.75, a window
    of -1 the whole context (as llama-server had it)."""
    if native.dry_allowed_length < 0:
        raise Refusal("dry_allowed_length", f"dry_allowed_length: 0 or more; got {native.dry_allowed_length}")
    if native.dry_penalty_last_n < -1:
        last_n = native.dry_penalty_last_n
        raise Refusal(
            "dry_penalty_last_n", f"dry_penalty_last_n: -1 (the context), 0 (off) or more; got {last_n}"
        )
    if not native.dry_sequence_breakers:
        raise Refusal(
            "dry_sequence_breakers", "dry_sequence_breakers: a non-empty list of strings, as llama-server"
        )
    if native.dry_multiplier == 0:
        return None
    base = native.dry_base if native.dry_base >= 1 else DRY_BASE
    last_n = context_length if native.dry_penalty_last_n == -1 else native.dry_penalty_last_n
    return ("dry", native.dry_multiplier, base, native.dry_allowed_length, last_n)


def with_mirostat(asked: Asked, native: NativeCompletion) -> Asked:
    """`asked` picking each token by Mirostat (`mirostat` 1, the first, or 2, Mirostat 2.0) after the
    temperature, llama.cpp's whole chain then (its other samplers and its penalties left out, as there)."""
    if native.mirostat not in (1, 2):
        raise Refusal("mirostat", f"mirostat: 0 (off), 1 or 2 (Mirostat 2.0); got {native.mirostat}")
    no_penalties = {"repetition_penalty": 1.0, "frequency_penalty": 0.0, "presence_penalty": 0.0}
    sampling = SamplingParamsInput(**{**vars(asked.sampling), **ONLY_DRAWS, **no_penalties})
    chain = (("temperature", float(native.temperature)),)
    picker = ("mirostat", native.mirostat, native.mirostat_tau, native.mirostat_eta)
    return dataclasses.replace(asked, sampling=sampling, chain=chain, picker=picker, penalty_last_n=None)


def eos_banned(asked: Asked, native: NativeCompletion, eos_ids: Iterable[int]) -> Asked:
    """`asked` with the end-of-text ids banned where `ignore_eos` asks, as llama-server bans them (a -inf
    bias: none is generated); vLLM's `ignore_eos`, on the OpenAI routes, only goes on past one."""
    if not native.ignore_eos:
        return asked
    banned = dict.fromkeys(eos_ids, float(LOWEST))  # a plain float, which crosses to the worker
    return dataclasses.replace(asked, logit_bias={**asked.logit_bias, **banned})

"""llama-server's sampler chain for a request, on every route: llama-server reads its samplers' fields on
its OpenAI routes as on `/completion` and runs its chain for all, and its clients (its own web page among
them) send them there.

`ChainFields` holds those fields with llama-server's defaults (`/completion`'s body extends it). Where
one of the samplers only llama.cpp's chain has acts (`CHAIN_ONLY`: DRY, top-n-sigma, typical-p, XTC, a
dynamic temperature, Mirostat, adaptive-p, `min_keep`), or a cut and a temperature other than 0 and 1
(the two orders then keep other tokens), or what each token is drawn from is reported
(`post_sampling_probs`), the chain runs on the host in llama-server's order (`in_llama_order`: the
steps of `max_gpt2.inference.sampler_chain`, in `samplers`' order) and MAX's sampler only draws. DRY and
the dynamic temperature take their parameters as llama-server does (`dry_step`); `mirostat` (1 or 2) is
the temperature, then Mirostat alone (`with_mirostat`); adaptive-p, where `samplers` names it, picks
each token from what the chain keeps (`adaptive_picker`). `n_indent` and `t_max_predict_ms` end a text
as there (`text_limits`). On the OpenAI routes a request that sets none of these keeps MAX's order,
the temperature first, as vLLM's (`on_openai_route`).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from max.pipelines.context.sampling_params import SamplingParamsInput
from pydantic import BaseModel, ConfigDict, Field

from max_gpt2.inference.sampler_chain import Step
from max_gpt2.inference.token_pickers import Picker
from max_gpt2.serving.api.llama_samplers import CHAIN_ONLY, TEXT_LIMITS, chain_order, first_acting, left_out
from max_gpt2.serving.api.protocol import Refusal
from max_gpt2.serving.drawn_from import ONLY_DRAWS

if TYPE_CHECKING:  # the checked request, whose module runs this one
    from max_gpt2.serving.api.requests import Asked

DRY_BREAKERS = ["\n", ":", '"', "*"]  # llama-server's
DRY_BASE = 1.75  # llama-server's, which a base below 1 is read as


class ChainFields(BaseModel):
    """llama-server's fields for its chain's samplers MAX's sampler has not, and for how a text ends,
    with its defaults (each off); other fields ignored."""

    model_config = ConfigDict(extra="ignore")

    samplers: list[str] | str | None = None
    dynatemp_range: float = 0.0
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
    n_indent: int = 0
    t_max_predict_ms: int = -1

    @classmethod
    def of(cls, body: Any) -> ChainFields:
        """`body`'s own values of these fields (an OpenAI route's request), llama-server's defaults where
        it leaves them unset."""
        return cls(**{name: value for name in cls.model_fields if (value := getattr(body, name)) is not None})


def on_openai_route(asked: Asked, body: Any, context_length: int) -> Asked:
    """`asked` (an OpenAI route's) ending its text as llama-server's `TEXT_LIMITS` ask where `body` sets
    one, and run through llama-server's chain where it sets a sampler only that chain has (`CHAIN_ONLY`),
    as llama-server runs them there; as it was otherwise."""
    fields = ChainFields.of(body)
    if any(getattr(body, name) is not None for name in TEXT_LIMITS):
        asked = text_limits(asked, fields)
    return in_llama_order(asked, fields, context_length) if first_acting(body, CHAIN_ONLY) else asked


def text_limits(asked: Asked, fields: ChainFields) -> Asked:
    """`asked` ending its text as llama-server's `n_indent` (a line past the first indented less) and
    `t_max_predict_ms` (a newline past that long from the first token) end it (`choices.Rules`)."""
    if fields.n_indent < 0:
        raise Refusal("n_indent", f"n_indent: 0 or more; got {fields.n_indent}")
    if fields.t_max_predict_ms < -1:
        raise Refusal(
            "t_max_predict_ms", f"t_max_predict_ms: -1 (none) or more; got {fields.t_max_predict_ms}"
        )
    limit = fields.t_max_predict_ms / 1000 if fields.t_max_predict_ms > 0 else None
    rules = dataclasses.replace(asked.rules, indent=fields.n_indent, predict_s=limit)
    return dataclasses.replace(asked, rules=rules)


def in_llama_order(asked: Asked, fields: ChainFields, context_length: int) -> Asked:
    """`asked` with llama-server's sampler chain (`max_gpt2.inference.sampler_chain`, in `fields`'
    `samplers` order) run on the host where it keeps other tokens than MAX's sampler, which applies the
    temperature first and has none of the steps of `CHAIN_ONLY`: with one of those, or with a cut and a
    temperature other than 0 and 1; or where what each token is drawn from is reported
    (`post_sampling_probs`). MAX then draws at temperature 1."""
    fields = fields.model_copy(update=left_out(fields.samplers))
    dry, picker = dry_step(fields, context_length), adaptive_picker(fields)
    if fields.min_keep < 0:
        raise Refusal("min_keep", f"min_keep: 0 or more; got {fields.min_keep}")
    if fields.mirostat:
        return with_mirostat(asked, fields)
    sampled = {name: getattr(asked.sampling, name) for name in ("top_k", "top_p", "min_p", "temperature")}
    top_k, top_p, min_p, temperature = sampled.values()
    cuts = (top_k or 0) > 0 or (top_p is not None and top_p < 1) or (min_p or 0) > 0
    mixed = cuts and temperature not in (None, 0, 1)  # the orders keep other tokens
    if not (mixed or first_acting(fields, CHAIN_ONLY) or asked.post_sampling):
        return asked
    least = (float(fields.min_keep),) if fields.min_keep > 1 else ()  # what the cuts keep at least
    steps: dict[str, Step] = {
        name: (name, float(value), *(least if name in ("top_p", "min_p") else ()))
        for name, value in sampled.items()
        if value is not None
    }
    if fields.dynatemp_range > 0 and "temperature" in steps:
        steps["temperature"] += (fields.dynatemp_range, fields.dynatemp_exponent)
    if dry:
        steps["dry"] = dry
    steps |= {
        "top_n_sigma": ("top_n_sigma", fields.top_n_sigma),
        "typ_p": ("typ_p", fields.typical_p, *least),
        "xtc": ("xtc", fields.xtc_probability, fields.xtc_threshold, *least),
    }
    chain = tuple(steps[name] for name in chain_order(fields.samplers) if name in steps)
    sampling = SamplingParamsInput(**{**vars(asked.sampling), **ONLY_DRAWS})
    breakers = tuple(fields.dry_sequence_breakers) if dry else None
    return dataclasses.replace(asked, sampling=sampling, chain=chain, dry_breakers=breakers, picker=picker)


def adaptive_picker(fields: ChainFields) -> Picker | None:
    """Adaptive-p's picker (`max_gpt2.inference.token_pickers`) where it acts (a target of 0 or more, and
    `samplers` naming it: `left_out`), None where not; a decay outside 0 to 0.99 refused, as there."""
    if not 0 <= fields.adaptive_decay <= 0.99:
        raise Refusal("adaptive_decay", f"adaptive_decay: 0 to 0.99; got {fields.adaptive_decay}")
    return (
        None if fields.adaptive_target < 0 else ("adaptive_p", fields.adaptive_target, fields.adaptive_decay)
    )


def dry_step(fields: ChainFields, context_length: int) -> Step | None:
    """DRY's step of the chain (multiplier, base, allowed length, window), None where it is off; a
    `Refusal` for a parameter llama-server refuses too. A base below 1 is llama-server's 1.75, a window
    of -1 the whole context (as llama-server had it)."""
    if fields.dry_allowed_length < 0:
        raise Refusal("dry_allowed_length", f"dry_allowed_length: 0 or more; got {fields.dry_allowed_length}")
    if fields.dry_penalty_last_n < -1:
        last_n = fields.dry_penalty_last_n
        raise Refusal(
            "dry_penalty_last_n", f"dry_penalty_last_n: -1 (the context), 0 (off) or more; got {last_n}"
        )
    if not fields.dry_sequence_breakers:
        raise Refusal(
            "dry_sequence_breakers", "dry_sequence_breakers: a non-empty list of strings, as llama-server"
        )
    if fields.dry_multiplier == 0:
        return None
    base = fields.dry_base if fields.dry_base >= 1 else DRY_BASE
    last_n = context_length if fields.dry_penalty_last_n == -1 else fields.dry_penalty_last_n
    return ("dry", fields.dry_multiplier, base, fields.dry_allowed_length, last_n)


def with_mirostat(asked: Asked, fields: ChainFields) -> Asked:
    """`asked` picking each token by Mirostat (`mirostat` 1, the first, or 2, Mirostat 2.0) after the
    temperature, llama.cpp's whole chain then (its other samplers and its penalties left out, as there)."""
    if fields.mirostat not in (1, 2):
        raise Refusal("mirostat", f"mirostat: 0 (off), 1 or 2 (Mirostat 2.0); got {fields.mirostat}")
    no_penalties = {"repetition_penalty": 1.0, "frequency_penalty": 0.0, "presence_penalty": 0.0}
    sampling = SamplingParamsInput(**{**vars(asked.sampling), **ONLY_DRAWS, **no_penalties})
    temperature = asked.sampling.temperature
    chain = (("temperature", 1.0 if temperature is None else float(temperature)),)
    picker = ("mirostat", fields.mirostat, fields.mirostat_tau, fields.mirostat_eta)
    return dataclasses.replace(asked, sampling=sampling, chain=chain, picker=picker, penalty_last_n=None)

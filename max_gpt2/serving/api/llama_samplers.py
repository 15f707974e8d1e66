"""llama-server's sampler and setting fields, which its clients send on every route: which this server
has, which it has not, and what leaves each off.

- `OFF`: what llama-server reads and this server has not (lazy grammars, ...): taken while set to
  what leaves it off, refused by the routes, naming the field, otherwise (`first_acting`). `lora` is
  declared beside them and checked against the adapters merged at start (`llama_fields.check_lora`).
- `CHAIN_ONLY`: DRY, typical-p, top-n-sigma, XTC, the dynamic temperature, Mirostat, adaptive-p and the
  cuts' `min_keep`, which only llama-server's chain has: where one acts, that chain runs on the host, on
  every route (`max_gpt2.serving.api.llama_chain`); `TEXT_LIMITS`: what ends a text by its lines'
  indentation or a time.
- `INERT`: what changes nothing here, with any value: a slot (one prefix cache serves every request),
  the reasoning settings (GPT-2 does not reason), what shapes only llama-server's logs, progress events
  and timings, and `response_fields` (which shapes `/completion`'s answer alone).
- `SAMPLERS`: the samplers this server has, by llama-server's name and letter; `samplers` leaving
  one out turns it off (`left_out`), as in llama-server, and its order is the chain's (`chain_order`);
  its names are read as llama.cpp reads them, in any case, `-` for `_` or neither, and its aliases
  (`named`). Adaptive-p runs only where `samplers` names it, as there.

`post_sampling_probs` is honoured on every route: the log-probabilities asked for are of what each token
is drawn from (`max_gpt2.serving.drawn_from`), in llama-server's shape (`TokenNames.llama_entries`).

`LlamaServerFields` declares them all, for the routes' request models.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, create_model

from max_gpt2.inference.sampler_chain import STEPS

# Each field, whether a value leaves it off, and what leaves it off.
OFF: dict[str, tuple[Callable[[Any], bool], str]] = {
    "grammar_lazy": (lambda value: not value, "false"),
    "grammar_triggers": (lambda value: not value, "[]"),
    "preserved_tokens": (lambda value: not value, "[]"),
    "reasoning_budget_tokens": (lambda value: value < 0, "-1 (GPT-2 does not reason)"),
}
INERT = (
    "n_keep", "n_discard",
    "id_slot", "n_cache_reuse", "backend_sampling", "verbose", "t_max_prompt_ms", "return_progress",
    "timings_per_token", "reasoning_format", "reasoning_control", "reasoning_budget_message",
    "reasoning_budget_start_tag", "reasoning_budget_end_tags", "chat_format", "chat_parser",
    "generation_prompt", "parse_tool_calls", "response_fields",
)  # fmt: skip
# The samplers only llama-server's chain has (it then runs on the host): each field, and what leaves it off.
CHAIN_ONLY: dict[str, tuple[Callable[[Any], bool], str]] = {
    "dry_multiplier": (lambda value: value == 0, "0"),  # below 0 it acts too: it rewards repeats
    "top_n_sigma": (lambda value: value <= 0, "-1"),
    "typical_p": (lambda value: value >= 1, "1"),
    "xtc_probability": (lambda value: value <= 0, "0"),  # with `xtc_threshold` (0.1 unset)
    "dynatemp_range": (lambda value: value <= 0, "0"),  # with `dynatemp_exponent`
    "mirostat": (lambda value: value == 0, "0"),  # not a step: the chain's in its place
    "adaptive_target": (lambda value: value < 0, "-1"),  # where `samplers` names it: it picks the token
    "min_keep": (lambda value: value <= 1, "0"),  # what top-p, min-p, typical-p and XTC leave at least
}
# llama-server's limits on a text: how its lines must be indented, and when it ends after a time.
TEXT_LIMITS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "n_indent": (lambda value: value <= 0, "0"),
    "t_max_predict_ms": (lambda value: value <= 0, "-1"),
}
# Each sampler's letter in a `samplers` string, and the values of the fields that leave it off, in
# llama-server's default order.
SAMPLERS: dict[str, tuple[str, dict[str, Any]]] = {
    "penalties": ("e", {"repeat_penalty": 1.0, "frequency_penalty": 0.0, "presence_penalty": 0.0}),
    "dry": ("d", {"dry_multiplier": 0.0}),
    "top_n_sigma": ("s", {"top_n_sigma": -1.0}),
    "top_k": ("k", {"top_k": 0}),
    "typ_p": ("y", {"typical_p": 1.0}),
    "top_p": ("p", {"top_p": 1.0}),
    "min_p": ("m", {"min_p": 0.0}),
    "xtc": ("x", {"xtc_probability": 0.0}),
    "temperature": ("t", {"temperature": 1.0, "dynatemp_range": 0.0}),
    "adaptive_p": ("a", {"adaptive_target": -1.0}),  # not in llama-server's default chain
}
DEFAULT_CHAIN = tuple(name for name in SAMPLERS if name != "adaptive_p")
ALIASES = {"nucleus": "top_p", "temp": "temperature", "typ": "typ_p"}  # llama.cpp's, beside each name's

LlamaServerFields: Any = create_model(
    "LlamaServerFields",
    __base__=BaseModel,
    samplers=(list[str] | str | None, None),
    post_sampling_probs=(bool | None, None),
    sse_ping_interval=(float | None, None),
    repeat_penalty=(float | None, None),
    repeat_last_n=(int | None, None),
    top_n_sigma=(float | None, None),
    typical_p=(float | None, None),
    xtc_probability=(float | None, None),
    xtc_threshold=(float | None, None),
    mirostat=(int | None, None),
    mirostat_tau=(float | None, None),
    mirostat_eta=(float | None, None),
    dry_multiplier=(float | None, None),
    dry_base=(float | None, None),
    dry_allowed_length=(int | None, None),
    dry_penalty_last_n=(int | None, None),
    dry_sequence_breakers=(list[str] | None, None),
    dynatemp_range=(float | None, None),
    dynatemp_exponent=(float | None, None),
    adaptive_target=(float | None, None),
    adaptive_decay=(float | None, None),
    min_keep=(int | None, None),
    n_indent=(int | None, None),
    t_max_predict_ms=(int | None, None),
    lora=(Any, None),
    **dict.fromkeys((*OFF, *INERT), (Any, None)),
)


def first_acting(
    body: Any, table: dict[str, tuple[Callable[[Any], bool], str]] = OFF
) -> tuple[str, str] | None:
    """The first of `table`'s fields (`OFF`'s, `CHAIN_ONLY`'s, `TEXT_LIMITS`') `body` sets to act, and what
    would leave it off; None if none does."""
    for field, (off, value) in table.items():
        given = getattr(body, field)
        try:
            acts = given is not None and not off(given)
        except TypeError:  # not a number
            acts = True
        if acts:
            return field, value
    return None


def named(samplers: list[str] | str | None) -> tuple[str, ...]:
    """The samplers `samplers` gives, by `SAMPLERS`' names, in its order: names (in any case, with `-`
    or nothing for `_`, or llama.cpp's aliases) or a string of letters, those llama.cpp does not know
    left out as it leaves them; llama-server's default chain where it is not given."""
    if samplers is None:
        return DEFAULT_CHAIN
    if isinstance(samplers, str):
        letters = {letter: name for name, (letter, _) in SAMPLERS.items()}
        return tuple(letters[letter] for letter in samplers if letter in letters)
    spelled = {
        form: name for name in SAMPLERS for form in (name, name.replace("_", "-"), name.replace("_", ""))
    }
    known = spelled | ALIASES
    return tuple(known[name.lower()] for name in samplers if name.lower() in known)


def left_out(samplers: list[str] | str | None) -> dict[str, Any]:
    """The fields that leave off each sampler `samplers` (`named`) leaves out, as llama-server leaves them
    off: adaptive-p alone where it is not given."""
    given = named(samplers)
    return {
        field: value
        for name, (_, off) in SAMPLERS.items()
        if name not in given
        for field, value in off.items()
    }


def chain_order(samplers: list[str] | str | None) -> tuple[str, ...]:
    """The chain's steps (`sampler_chain.STEPS`) in the order `samplers` (`named`) gives them."""
    return tuple(dict.fromkeys(name for name in named(samplers) if name in STEPS))

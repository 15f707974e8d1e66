"""What a `/v1/completions` request may ask of this server, checked before MAX sees it.

MAX's OpenAI route accepts every field of OpenAI's completion request and of its
own extensions, but it drops some without a word (`n`, `best_of`, `logit_bias`,
`suffix`), answers out-of-range values with "Value error." naming no field, and
lets a few bodies through that fail later (an empty prompt list is a 500, several
prompts streamed are a 500). `check_completion` decides each field before the
route runs: honoured as MAX does, honoured by rewriting the body (`n` copies each
prompt, `seed: 0` becomes a fixed seed), or refused with a `Refusal` that names the
field and what it may be. Token ids are checked against the vocabulary by the
tokenizer (`max_gpt2.serving.tokenizer`), which sees every prompt as ids.

Everything here is a pure function of the JSON body; `max_gpt2.serving.guard`
applies it to HTTP requests. docs/serving.md lists every field and what happens to it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

MAX_N = 16  # most choices one request may ask for: as many as a CPU step decodes together
FIXED_SEED_ZERO = 0x5EED  # what `seed: 0` runs with: MAX takes 0 as "no seed" and picks a random one
MAX_LOGPROBS = 7  # MAX's log-probability op returns at most 7 alternatives
SEED_RANGE = (-(2**63), 2**64 - 1)  # MAX keys its sampler with the seed as 64 bits

# Fields that change nothing for GPT-2 on this server, accepted as OpenAI and MAX accept them.
NO_EFFECT = {
    "user": "an end-user id OpenAI keeps for abuse monitoring; nothing here reads it",
    "reasoning_split": "GPT-2 writes no reasoning to split off",
    "cache_salt": "isolates prefix-cache entries, and prefix caching is off (echo needs every prompt token)",
}
# Fields refused unless left unset (null, or the empty value given): why, per field.
REFUSED = {
    "logit_bias": "this server does not apply logit biases",
    "suffix": "GPT-2 writes left to right and cannot insert text before a suffix",
    "thinking_temperature": "GPT-2 has no reasoning block to give a temperature of its own",
    "reasoning": "GPT-2 has no reasoning to configure",
    "target_endpoint": "disaggregated serving is not used here",
    "dkv_cache_hint": "disaggregated serving is not used here",
}
# Numeric fields and their closed ranges (MAX's own, which it reports without the field's name).
RANGES: dict[str, tuple[float, float]] = {
    "temperature": (0.0, 2.0),
    "top_p": (0.0, 1.0),
    "min_p": (0.0, 1.0),
    "frequency_penalty": (-2.0, 2.0),
    "presence_penalty": (-2.0, 2.0),
}


class Refusal(Exception):
    """A request this server will not run: the HTTP status, the field (OpenAI's `param`) and why."""

    def __init__(self, param: str | None, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.param, self.message, self.status = param, message, status


@dataclass(frozen=True)
class Checked:
    """A request as it goes on to MAX: its body, and how many choices each prompt became (`n`)."""

    body: dict[str, Any]
    copies: int = 1


def check_completion(body: dict[str, Any]) -> Checked:
    """`body` of a `/v1/completions` request, checked field by field; a `Refusal` for the first field
    this server cannot honour. Values of the wrong JSON type are left to MAX's schema, which names them."""
    for field, why in REFUSED.items():
        if _set(body.get(field)):
            raise Refusal(field, f"{field}: {why}; leave it out")
    _check_ranges(body)
    prompts = _check_prompt(body.get("prompt"))
    copies = _check_choices(body)
    if len(prompts) * copies > 1 and body.get("stream"):
        raise Refusal(
            "stream",
            f"stream: a streamed request answers one prompt with n = 1; this one asks for "
            f"{len(prompts)} prompt(s) x n = {copies}",
        )
    body = {key: value for key, value in body.items() if key not in ("n", "best_of")}
    if copies > 1:
        body["prompt"] = [prompt for prompt in prompts for _ in range(copies)]  # OpenAI's order of choices
    if body.get("seed") == 0 and not isinstance(body["seed"], bool):
        body["seed"] = FIXED_SEED_ZERO
    return Checked(body, copies)


def _set(value: Any) -> bool:
    """Whether a client gave a value (not null, not an empty string, list or object)."""
    return value is not None and value != "" and value != [] and value != {}


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _integer(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_ranges(body: dict[str, Any]) -> None:
    """The numeric fields within their ranges, each refusal naming the field and the range."""
    for field, (low, high) in RANGES.items():
        value = body.get(field)
        if _number(value) and not (math.isfinite(value) and low <= value <= high):
            raise Refusal(field, f"{field}: must be between {low:g} and {high:g}; got {value}")
    penalty = body.get("repetition_penalty")
    if _number(penalty) and not (math.isfinite(penalty) and penalty > 0):
        raise Refusal("repetition_penalty", f"repetition_penalty: must be above 0 (1 is none); got {penalty}")
    max_tokens, min_tokens = body.get("max_tokens"), body.get("min_tokens")
    if _integer(max_tokens) and max_tokens < 1:
        raise Refusal(
            "max_tokens", f"max_tokens: must be at least 1 (every completion gets a token); got {max_tokens}"
        )
    if _integer(min_tokens) and min_tokens < 0:
        raise Refusal("min_tokens", f"min_tokens: must be 0 or more; got {min_tokens}")
    if _integer(max_tokens) and _integer(min_tokens) and min_tokens > max_tokens:
        raise Refusal("min_tokens", f"min_tokens: {min_tokens} is more than max_tokens ({max_tokens})")
    top_k = body.get("top_k")
    if _integer(top_k) and top_k < -1:
        raise Refusal("top_k", f"top_k: must be -1 or 0 (no limit) or a positive count; got {top_k}")
    logprobs = body.get("logprobs")
    if _integer(logprobs) and not 1 <= logprobs <= MAX_LOGPROBS:
        raise Refusal(
            "logprobs",
            f"logprobs: must be 1 to {MAX_LOGPROBS} alternatives, or null for none (MAX reads 0 as "
            f"none); got {logprobs}",
        )
    seed = body.get("seed")
    if _integer(seed) and not SEED_RANGE[0] <= seed <= SEED_RANGE[1]:
        raise Refusal("seed", f"seed: must fit in 64 bits ({SEED_RANGE[0]} to {SEED_RANGE[1]}); got {seed}")


def _check_prompt(prompt: Any) -> list[Any]:
    """The request's prompts (a string or an id list each), empty ones refused. Other shapes are left to
    MAX's schema; lengths and ids to the tokenizer, which sees every prompt as ids."""
    if isinstance(prompt, str) or (isinstance(prompt, list) and prompt and all(map(_integer, prompt))):
        prompts = [prompt]
    elif isinstance(prompt, list):
        prompts = prompt
    else:
        return [prompt]
    if not prompts:
        raise Refusal(
            "prompt", "prompt: the list holds no prompt; give a string, token ids, or a list of them"
        )
    for index, one in enumerate(prompts):
        where = "prompt" if len(prompts) == 1 else f"prompt[{index}]"
        if one in ("", []):
            raise Refusal("prompt", f"{where}: empty; GPT-2 needs at least one token to continue")
    return prompts


def _check_choices(body: dict[str, Any]) -> int:
    """How many choices each prompt gets (`n`), with `best_of` only where it selects nothing."""
    n, best_of, seed = body.get("n"), body.get("best_of"), body.get("seed")
    if n is None:
        n = 1
    elif _integer(n) and not 1 <= n <= MAX_N:
        raise Refusal("n", f"n: must be 1 to {MAX_N} choices a prompt; got {n}")
    elif not _integer(n):
        raise Refusal("n", f"n: must be an integer; got {n!r}")
    if best_of is not None and best_of != n:
        raise Refusal(
            "best_of",
            f"best_of: this server does not rank candidates; leave it out or make it equal to n ({n})",
        )
    greedy = body.get("temperature") == 0 or body.get("top_k") == 1
    if n > 1 and not greedy and _integer(seed):
        raise Refusal(
            "n",
            f"n: with a fixed seed every one of the {n} choices would be the same sample; leave seed "
            f"out, or send {n} requests with different seeds",
        )
    return n

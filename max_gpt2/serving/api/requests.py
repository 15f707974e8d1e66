"""What a completion or chat request asks of each of its choices, checked field by field.

`check` takes a parsed request (`max_gpt2.serving.api.protocol`) and returns an `Asked`:
the sampling values, the stop rules, the log-probabilities and how many choices, each in
its range, or a `Refusal` for the first field this server cannot honour, naming it and
what it may be. `Asked.request` then makes MAX's request for one choice. A prompt's ids are the
tokenizer's to check (`max_gpt2.serving.tokenizer`); docs/serving.md lists every field.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from max.pipelines.context.sampling_params import (
    SamplingParams,
    SamplingParamsGenerationConfigDefaults,
    SamplingParamsInput,
)
from max.pipelines.modeling.types import RequestID, TextGenerationRequest

from max_gpt2.inference.constraints import Constraint
from max_gpt2.inference.sampler_chain import Step
from max_gpt2.inference.token_pickers import Picker
from max_gpt2.serving.api.beams import searched
from max_gpt2.serving.api.chat_prompt import echoed, reads_kept_pages
from max_gpt2.serving.api.choices import Rules
from max_gpt2.serving.api.constraint_fields import constraint_of
from max_gpt2.serving.api.llama_chain import on_openai_route
from max_gpt2.serving.api.llama_fields import llama_penalties, post_sampling, refuse_acting
from max_gpt2.serving.api.llama_samplers import left_out
from max_gpt2.serving.api.protocol import (
    HARMLESS,
    REFUSED,
    ChatRequest,
    CompletionRequest,
    Refusal,
    Sampling,
    unset,
)
from max_gpt2.serving.api.repetition import repetition_of
from max_gpt2.serving.api.token_fields import logit_bias, token_id
from max_gpt2.serving.api.tools import ToolCalls, tool_calls_of
from max_gpt2.serving.api.vllm_fields import MAX_LOGPROBS, vllm_asks
from max_gpt2.serving.context import GPT2Request
from max_gpt2.serving.drawn_from import in_max_order

MAX_N = 16  # most choices one request may ask for: as many as a CPU step decodes together
FIXED_SEED_ZERO = 0x5EED  # what `seed: 0` runs with: MAX takes 0 as "no seed" and picks a random one
RANDOM_SEED = -1  # llama-server's "a random seed", which its clients send by default
SEED_RANGE = (-(2**63), 2**64 - 1)  # MAX keys its sampler with the seed as 64 bits
RANGES: dict[str, tuple[float, float]] = {  # numeric fields and their closed ranges
    "temperature": (0.0, 2.0),
    "top_p": (0.0, 1.0),
    "min_p": (0.0, 1.0),
    "frequency_penalty": (-2.0, 2.0),
    "presence_penalty": (-2.0, 2.0),
}


@dataclass(frozen=True)
class Asked:
    """One request's choices, checked: `n` a prompt, what each samples with, how each ends (`rules`),
    the alternatives a token it reports (`logprobs`, None: no log-probabilities), `echo`,
    `logit_bias` by id, what its text must be (`constraint`, None: free), and which cached prompt pages
    it may read (`cache_salt`, `cache_prompt`)."""

    n: int
    sampling: SamplingParamsInput
    rules: Rules
    logprobs: int | None
    echo: bool
    echo_only: bool  # `echo` with `max_tokens: 0`: the prompt alone, one token made and not shown
    logit_bias: dict[int, float]
    stream: bool
    include_usage: bool
    usage_every_chunk: bool  # vLLM's `continuous_usage_stats`
    return_token_ids: bool
    constraint: Constraint | None = None
    constraint_field: str | None = None  # the request field it came from
    tools: ToolCalls | None = None  # how a chat calls its tools, where it does
    cache_salt: str | None = None  # vLLM's: only requests with the same salt share cached pages
    cache_prompt: bool = True  # llama-server's: false, the prompt reads no cached page
    ping_s: float | None = None  # llama-server's `sse_ping_interval`: seconds between pings of a stream
    chain: tuple[Step, ...] | None = None  # llama-server's sampler chain, run on the host
    penalty_last_n: int | None = None  # llama-server's: the penalties count the context's last n tokens
    picker: Picker | None = None  # llama-server's Mirostat or adaptive-p, picking each token on the host
    prompt_cut: slice | None = None  # vLLM's `truncate_prompt_tokens`, with the three below (`vllm_fields`)
    allowed_ids: tuple[int, ...] | None = None
    ids_as_names: bool = False
    answer_id: str | None = None
    dry_breakers: tuple[str, ...] | None = None  # llama-server's DRY, where its chain has it: the breakers
    post_sampling: bool = False  # llama-server's `post_sampling_probs`: of what each token is drawn from
    bad_words: tuple[str, ...] | None = None  # vLLM's: words the text may not come to hold
    prompt_logprobs: int | None = None  # vLLM's: alternatives each prompt token reports (None: no report)
    logprob_ids: tuple[int, ...] | None = None  # vLLM's `logprob_token_ids`: what each new token reports
    stream_interval: int = 1  # vLLM's: tokens a streamed event brings at most (the first and last alone)
    beam_penalty: float | None = None  # vLLM's beam search: its length penalty (None: no beam search)
    echo_text: str | None = None  # vLLM's chat `echo`: the text put before each choice's
    prompt_text: bool = False  # vLLM's chat `return_prompt_text`: the rendered prompt's text beside it

    def request(
        self,
        request_id: str,
        model: str,
        prompt: str | list[int],
        choice: int,
        defaults: SamplingParamsGenerationConfigDefaults,
        timestamp_ns: int,
        path: str,
    ) -> TextGenerationRequest:
        """MAX's request for choice number `choice` of `prompt`: choice i samples with seed + i, so the n
        choices of a seeded request are n samples, the same ones every time."""
        seed = self.sampling.seed
        if seed is not None:
            seed = (seed + choice) % 2**64 or FIXED_SEED_ZERO  # MAX takes 0 as "pick one at random"
        sampling = SamplingParams.from_input_and_generation_config(
            SamplingParamsInput(**{**vars(self.sampling), "seed": seed}), sampling_params_defaults=defaults
        )
        chain = self.chain
        if self.post_sampling and chain is None:  # the chain in MAX's order: what is drawn from is known
            sampling, chain = in_max_order(sampling)
        return GPT2Request(
            request_id=RequestID(request_id),
            model_name=model,
            prompt=prompt,
            timestamp_ns=timestamp_ns,
            request_path=path,
            logprobs=self._top_n(),
            echo=self.echo or self.prompt_logprobs is not None,
            sampling_params=sampling,
            logit_bias=self.logit_bias or None,
            constraint=None if self.constraint is None else (self.constraint.kind, self.constraint.source),
            cache_salt=self.cache_salt,
            cache_prompt=self.cache_prompt,
            chain=chain,
            penalty_last_n=self.penalty_last_n,
            picker=self.picker,
            dry_breakers=self.dry_breakers,
            allowed_ids=self.allowed_ids,
            post_sampling=self.post_sampling,
            bad_words=self.bad_words,
            prompt_ranks=self.prompt_logprobs is not None,
            logprob_ids=self.logprob_ids,
        )

    def _top_n(self) -> int:
        """The alternatives MAX finds a token: as many as the prompt's or the text's report asks for, at
        least 1 where either asks (MAX reads 0 as no log-probabilities)."""
        asked = [count for count in (self.logprobs, self.prompt_logprobs) if count is not None]
        return max(1, *asked) if asked else 0


def check(
    body: CompletionRequest | ChatRequest, vocab_size: int, context_length: int, lora: tuple[float, ...] = ()
) -> Asked:
    """`body`'s fields in range and honoured, or a `Refusal` for the first that is not (module docstring);
    `lora`: the scales the served adapters were merged at."""
    for field, why in REFUSED.items():
        value = getattr(body, field)
        if not (unset(value) or value in HARMLESS.get(field, ())):
            raise Refusal(field, f"{field}: {why}; leave it out")
    if body.stream_options is not None and not body.stream:
        raise Refusal("stream_options", "stream_options: only with stream: true, as OpenAI's API says")
    refuse_acting(body, lora)
    body = body.model_copy(update=left_out(body.samplers))  # llama-server's: what it leaves out is off
    penalty_last_n = llama_penalties(body, context_length)
    if body.repeat_penalty is not None:
        body = body.model_copy(update={"repetition_penalty": body.repeat_penalty})
    _check_ranges(body)
    length_field, called, echo_only, echo_text, reads_kept = "max_tokens", None, False, None, True
    if isinstance(body, ChatRequest):
        if body.max_completion_tokens is not None:
            length_field = "max_completion_tokens"
        max_tokens = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
        logprobs, echo, echo_text = _chat_logprobs(body), False, echoed(body)
        called, reads_kept = tool_calls_of(body), reads_kept_pages(body.prompt_cache_options, body.messages)
    else:
        max_tokens, logprobs, echo = body.max_tokens, body.logprobs, bool(body.echo)
        if echo and max_tokens == 0:  # the prompt alone (its log-probabilities), as OpenAI's and vLLM's
            max_tokens, echo_only = 1, True
        if logprobs is not None and not 0 <= logprobs <= MAX_LOGPROBS:
            raise Refusal(
                "logprobs",
                f"logprobs: must be 0 to {MAX_LOGPROBS} alternatives, or null for none; got {logprobs}",
            )
    max_tokens = None if max_tokens == -1 else max_tokens  # llama-server's "to the context's end"
    _check_lengths(max_tokens, body.min_tokens, length_field)
    constraint_field, constraint = constraint_of(body, called) or (None, None)
    if constraint is not None and body.min_tokens:
        raise Refusal("min_tokens", "min_tokens: a constrained text ends once complete; leave it out")
    n = _check_choices(body)
    stops = [body.stop] if isinstance(body.stop, str) else list(body.stop or ())
    if "" in stops:
        raise Refusal("stop", f"stop[{stops.index('')}]: empty; a stop string needs at least one character")
    for index, token in enumerate(body.stop_token_ids or ()):
        token_id("stop_token_ids", f"stop_token_ids[{index}]", token, vocab_size)
    sampling = SamplingParamsInput(
        top_k=None if body.top_k is None else min(body.top_k, vocab_size),  # more: every token, as vLLM
        top_p=body.top_p,
        min_p=body.min_p,
        temperature=body.temperature,
        frequency_penalty=body.frequency_penalty,
        presence_penalty=body.presence_penalty,
        repetition_penalty=body.repetition_penalty,
        max_new_tokens=max_tokens,
        min_new_tokens=body.min_tokens,
        ignore_eos=body.ignore_eos,
        seed=None if body.seed == RANDOM_SEED else body.seed,
        stop_token_ids=body.stop_token_ids,
    )
    stop_ids, special = frozenset(body.stop_token_ids or ()), body.skip_special_tokens
    keep, repetition = body.include_stop_str_in_output, repetition_of(body.repetition_detection)
    rules = Rules(tuple(stops), stop_ids, keep, body.min_tokens, special, repetition=repetition)
    asked = Asked(
        n=n,
        sampling=sampling,
        rules=rules,
        logprobs=logprobs,
        echo=echo,
        echo_only=echo_only,
        logit_bias=logit_bias(body.logit_bias, vocab_size),
        stream=bool(body.stream),
        include_usage=bool(body.stream_options and body.stream_options.include_usage),
        usage_every_chunk=bool(body.stream_options and body.stream_options.continuous_usage_stats),
        return_token_ids=bool(body.return_token_ids),
        constraint=constraint,
        constraint_field=constraint_field,
        tools=called[0] if called else None,
        cache_salt=body.cache_salt,
        cache_prompt=body.cache_prompt and reads_kept,
        ping_s=body.sse_ping_interval if body.sse_ping_interval and body.sse_ping_interval > 0 else None,
        penalty_last_n=penalty_last_n,
        post_sampling=post_sampling(body, logprobs, echo),
        echo_text=echo_text,
        **vllm_asks(body, vocab_size, context_length),
    )
    return searched(on_openai_route(asked, body, context_length), body)  # llama-server's chain, a beam search


def _check_ranges(body: Sampling) -> None:
    """The numeric fields within their ranges, each refusal naming the field and the range."""
    for field, (low, high) in RANGES.items():
        value = getattr(body, field)
        if value is not None and not (math.isfinite(value) and low <= value <= high):
            raise Refusal(field, f"{field}: must be between {low:g} and {high:g}; got {value}")
    penalty = body.repetition_penalty
    if penalty is not None and not (math.isfinite(penalty) and penalty > 0):
        raise Refusal("repetition_penalty", f"repetition_penalty: must be above 0 (1 is none); got {penalty}")
    if body.top_k is not None and body.top_k < -1:
        raise Refusal("top_k", f"top_k: must be -1 or 0 (no limit) or a positive count; got {body.top_k}")
    seed = body.seed
    if seed is not None and not SEED_RANGE[0] <= seed <= SEED_RANGE[1]:
        raise Refusal("seed", f"seed: must fit in 64 bits ({SEED_RANGE[0]} to {SEED_RANGE[1]}); got {seed}")


def _check_lengths(max_tokens: int | None, min_tokens: int, name: str) -> None:
    if max_tokens is not None and max_tokens < 1:
        raise Refusal(name, f"{name}: must be at least 1 (every completion gets a token); got {max_tokens}")
    if min_tokens < 0:
        raise Refusal("min_tokens", f"min_tokens: must be 0 or more; got {min_tokens}")
    if max_tokens is not None and min_tokens > max_tokens:
        raise Refusal("min_tokens", f"min_tokens: {min_tokens} is more than {name} ({max_tokens})")


def _chat_logprobs(body: ChatRequest) -> int | None:
    """The alternatives a token a chat request asks for (`top_logprobs`, with `logprobs: true`)."""
    top = body.top_logprobs
    if top is not None and not 0 <= top <= MAX_LOGPROBS:
        raise Refusal("top_logprobs", f"top_logprobs: must be 0 to {MAX_LOGPROBS}; got {top}")
    if top and not body.logprobs:
        raise Refusal("top_logprobs", "top_logprobs: needs logprobs: true")
    return (top or 0) if body.logprobs else None


def _check_choices(body: Sampling) -> int:
    """How many choices each prompt gets (`n`), with `best_of` only where it selects nothing."""
    n = 1 if body.n is None else body.n
    if not 1 <= n <= MAX_N:
        raise Refusal("n", f"n: must be 1 to {MAX_N} choices a prompt; got {n}")
    if body.best_of is not None and body.best_of != n:
        raise Refusal(
            "best_of",
            f"best_of: this server does not rank candidates; leave it out or make it equal to n ({n})",
        )
    return n

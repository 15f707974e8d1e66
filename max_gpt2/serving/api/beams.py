"""vLLM's beam search on the OpenAI routes (`use_beam_search`, with `n` beams and `length_penalty`), as
vLLM's server runs it: each prompt's `n` best beams are its choices, best first.

Each step asks the model once a live beam (the prompt and the beam's tokens, one token, its 2n likeliest
by the model's own log-probabilities) and extends each beam by each of those: a beam that takes
end-of-text is complete (with it where `include_stop_str_in_output`; with `ignore_eos` it goes on), and
the `n` best of the rest, by `score`, live on. After `max_tokens` steps (the context's end unset) the
complete beams and the live ones are ranked together by `score`: the sum of their log-probabilities
over their length, prompt included, to the `length_penalty` (end-of-text not counted), as vLLM ranks
them. A complete beam ends with "stop" (its `stop_reason` the end-of-text id, as vLLM's), the others
with "length". The steps are greedy, so a search is the same every time (vLLM's, at a temperature,
may add the token it drew as one more candidate); what a beam search does not use (stop strings,
penalties, biases, cuts, constraints, llama-server's samplers) is refused (`refused_beside`).
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from max.pipelines.context.exceptions import InputError
from max.pipelines.context.sampling_params import SamplingParamsInput
from starlette.requests import Request

from max_gpt2.serving.api.choices import Choice, Chunk, Finish, Rules, Token, texts_of, tokenizer_of
from max_gpt2.serving.api.llama_samplers import CHAIN_ONLY, TEXT_LIMITS, first_acting
from max_gpt2.serving.api.protocol import ChatRequest, CompletionRequest, Refusal, unset

if TYPE_CHECKING:  # the checked request and the served model, whose modules import this one
    from max_gpt2.serving.api.requests import Asked
    from max_gpt2.serving.api.served import Served

MOST_BEAMS = 10  # 2n alternatives a step, within the 20 a request may ask for (as vLLM's default)
LENGTH = Finish("length")  # how a beam that did not take end-of-text ends
UNUSED = (  # fields a beam search takes nothing from: each refused where set otherwise than by default
    "stop", "stop_token_ids", "min_tokens", "logit_bias", "frequency_penalty", "presence_penalty",
    "repetition_penalty", "top_k", "top_p", "min_p", "allowed_token_ids", "bad_words", "repeat_penalty",
    "prompt_logprobs", "logprob_token_ids", "repetition_detection",
)  # fmt: skip
DEFAULTS = {field: CompletionRequest.model_fields[field].default for field in UNUSED}


@dataclass(frozen=True)
class Beam:
    """A beam: the tokens it made (each with its log-probability and its step's alternatives), their
    log-probabilities' sum, and how it ended."""

    tokens: tuple[Token, ...] = ()
    logprob: float = 0.0
    finish: Finish = LENGTH


def searched(asked: Asked, body: CompletionRequest | ChatRequest) -> Asked:
    """`asked` with `body`'s beam search (`Asked.beam_penalty`: its length penalty), checked: at most
    `MOST_BEAMS` beams, and no field set that a beam search takes nothing from; as it was without one."""
    if not body.use_beam_search:
        if body.length_penalty != 1:
            raise Refusal(
                "length_penalty", "length_penalty: ranks the beams of use_beam_search; leave it out"
            )
        return asked
    if not 1 <= asked.n <= MOST_BEAMS:
        raise Refusal(
            "n", f"n: 1 to {MOST_BEAMS} beams with use_beam_search (2n alternatives a step); got {asked.n}"
        )
    given = (
        field for field in UNUSED if not unset(value := getattr(body, field)) and value != DEFAULTS[field]
    )
    if set_field := next(given, None):
        raise Refusal(
            set_field,
            f"{set_field}: a beam search ranks beams by their log-probabilities alone; leave it out",
        )
    refused_beside(asked, body)
    return dataclasses.replace(asked, beam_penalty=float(body.length_penalty))


def refused_beside(asked: Asked, body: CompletionRequest | ChatRequest) -> None:
    """A `Refusal` for what a beam search cannot take that checking left in `asked`: a constraint,
    llama-server's samplers, limits and `post_sampling_probs`, and the prompt's log-probabilities (its
    echo's text is taken)."""
    if asked.constraint is not None:
        field = asked.constraint_field or "structured_outputs"
        raise Refusal(field, f"{field}: a beam search holds no constraint here; leave it out")
    if found := first_acting(body, CHAIN_ONLY | TEXT_LIMITS) or (
        body.post_sampling_probs and ("post_sampling_probs", "false")
    ):
        raise Refusal(
            found[0],
            f"{found[0]}: llama-server's, which a beam search does not run; leave it out or {found[1]}",
        )
    if asked.echo and asked.logprobs is not None:
        raise Refusal(
            "echo", "echo: a beam search gives no log-probabilities for the prompt; leave out logprobs"
        )


class BeamChoice(Choice):
    """One of a prompt's best beams, as a `Choice`: its whole text and tokens come in one chunk, once the
    prompt's search (shared by its beams) has ended."""

    def __init__(
        self, search: asyncio.Task[tuple[tuple[Token, ...], list[Beam]]], rank: int, rules: Rules
    ) -> None:
        self.search, self.rank, self.rules = search, rank, rules
        self.prompt, self.made, self.cached = (), 0, 0

    async def chunks(self) -> AsyncGenerator[Chunk, None]:
        self.prompt, beams = await self.search
        beam = beams[self.rank]
        self.made = len(beam.tokens)
        yield Chunk("".join(token.text for token in beam.tokens), beam.tokens, beam.finish)

    async def close(self) -> None:
        self.search.cancel()


async def beam_choices(
    request: Request, served: Served, asked: Asked, model: str, prompts: Sequence[Any], field: str
) -> list[Choice]:
    """Each prompt's `n` best beams (`asked.n`), as choices, each prompt's search begun; a prompt the
    tokenizer refuses is refused naming `field` before any begins."""
    encode = served.tokenizer.delegate.encode
    given = [list(prompt) if not isinstance(prompt, str) else encode(prompt) for prompt in prompts]
    for index, ids in enumerate(given):
        try:
            served.tokenizer.check_ids(ids, field if len(given) == 1 else f"{field}[{index}]")
        except InputError as error:  # the context exceeded among them, with its numbers
            raise Refusal(field, str(error), extra=getattr(error, "fields", None)) from None
    searches = [
        asyncio.create_task(search(request, served, asked, model, ids, f"{request.state.request_id}-{index}"))
        for index, ids in enumerate(given)
    ]
    return [BeamChoice(each, rank, asked.rules) for each in searches for rank in range(asked.n)]


async def search(
    request: Request, served: Served, asked: Asked, model: str, prompt: list[int], ident: str
) -> tuple[tuple[Token, ...], list[Beam]]:
    """The prompt's tokens and its `asked.n` best beams, best first, each token's text written."""
    left = served.context_length - len(prompt)
    one = dataclasses.replace(  # a step: one greedy token and its 2n alternatives, nothing else
        asked, n=1, logprobs=max(2 * asked.n, asked.logprobs or 0), echo=False, rules=Rules(keep=True),
        sampling=SamplingParamsInput(temperature=0.0, max_new_tokens=1), beam_penalty=None,
        penalty_last_n=None,
    )  # fmt: skip
    shown: list[tuple[Token, ...]] = []  # the prompt's tokens, as the first step's request read them
    steps = iter(range(left))

    async def tops(sequences: list[list[int]]) -> list[dict[int, float]]:
        step = next(steps)
        made = await asyncio.gather(
            *(
                next_token(request, served, one, model, ids, f"{ident}-{step}-{b}")
                for b, ids in enumerate(sequences)
            )
        )
        shown[:] = shown or [made[0][0]]
        return [token.top for _, token in made]

    rules, eos, ignore = asked.rules, set(served.tokenizer.eos_token_ids), bool(asked.sampling.ignore_eos)
    most = min(asked.sampling.max_new_tokens or left, left)
    beams = await best_beams(
        prompt, tops, asked.n, most, (eos, ignore, rules.keep), asked.beam_penalty or 1.0
    )
    return shown[0], [written(beam, served, rules) for beam in beams]


async def best_beams(
    prompt: list[int],
    tops: Callable[[list[list[int]]], Awaitable[list[dict[int, float]]]],
    width: int,
    most: int,
    ends: tuple[set[int], bool, bool],
    penalty: float,
) -> list[Beam]:
    """The `width` best beams after `prompt` (module docstring): `tops` gives each sequence's next token's
    likeliest (at least 2 `width`, by log-probability, likeliest first), `most` steps at most; `ends`: the
    end-of-text ids, whether a beam goes on past them (`ignore_eos`), and whether a complete beam keeps
    its own (`include_stop_str_in_output`); ranked by their log-probabilities over their length (an
    end-of-text last not counted) to the `penalty`."""
    (eos, ignore, keep), live, done = ends, [Beam()], []
    stops = set() if ignore else eos

    def score(beam: Beam) -> float:
        length = len(prompt) + len(beam.tokens) - (1 if beam.tokens and beam.tokens[-1].id in eos else 0)
        return beam.logprob / max(length, 1) ** penalty

    for _ in range(most):
        candidates = []
        found = await tops([prompt + [token.id for token in beam.tokens] for beam in live])
        for beam, top in zip(live, found, strict=True):
            for token, value in list(top.items())[: 2 * width]:
                extended = Beam((*beam.tokens, Token(token, "", value, top)), beam.logprob + value)
                if token not in stops:
                    candidates.append(extended)
                    continue
                done.append(
                    Beam(extended.tokens if keep else beam.tokens, extended.logprob, Finish("stop", token))
                )
        live = sorted(candidates, key=score, reverse=True)[:width]
        if not live:
            break
    return sorted(done + live, key=score, reverse=True)[:width]


async def next_token(
    request: Request, served: Served, one: Asked, model: str, ids: list[int], ident: str
) -> tuple[tuple[Token, ...], Token]:
    """The prompt's tokens of the request for the token after `ids`, and that token (greedy) with its
    step's alternatives."""
    defaults, timer = served.config.model.sampling_params_defaults, request.state.request_timer
    made = one.request(ident, model, ids, 0, defaults, timer.start_ns, request.url.path)
    choice = await served.start(made, one)
    tokens = [token async for chunk in choice.chunks() for token in chunk.tokens]
    return choice.prompt, tokens[0]


def written(beam: Beam, served: Served, rules: Rules) -> Beam:
    """`beam` with each token's text, as a choice's text shows it."""
    pieces = texts_of(tokenizer_of(served.engine), [token.id for token in beam.tokens], rules.skip_special)
    tokens = tuple(
        dataclasses.replace(token, text=piece) for token, piece in zip(beam.tokens, pieces, strict=True)
    )
    return dataclasses.replace(beam, tokens=tokens)
